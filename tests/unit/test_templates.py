"""Every template is rendered, every rendered shell script passes shellcheck, every env file reads back."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_rpc_deploy import render

from llama_rpc_deploy.sleep import Nic

from .helpers import IMAGE, cluster

CLUSTERS = {
    "seed pair": lambda: cluster(),
    "cpu lab, two workers, no firewall on one": lambda: cluster(
        coordinator={"gpus": []},
        workers=[{"gpus": []}, {"gpus": [], "rpc_firewall": False, "rpc_threads": 2, "wol_check_nic": False}],
        all_data={
            "image_backend": "cpu",
            "llama_n_gpu_layers": 6,
            "llama_tensor_split": [1, 1],
            "llama_sleep_idle_seconds": 900,
            "sleep_idle_seconds": 1800,
            "llama_threads": 2,
            "llama_metrics": True,
            "llama_extra_args": ["--alias", "a b; c"],
        },
    ),
    "plain transport": lambda: cluster(workers=[{"rpc_transport": "plain"}, {"rpc_transport": "plain"}]),
    "ipv6 clients, odd paths": lambda: cluster(
        workers=[
            {
                "rpc_allow_from": ["fd00::10", "10.0.0.0/24"],
                "rpc_cache_dir": "/srv/cache-dir.2",
                "rpc_extra_args": ["--mem", "8192"],
            }
        ],
        all_data={"llama_model_path": "/srv/my models/it's.gguf"},
    ),
}


NIC = Nic(interface="eno1", mac="3c:7c:3f:12:34:56", broadcast="10.0.0.255", exists=True, wake_on="pumbg", ethtool=True)


def every_file(c) -> dict[str, str]:
    out = {
        **render.sleep_files(c, {w.name: NIC for w in c.workers}),
        **render.coordinator_files(c, IMAGE),
        **render.watchdog_files(c),
        **render.front_files(c),
        **render.tunnel_files(c, c.coordinator),
    }
    for w in c.workers:
        out |= {
            f"{w.name}:{p}": t
            for p, t in {
                **render.worker_files(c, w, IMAGE),
                **render.firewall_files(c, w),
                **render.tunnel_files(c, w),
                **render.worker_watchdog_files(w),
                **render.cache_prune_files(w),
                **render.worker_sleep_files(c, w, NIC),
            }.items()
        }
    return out


@pytest.fixture(scope="module", params=list(CLUSTERS))
def rendered(request):
    return every_file(CLUSTERS[request.param]())


def test_every_template_is_rendered():
    used = set()
    original = render._render

    def spy(template, **values):
        used.add(template)
        return original(template, **values)

    render._render = spy
    try:
        for make in CLUSTERS.values():
            every_file(make())
    finally:
        render._render = original
    assert used == {p.name for p in render.TEMPLATES.glob("*.j2")}


@pytest.fixture(scope="module")
def shellcheck_findings(tmp_path_factory):
    """shellcheck once over every cluster's rendered scripts (one process, not one a cluster): its findings
    (gcc format) by cluster. Each cluster's hosts have folders of their own, as the files are on the hosts; a
    script that is the same, next to the same scripts it names (the programs shipped as they are), is checked once."""
    assert shutil.which("shellcheck"), (
        "shellcheck is missing: apt-get install shellcheck (scripts/setup-machine.sh does)"
    )
    root, hosts = tmp_path_factory.mktemp("shellcheck"), {}
    for i, (name, make) in enumerate(CLUSTERS.items()):
        for path, text in every_file(make()).items():
            if path.endswith(".sh"):
                host, _, path = path.rpartition(":")
                hosts.setdefault((name, root / str(i) / (host or "coordinator")), {})[Path(path).name] = text
    checked, where = {}, {}  # (text, its neighbours) -> the file checked; that file -> [(cluster, file)] it stands for
    for (name, folder), scripts in hosts.items():
        folder.mkdir(parents=True)
        for file, text in scripts.items():
            (folder / file).write_text(text)
            key = (text, tuple(sorted((f, t) for f, t in scripts.items() if f in text)))  # what it may source
            checked.setdefault(key, str(folder / file))
            where.setdefault(checked[key], []).append((name, str(folder / file)))
    result = subprocess.run(
        ["shellcheck", "--external-sources", "--severity=style", "--format=json1", *where],
        capture_output=True,
        text=True,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: findings; anything else: it could not check
    findings = {name: [] for name in CLUSTERS}
    for c in json.loads(result.stdout)["comments"]:
        for name, file in where[c["file"]]:
            findings[name].append(f"{file}:{c['line']}:{c['column']}: {c['level']}: {c['message']} [SC{c['code']}]")
    assert (result.returncode == 0) == (not any(findings.values())), result.stdout + result.stderr
    return findings


@pytest.mark.xdist_group("shellcheck of the rendered scripts")  # one worker runs shellcheck, once
@pytest.mark.parametrize("name", list(CLUSTERS))
def test_rendered_shell_scripts_pass_shellcheck(shellcheck_findings, name):
    assert not shellcheck_findings[name], "\n".join(shellcheck_findings[name])


def test_env_files_read_back_as_written(rendered, tmp_path):
    """bash reads each env file's values back exactly (spaces and quotes in paths stay one word): one bash
    process for all of them, each file read in a subshell of its own."""
    envs, script = {}, []
    for path, text in rendered.items():
        if not path.endswith(".env"):
            continue
        i = len(envs)
        (tmp_path / f"{i}.env").write_text(text)
        envs[i] = (path, [line.split("=", 1)[0] for line in text.splitlines()])
        script.append(
            f'(set -u; . ./{i}.env; for k in {" ".join(envs[i][1])}; do printf "%s=%s\\n" "$k" "${{!k}}"; done)'
            f" > {i}.out 2> {i}.err; echo $? > {i}.rc"
        )
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, check=True)
    for i, (path, keys) in envs.items():
        out, err = (tmp_path / f"{i}.out").read_text(), (tmp_path / f"{i}.err").read_text()
        assert (tmp_path / f"{i}.rc").read_text() == "0\n", (path, err)
        assert len(out.splitlines()) == len(keys) and "$" not in out, path


def test_launch_scripts_run_docker_with_the_intended_words(rendered, tmp_path):
    """Run each rendered launch script with docker and id replaced by printers: the words docker gets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 999\n")
    (bin_dir / "id").chmod(0o755)
    for path, text in rendered.items():
        if not path.endswith(("llama-server.sh", "rpc-server.sh")):
            continue
        script = tmp_path / "launch.sh"
        script.write_text(text.replace("/usr/bin/docker", str(bin_dir / "docker")))
        (bin_dir / "docker").write_text('#!/bin/sh\nfor w in "$@"; do printf "%s\\n" "$w"; done\n')
        (bin_dir / "docker").chmod(0o755)
        argv = subprocess.run(
            ["sh", str(script)], capture_output=True, text=True, check=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}
        ).stdout.splitlines()
        assert argv[:2] == ["run", "--rm"] and "--user" in argv and argv[argv.index("--user") + 1] == "999:999"
        assert IMAGE in argv and argv[argv.index(IMAGE) + 1] in ("server", "rpc")


def test_paths_with_spaces_and_quotes_stay_one_word(tmp_path):
    c = CLUSTERS["ipv6 clients, odd paths"]()
    files = every_file(c)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("docker", 'for w in "$@"; do printf "%s\\n" "$w"; done'), ("id", "echo 999")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)

    def argv(path):
        script = tmp_path / "launch.sh"
        script.write_text(files[path].replace("/usr/bin/docker", str(bin_dir / "docker")))
        return subprocess.run(
            ["sh", str(script)], capture_output=True, text=True, check=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}
        ).stdout.splitlines()

    server = argv("/opt/llama-rpc/llama-server.sh")
    assert "/srv/my models:/models:ro" in server and "/models/it's.gguf" in server
    rpc = argv(f"{c.workers[0].name}:/opt/llama-rpc/rpc-server.sh")
    assert "/srv/cache-dir.2:/cache" in rpc and rpc[-2:] == ["--mem", "8192"]
