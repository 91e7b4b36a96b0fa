"""The image's way from the coordinator to a worker: one shell pipeline, run on the coordinator.

    docker save ID | zstd -T0 -3 | ssh (the deploy's transfer key) root@worker "receive ID TAG"

The worker's forced command (files/receive-image.sh) loads the stream and tags it only when the
whole image arrived with that ID. deploy.py runs this; benchmarks/suite.py times it.
"""
from __future__ import annotations

from .quoting import shell

TRANSFER_KEY = "/etc/llama-rpc/transfer_key"  # on the coordinator
KNOWN_HOSTS = "/etc/llama-rpc/known_hosts"


def send_command(image: str, address: str, port: int = 22) -> str:
    return ("set -o pipefail; "
            f"id=$(docker image inspect --format '{{{{.Id}}}}' {shell(image)}) && "
            f"docker save \"$id\" | zstd -T0 -3 -c | "
            f"ssh -i {TRANSFER_KEY} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
            f"-o UserKnownHostsFile={KNOWN_HOSTS} -p {int(port)} {shell(f'root@{address}')} \"receive $id {shell(image)}\"")
