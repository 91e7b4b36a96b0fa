"""The image's identity: its build arguments (the CUDA architectures among them) and its tag.

The tag is name:REF-HASH, HASH over the source, the image's files and the build arguments: the same
inputs always give the same tag, so an image that is already there is never built again, and a
changed input never reuses an old image.
"""

from __future__ import annotations

from .paths import shipped

import hashlib
from pathlib import Path

from .cluster import Cluster, cuda_architectures
from .source import Source

FILES = shipped("files")
IMAGE_FILES = ("Dockerfile", "entrypoint.sh")  # with llama.cpp.tar.gz, the build context


def build_args(cluster: Cluster, source: Source, backend: str | None = None) -> dict[str, str]:
    """The build arguments of backend's image (default: the coordinator's)."""
    s = cluster.settings
    backend = backend or cluster.coordinator.backend
    vulkan = backend == "vulkan"
    args = {
        "GGML_BACKEND": backend,
        "BUILD_IMAGE": s["image_vulkan_build_image" if vulkan else "image_build_image"],
        "RUNTIME_IMAGE": s["image_vulkan_runtime_image" if vulkan else "image_runtime_image"],
        "GGML_NATIVE": "ON" if s["image_cpu_native"] else "OFF",
        "LLAMA_CPP_REF": s["llama_cpp_ref"],
        "LLAMA_BUILD_NUMBER": str(s["llama_cpp_build_number"]),
        "PREBUILT_UI": "OFF" if source.local_tarball else "ON",  # a local tree is packed with the page
        "SOURCE_SHA256": source.ident if source.local_tarball else "unknown",  # a download: checked before the build
    }
    if backend == "cuda":
        args["CUDA_ARCHITECTURES"] = cuda_architectures(cluster)
    if s["image_build_jobs"]:
        args["BUILD_JOBS"] = str(s["image_build_jobs"])
    return args


def tag(cluster: Cluster, source: Source, backend: str | None = None, files_dir: Path = FILES) -> str:
    """name:REF-HASH (see the module's docstring); a backend other than cuda, the first kind, is named in
    REF (name:local-vulkan-HASH), so that `docker images` tells the images apart."""
    backend = backend or cluster.coordinator.backend
    digest = hashlib.sha256(source.ident.encode())
    for name in IMAGE_FILES:
        digest.update((files_dir / name).read_bytes())
    for key, value in sorted(build_args(cluster, source, backend).items()):
        digest.update(f"{key}={value}\n".encode())
    ref = f"b{cluster.settings['llama_cpp_build_number']}" if source.url else "local"
    kind = "" if backend == "cuda" else f"-{backend}"
    return f"{cluster.settings['image_name']}:{ref}{kind}-{digest.hexdigest()[:12]}"


def tags(cluster: Cluster, source: Source) -> dict[str, str]:
    """backend -> its image's tag, for every backend the hosts run (Cluster.backends: the coordinator's first)."""
    return {backend: tag(cluster, source, backend) for backend in cluster.backends}
