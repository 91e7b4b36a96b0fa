"""End-to-end tests on the local lab."""
import shutil
import subprocess

import pytest

needs_docker = pytest.mark.skipif(
    shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0,
    reason="needs a running Docker engine (scripts/setup-machine.sh starts one)")
WORKERS = 2  # one coordinator and two workers: the deploy must handle more than one worker
