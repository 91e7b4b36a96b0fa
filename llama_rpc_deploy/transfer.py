"""The image's way from the coordinator to a worker: one shell pipeline, run on the coordinator.

    docker save ID | zstd -T0 -3 | ssh (the deploy's transfer key) root@worker "receive ID TAG"

When the worker has images already (the previous version, a base image), files/skip-layers.py sits
after docker save and leaves out the layers the worker has, as a registry push and pull would: an
upgrade sends only the layers that changed.

The worker's forced command (files/receive-image.sh) loads the stream and tags it only when the
whole image arrived with that ID. deploy.py runs this; benchmarks/suite.py times it.
"""

from __future__ import annotations

from .quoting import shell
from .roles import KNOWN_HOSTS, TRANSFER_KEY


def layers_text(have: list[tuple[str, ...]]) -> str:
    """The worker's images (facts.DockerImageLayers) as skip-layers.py reads them: one a line."""
    return "".join(",".join(layers) + "\n" for layers in have)


def send_command(
    image: str, address: str, port: int = 22, layers_file: str | None = None, skip_layers: str | None = None
) -> str:
    """With layers_file (on the coordinator, layers_text of the worker's images) and skip_layers (the
    filter's path there), the layers the worker has stay behind; the filter runs only when it leaves
    something out, and if it cannot decide (no usable python3, say) the plain stream goes."""
    save = 'docker save "$id"'
    if layers_file and skip_layers:
        f = shell(skip_layers)
        save = (
            f'{{ skip=$(python3 {f} which "$id" {shell(layers_file)}) || skip=; }} && '
            f'{{ if [ -n "$skip" ]; then docker save "$id" | python3 {f} drop $skip; else docker save "$id"; fi; }}'
        )
    return (
        "set -o pipefail; "
        f"id=$(docker image inspect --format '{{{{.Id}}}}' {shell(image)}) && "
        f"{save} | zstd -T0 -3 -c | "
        f"ssh -i {TRANSFER_KEY} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
        f'-o UserKnownHostsFile={KNOWN_HOSTS} -p {int(port)} {shell(f"root@{address}")} "receive $id {shell(image)}"'
    )
