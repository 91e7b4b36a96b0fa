"""What the runtime image carries that llama-server and rpc-server never load, and the CUDA image's size
worked out from the libraries the CUDA build links.

    python3 benchmarks/image_size.py [--image llama-rpc:TAG] [--json]

CPU image: the lab's, on the lab coordinator (the newest llama-rpc image unless --image). Its size, its layers
(the runtime base's against the project's own) and which of its files the binaries load: ldd, in a throwaway
container of the image, on llama-server, rpc-server, llama-fit-params and every libggml-*.so in /app (the
backends: linked, or dlopen'd from /app with GGML_BACKEND_DL). Only docker commands that read are run on the lab.

CUDA image (neither built nor pulled here: no GPU, no registry): the shared libraries of the CUDA 12.8.1
components that nvidia/cuda:12.8.1-runtime-ubuntu24.04 installs, sized from NVIDIA's wheels on PyPI (each
wheel's zip central directory, read with HTTP range requests; cached in .cache/image-size/wheels.json).
Sizes are bytes; MB = 10^6 bytes, as docker reports them. Prints Markdown, or JSON with --json.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import lab  # noqa: E402

COORDINATOR = f"{lab.PREFIX}-coordinator"
WHEEL_CACHE = lab.CACHE / "image-size" / "wheels.json"
BINARIES = ("/app/llama-server", "/app/rpc-server", "/app/llama-fit-params")
BACKENDS = "/app/libggml-*.so"  # a glob, for the container's shell
# the entrypoint's shell, and curl for the deploy's health check (`docker exec llama-server curl ...`)
TOOLS = ("/bin/sh", "/usr/bin/curl")
LIB_DIRS = ("/usr/lib/", "/usr/lib64/", "/usr/local/lib/", "/lib/", "/lib64/")

# nvidia/cuda:12.8.1-runtime-ubuntu24.04 installs cuda-libraries-12-8=12.8.1-1 (cudart, nvrtc, opencl, cublas,
# cufft, cufile, curand, cusolver, cusparse, npp, nvfatbin, nvjitlink, nvjpeg), cuda-nvtx-12-8 and
# libnccl2=2.25.1-1+cuda12.8 (its base adds cuda-compat-12-8, which has no wheel): CUDA 12.8.1's versions.
CUDA_WHEELS = {
    "nvidia-cuda-runtime-cu12": "12.8.90",
    "nvidia-cuda-nvrtc-cu12": "12.8.93",
    "nvidia-cuda-opencl-cu12": "12.8.90",
    "nvidia-cublas-cu12": "12.8.4.1",
    "nvidia-cufft-cu12": "11.3.3.83",
    "nvidia-cufile-cu12": "1.13.1.3",
    "nvidia-curand-cu12": "10.3.9.90",
    "nvidia-cusolver-cu12": "11.7.3.90",
    "nvidia-cusparse-cu12": "12.5.8.93",
    "nvidia-npp-cu12": "12.3.3.100",
    "nvidia-nvfatbin-cu12": "12.8.90",
    "nvidia-nvjitlink-cu12": "12.8.93",
    "nvidia-nvjpeg-cu12": "12.3.5.92",
    "nvidia-nvtx-cu12": "12.8.90",
    "nvidia-nccl-cu12": "2.25.1",
}
# What libggml-cuda.so links (ggml/src/ggml-cuda/CMakeLists.txt, not GGML_STATIC): CUDA::cudart and CUDA::cublas,
# which needs cublasLt; NCCL::NCCL while GGML_CUDA_NCCL is ON (the default) and FindNCCL finds it, as it does in
# the devel image (libnccl-dev). CUDA::cuda_driver (libcuda.so.1) comes from the host's driver.
LINKED = ("libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12")
NCCL = "libnccl.so.2"
UBUNTU_2404 = 78_100_000  # ubuntu:24.04 (amd64) as `docker image ls` shows it: not measured here (no registry)
# libggml-cuda.so for CUDA_ARCHITECTURES "89;120" (SASS and PTX for each, -compress-mode=size): not built here
CUDA_BACKEND = (40_000_000, 160_000_000)
CPU_VARIANTS = 15  # x86 libggml-cpu-*.so with GGML_CPU_ALL_VARIANTS (the deploy's default); the lab builds one, native


def coordinator_docker(*args: str) -> str:
    return lab.docker("exec", COORDINATOR, "docker", *args)


def inspect(*refs: str) -> list[dict]:
    return json.loads(coordinator_docker("image", "inspect", *refs))


def newest_image() -> str:
    images = inspect(*sorted(set(coordinator_docker("image", "ls", "-q", "llama-rpc").split())))
    if not images:
        sys.exit(f"no llama-rpc image on {COORDINATOR}: deploy to the lab first")
    return max(images, key=lambda i: i["Created"])["RepoTags"][0]


def runtime_base(image: dict) -> dict:
    """The image on the coordinator whose layers are the longest proper prefix of this one's."""
    layers = image["RootFS"]["Layers"]
    candidates = []
    for other in inspect(*sorted(set(coordinator_docker("image", "ls", "-q").split()))):
        theirs = other["RootFS"]["Layers"]
        if len(theirs) < len(layers) and layers[:len(theirs)] == theirs:
            candidates.append(other)
    if not candidates:
        sys.exit(f"the runtime base image of {image['RepoTags'][0]} is not on {COORDINATOR}")
    return max(candidates, key=lambda i: len(i["RootFS"]["Layers"]))


def history(ref: str) -> list[dict]:
    """The image's build steps, oldest first: created_by and size (bytes)."""
    rows = coordinator_docker("history", "--no-trunc", "--human=false", "--format", "{{json .}}", ref).splitlines()
    return [{"created_by": r["CreatedBy"], "size": int(r["Size"])} for r in map(json.loads, reversed(rows))]


def in_container(image: str, script: str, *args: str) -> str:
    return coordinator_docker("run", "--rm", "--entrypoint", "sh", image, "-c", script, "sh", *args)


def loaded_paths(image: str) -> dict[str, list[str]]:
    """root -> the paths ldd resolves for it (the root first)."""
    out = in_container(image, f'for f in "$@" {BACKENDS}; do [ -e "$f" ] && {{ echo "== $f"; ldd "$f"; }}; done; true',
                       *BINARIES, *TOOLS)
    roots: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("== "):
            root = line[3:]
            roots[root] = [root]
        elif "not found" in line:
            sys.exit(f"{root}: {line.strip()}")
        elif m := re.search(r"(?:=> |^\s*)(/\S+) \(", line):
            roots[root].append(m.group(1))
    return roots


def files_of(image: str, paths: set[str]) -> tuple[dict[str, int], dict[int, tuple[int, str]]]:
    """(path -> inode, following links, for the given paths; inode -> (size, a path) for every regular file)."""
    out = in_container(image, 'stat -L -c "%i %n" "$@"; echo ==; find / -xdev -type f -printf "%i %s %p\\n"',
                       *sorted(paths))
    stat, listing = out.split("\n==\n")
    inodes = {path: int(inode) for inode, path in (line.split(" ", 1) for line in stat.splitlines())}
    files = {}
    for line in sorted(listing.splitlines()):
        inode, size, path = line.split(" ", 2)
        files.setdefault(int(inode), (int(size), path))
    return inodes, files


def apt_cache_bytes(image: str) -> int:
    return int(in_container(image, "du -sb /var/cache/apt | cut -f1"))


def cpu_image(ref: str) -> dict:
    image = inspect(ref)[0]
    base = runtime_base(image)
    steps = history(ref)
    base_steps = len(history(base["Id"]))
    roots = loaded_paths(ref)
    inodes, files = files_of(ref, {p for paths in roots.values() for p in paths})

    def closure(names) -> set[int]:
        return {inodes[p] for r in names if r in roots for p in roots[r]}

    def size(inos) -> int:
        return sum(files[i][0] for i in inos)

    binaries = closure(r for r in roots if r not in TOOLS)
    tools = closure(TOOLS) - binaries
    in_lib_dirs = {i for i, (_, p) in files.items() if p.startswith(LIB_DIRS)}
    unneeded = {i: files[i] for i in files.keys() - binaries - tools}
    by_dir: dict[str, int] = {}
    for s, p in unneeded.values():
        key = "/".join(p.split("/")[:4]) if p.count("/") > 3 else p.rsplit("/", 1)[0]
        by_dir[key] = by_dir.get(key, 0) + s
    biggest = sorted(unneeded.values(), key=lambda f: (-f[0], f[1]))
    return {
        "image": ref,
        "id": image["Id"],
        "size": image["Size"],
        "base_image": (base["RepoTags"] or [base["Id"]])[0],
        "base_size": sum(s["size"] for s in steps[:base_steps]),
        "own_size": sum(s["size"] for s in steps[base_steps:]),
        "layers": [{**s, "part": "base" if n < base_steps else "own"} for n, s in enumerate(steps)],
        "files_total": size(files),
        "hidden": image["Size"] - size(files),
        "needed_by_binaries": {files[i][1]: files[i][0] for i in sorted(binaries, key=lambda i: files[i][1])},
        "needed_by_binaries_total": size(binaries),
        "needed_by_tools_total": size(tools),
        "lib_dirs_total": size(in_lib_dirs),
        "lib_dirs_needed_by_binaries": size(in_lib_dirs & binaries),
        "lib_dirs_needed_by_tools": size(in_lib_dirs & tools),
        "lib_dirs_shared_libs_unneeded": sum(s for i, (s, p) in unneeded.items() if i in in_lib_dirs and ".so" in p),
        "unneeded_total": sum(s for s, _ in unneeded.values()),
        "unneeded_by_dir": dict(sorted(by_dir.items(), key=lambda kv: (-kv[1], kv[0]))[:12]),
        "unneeded_biggest_files": {p: s for s, p in biggest[:12]},
        "apt_cache_base": apt_cache_bytes(base["Id"]),
        "apt_cache_image": apt_cache_bytes(ref),
        "libggml_cpu": max((s for s, p in files.values() if p.startswith("/app/libggml-cpu")), default=0),
    }


class RangeReader(io.RawIOBase):
    """A remote file, read with HTTP range requests: enough for zipfile to read the central directory."""

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (0, self.pos, self.size)[whence] + offset
        return self.pos

    def readinto(self, buffer) -> int:
        end = min(self.pos + len(buffer), self.size)
        if end <= self.pos:
            return 0
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read()
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def wheel_libs(name: str, version: str) -> dict:
    """The manylinux x86_64 wheel's shared libraries: {"wheel": filename, "libs": {soname: uncompressed bytes}}."""
    api = f"https://pypi.org/pypi/{name}/json"
    with urllib.request.urlopen(api, timeout=60) as response:
        release = json.load(response)["releases"][version]
    wheel = sorted((f for f in release if "manylinux" in f["filename"] and "x86_64" in f["filename"]),
                   key=lambda f: f["filename"])[0]
    remote = RangeReader(urllib.parse.urljoin(api, wheel["url"]), wheel["size"])
    with zipfile.ZipFile(io.BufferedReader(remote, 1 << 16)) as z:
        libs = {Path(i.filename).name: i.file_size for i in z.infolist() if "/lib/" in i.filename and ".so" in i.filename}
    return {"wheel": wheel["filename"], "libs": dict(sorted(libs.items()))}


def cuda_libraries() -> dict[str, dict]:
    cache = json.loads(WHEEL_CACHE.read_text()) if WHEEL_CACHE.exists() else {}
    for name, version in CUDA_WHEELS.items():
        if f"{name}=={version}" not in cache:
            cache[f"{name}=={version}"] = wheel_libs(name, version)
            WHEEL_CACHE.parent.mkdir(parents=True, exist_ok=True)
            WHEEL_CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return {name: cache[f"{name}=={version}"] for name, version in CUDA_WHEELS.items()}


def cuda_image(cpu: dict) -> dict:
    wheels = cuda_libraries()
    libs = {so: s for w in wheels.values() for so, s in w["libs"].items()}
    linked = {so: libs[so] for so in LINKED}
    apt_layer = max(layer["size"] for layer in cpu["layers"]
                    if layer["part"] == "own" and "apt-get install" in layer["created_by"])
    apt_on_ubuntu = apt_layer - (cpu["apt_cache_image"] - cpu["apt_cache_base"])  # its docker-clean keeps no apt cache
    own = cpu["own_size"] - apt_layer + apt_on_ubuntu + (CPU_VARIANTS - 1) * cpu["libggml_cpu"]
    own_range = [own + CUDA_BACKEND[0], own + CUDA_BACKEND[1]]
    needed, needed_nccl = sum(linked.values()), sum(linked.values()) + libs[NCCL]

    def on_ubuntu(cuda_libs: int) -> list[int]:
        return [UBUNTU_2404 + cuda_libs + own_range[0], UBUNTU_2404 + cuda_libs + own_range[1]]

    return {
        "wheels": wheels,
        "runtime_libs_total": sum(libs.values()),
        "linked": {**linked, NCCL: libs[NCCL]},
        "linked_total_without_nccl": needed,
        "linked_total_with_nccl": needed_nccl,
        "ubuntu_2404": UBUNTU_2404,
        "apt_layer_on_ubuntu": apt_on_ubuntu,
        "cuda_backend_range": list(CUDA_BACKEND),
        "own_layers_range": own_range,
        "image_as_is_at_least": on_ubuntu(sum(libs.values())),
        "image_as_it_would_be_with_nccl": on_ubuntu(needed_nccl),
        "image_as_it_would_be_without_nccl": on_ubuntu(needed),
    }


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n / 1e3:,.1f} kB"


def span(r: list[int]) -> str:
    return f"{r[0] / 1e6:,.0f} – {r[1] / 1e6:,.0f} MB"


def step(created_by: str) -> str:
    """A build step, short: without the build arguments buildkit puts before a RUN's command."""
    return re.sub(r"^RUN \|\d+ (?:\S+=\S* )*", "RUN ", created_by)[:90].replace("|", "/") or "(none recorded)"


def markdown(cpu: dict, cuda: dict) -> str:
    layers = "\n".join(f"| {mb(layer['size'])} | {layer['part']} | `{step(layer['created_by'])}` |"
                       for layer in cpu["layers"] if layer["size"])
    needed = "\n".join(f"| `{p}` | {mb(s)} |" for p, s in cpu["needed_by_binaries"].items())
    by_dir = "\n".join(f"| `{d}` | {mb(s)} |" for d, s in cpu["unneeded_by_dir"].items())
    biggest = "\n".join(f"| `{p}` | {mb(s)} |" for p, s in cpu["unneeded_biggest_files"].items())
    wheels = "\n".join(f"| `{n}=={CUDA_WHEELS[n]}` | {', '.join(f'{so} {mb(s)}' for so, s in w['libs'].items())} "
                       f"| {mb(sum(w['libs'].values()))} |" for n, w in cuda["wheels"].items())
    linked = "\n".join(f"| `{so}` | {mb(s)} |" for so, s in cuda["linked"].items())
    return f"""## CPU image (the lab's)

`{cpu['image']}` (`{cpu['id'][:19]}`): **{mb(cpu['size'])}**: runtime base `{cpu['base_image']}` {mb(cpu['base_size'])}, the project's own layers {mb(cpu['own_size'])}.

| layer size | part | step |
| ---: | --- | --- |
{layers}

Files in the image (regular files, hard links once): {mb(cpu['files_total'])}; the other {mb(cpu['hidden'])} are shipped in a layer
but deleted or replaced by a later one.
What llama-server, rpc-server, llama-fit-params and the libggml-*.so backends load (ldd): **{mb(cpu['needed_by_binaries_total'])}**;
the entrypoint's shell and curl (the deploy's health check) add {mb(cpu['needed_by_tools_total'])}.
Under the lib directories ({', '.join(LIB_DIRS)}): {mb(cpu['lib_dirs_total'])}, of which the binaries load {mb(cpu['lib_dirs_needed_by_binaries'])}
and sh + curl {mb(cpu['lib_dirs_needed_by_tools'])}; shared libraries there that none of them loads: {mb(cpu['lib_dirs_shared_libs_unneeded'])}.
The apt cache (`/var/cache/apt`): {mb(cpu['apt_cache_base'])} in the base, {mb(cpu['apt_cache_image'])} in the image.

| loaded by the binaries | size |
| --- | ---: |
{needed}

Never loaded by the binaries nor by sh/curl: **{mb(cpu['unneeded_total'])}**. Biggest first, by directory:

| directory | size |
| --- | ---: |
{by_dir}

and by file:

| file | size |
| --- | ---: |
{biggest}

## CUDA image (worked out, not built)

Shared libraries of the CUDA 12.8.1 wheels that match what nvidia/cuda:12.8.1-runtime-ubuntu24.04 installs
(cuda-compat-12-8, the forward-compatibility driver in its base, has no wheel and is not counted):

| wheel | libraries | total |
| --- | --- | ---: |
{wheels}

CUDA runtime base's libraries: **{mb(cuda['runtime_libs_total'])}**.
What libggml-cuda.so links from them: **{mb(cuda['linked_total_without_nccl'])}** (cudart, cublas, cublasLt),
**{mb(cuda['linked_total_with_nccl'])}** with NCCL, which the build links as the Dockerfile stands (GGML_CUDA_NCCL defaults to ON).

| linked | size |
| --- | ---: |
{linked}

The project's own layers on ubuntu:24.04: the CPU image's, with the apt layer as it would be without the apt cache
({mb(cuda['apt_layer_on_ubuntu'])}), {CPU_VARIANTS - 1} more CPU backend variants of {mb(cpu['libggml_cpu'])}
and libggml-cuda.so at {span(cuda['cuda_backend_range'])} (not built here): {span(cuda['own_layers_range'])}.

| CUDA image | size |
| --- | ---: |
| base as it is (ubuntu:24.04 {mb(cuda['ubuntu_2404'])} + all the runtime libraries; cuda-compat not counted) | at least {span(cuda['image_as_is_at_least'])} |
| as it would be: ubuntu:24.04 + cudart, cublas, cublasLt, nccl | **{span(cuda['image_as_it_would_be_with_nccl'])}** |
| as it would be, built with `-DGGML_CUDA_NCCL=OFF`: ubuntu:24.04 + cudart, cublas, cublasLt | **{span(cuda['image_as_it_would_be_without_nccl'])}** |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="the CPU image on the lab coordinator (default: the newest llama-rpc image)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args()
    cpu = cpu_image(args.image or newest_image())
    cuda = cuda_image(cpu)
    print(json.dumps({"cpu_image": cpu, "cuda_image": cuda}, indent=2) if args.json else markdown(cpu, cuda))


if __name__ == "__main__":
    main()
