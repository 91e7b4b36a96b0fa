"""The planner against llama.cpp's own estimator, run from the image the deploy built.

Every family of tests/families.py, over the grid of tests/oracle.py: llama-fit-params in the lab
coordinator's image, with two loopback rpc-servers of the same image as the devices, must agree with
the planner within 3% on each device's weights and KV cache.
"""

import subprocess
from pathlib import Path

import pytest
from gguf import GGUFReader

from lab import lab
from llama_rpc_deploy.deployment import from_cluster
from llama_rpc_deploy.gguf_header import read_model

from .. import oracle
from ..families import FAMILIES
from .lab_helpers import deployed_and_serving, needs_docker

pytestmark = needs_docker
FOLDER = "/var/lib/llama-rpc-oracle"  # on the coordinator, mounted into the image's container


def copy_sparse(local: Path, container: str, remote: str) -> None:
    """A shaped file onto a lab host: its header only (docker cp would write the hole out in full),
    then truncated there to its full size."""
    header = GGUFReader(str(local)).data_offset
    with open(local, "rb") as f:
        subprocess.run(
            [
                "docker",
                "exec",
                "-i",
                container,
                "sh",
                "-c",
                f"cat > {remote} && truncate -s {local.stat().st_size} {remote}",
            ],
            input=f.read(header),
            check=True,
        )


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """llama-fit-params' figures for every case of the grid, from the image on the lab's coordinator."""
    cluster = deployed_and_serving()
    image = from_cluster(cluster, with_key=False).image
    container = f"{lab.PREFIX}-{lab.host_names(1)[0]}"
    folder = tmp_path_factory.mktemp("families")
    subprocess.run(["docker", "exec", container, "mkdir", "-p", FOLDER], check=True)
    for name, write in FAMILIES.items():
        copy_sparse(write(folder / f"{name}.gguf"), container, f"{FOLDER}/{name}.gguf")
    script = oracle.script(oracle.grid(), "/oracle", bin_dir="/app")
    run = subprocess.run(
        [
            "docker",
            "exec",
            "-i",
            container,
            "docker",
            "run",
            "--rm",
            "-i",
            "--network",
            "none",
            "--volume",
            f"{FOLDER}:/oracle:ro",
            "--entrypoint",
            "sh",
            image,
            "-s",
        ],
        input=script,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    subprocess.run(["docker", "exec", container, "rm", "-rf", FOLDER], check=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return {name: read_model(folder / f"{name}.gguf") for name in FAMILIES}, oracle.results(run.stdout)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_planner_within_3_percent_of_llama_fit_params(figures, family):
    models, found = figures
    cases = [c for c in oracle.grid() if c.family == family]
    assert all(found.get(c.key) for c in cases), [c.key for c in cases if not found.get(c.key)]
    bad = [line for c in cases for line in oracle.mismatches(models[family], c, found[c.key])]
    assert not bad, "\n".join(bad)
