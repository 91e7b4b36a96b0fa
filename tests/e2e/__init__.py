"""End-to-end tests on the local lab."""
import json
import shutil
import subprocess

import pytest

from lab import lab
from llama_rpc_deploy.deployment import PROJECT

needs_docker = pytest.mark.skipif(
    shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0,
    reason="needs a running Docker engine (scripts/setup-machine.sh starts one)")
WORKERS = 2  # one coordinator and two workers: the deploy must handle more than one worker
INVENTORY = lab.LAB_DIR / "inventory.py"


def pyinfra(*args: str, timeout: int = 3000) -> subprocess.CompletedProcess:
    return subprocess.run(["pyinfra", "-y", *args, str(INVENTORY), "deploy.py"], cwd=PROJECT,
                          capture_output=True, text=True, timeout=timeout)


def on(host_index: int, command: str) -> subprocess.CompletedProcess:
    name = lab.host_names(WORKERS)[host_index]
    return subprocess.run(["docker", "exec", f"{lab.PREFIX}-{name}", "sh", "-c", command],
                          capture_output=True, text=True)


def operations(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)["results"]["operations"]


def changed(ops: list[dict], prefix: str) -> list[str]:
    """Hosts on which an operation whose name contains `prefix` made a change."""
    return [h for op in ops if prefix in op["name"] for h in op["success"]]


# what a failed deploy must leave as it was on every host: files, services, containers, images, firewall
STATE = ("sha256sum /opt/llama-rpc/* /etc/systemd/system/rpc-server.service /etc/systemd/system/llama-server.service "
         "/etc/systemd/system/llama-rpc-tunnel.service /etc/llama-rpc/* /etc/llama-rpc-tunnel/* "
         "/root/.ssh/authorized_keys 2>/dev/null; "
         "find /models /var/cache/llama-rpc -exec stat -c '%n %s %Y' {} + 2>/dev/null | sort; "
         "systemctl show -p ActiveEnterTimestampMonotonic -p NRestarts rpc-server llama-server llama-rpc-tunnel; "
         "for c in $(docker ps -q); do docker inspect --format '{{.Name}} {{.State.StartedAt}}' $c; done | sort; "
         "docker images -q | sort; iptables -S")


def deployed_and_serving():
    """The lab up, deployed as its inventory says, and serving: the cluster as the tests see it."""
    from llama_rpc_deploy.deployment import offline_cluster
    from llama_rpc_deploy.loadtest import until_serving

    lab.up(workers=WORKERS)
    operations(pyinfra("--json"))
    cluster = offline_cluster(INVENTORY)
    assert until_serving(cluster, 120, expect_down=False).seconds is not None
    return cluster


@pytest.fixture(scope="module")
def cluster():
    """For modules that break the lab: import this and serving_afterwards (a fault test starts from a serving
    cluster and leaves one behind)."""
    return deployed_and_serving()


@pytest.fixture
def serving_afterwards(cluster):
    """Each test of a module that uses it (pytestmark) must leave the lab serving."""
    from llama_rpc_deploy.loadtest import until_serving

    yield
    assert until_serving(cluster, 240, expect_down=False).seconds is not None, "the lab is not serving after the test"


def snapshot() -> dict[str, str]:
    """STATE on every lab host."""
    return {name: subprocess.run(["docker", "exec", f"{lab.PREFIX}-{name}", "sh", "-c", STATE],
                                 capture_output=True, text=True).stdout
            for name in lab.host_names(WORKERS)}
