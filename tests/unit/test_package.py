"""What the installed package holds, checked without installing it: the product only. The lab and the test
models (lab/ at the top of the checkout) stay out of it and out of what its commands import; matplotlib is
the `plot` extra, asked for only by `bench --png`. (tests/e2e/test_lab_installed.py installs the wheel in a
fresh venv; tests/unit/test_imports.py imports each module in a fresh process and finds no lab or matplotlib.)"""

from __future__ import annotations

import subprocess
import sys

from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from llama_rpc_deploy import __main__ as cli
from llama_rpc_deploy import bench

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_list_leaves_lab_out_and_matplotlib_is_an_extra():
    packages = PYPROJECT["tool"]["setuptools"]["packages"]
    assert "llama_rpc_deploy" in packages
    assert not [p for p in packages if p.split(".")[0] != "llama_rpc_deploy"], packages
    subpackages = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "llama_rpc_deploy").rglob("__init__.py")
    }
    assert subpackages <= set(packages), f"not installed: {sorted(subpackages - set(packages))}"
    dependencies = [
        d.split("=")[0].split(">")[0].split("<")[0].strip().lower() for d in PYPROJECT["project"]["dependencies"]
    ]
    assert "matplotlib" not in dependencies and "numpy" not in dependencies
    assert PYPROJECT["project"]["optional-dependencies"]["plot"] == ["matplotlib>=3.8"]
    assert (ROOT / "lab" / "__init__.py").is_file() and (ROOT / "lab" / "host.Dockerfile").is_file()
    assert (
        not list((ROOT / "llama_rpc_deploy").glob("test*.py")) and not (ROOT / "llama_rpc_deploy" / "lab.py").exists()
    )


def test_the_lab_paths_still_point_at_the_checkout():
    from lab import lab

    assert lab.PROJECT == ROOT
    assert (lab.PROJECT / "lab" / "host.Dockerfile").is_file()
    assert lab.LAB_DIR == ROOT / ".lab" and lab.CACHE == ROOT / ".cache"


def test_the_checkout_is_found_from_its_folders_and_not_outside(tmp_path):
    assert cli.find_checkout(ROOT) == ROOT
    assert cli.find_checkout(ROOT / "tests" / "unit") == ROOT
    assert cli.find_checkout(tmp_path) is None


@pytest.mark.parametrize(
    "argv, usage",
    [(["lab", "up"], "lab up"), (["lab", "unpin"], "lab unpin"), (["testmodel", "x.gguf"], "testmodel OUT.gguf")],
)
def test_lab_commands_outside_a_checkout_say_so_in_one_line(argv, usage, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {argv[0]} needs a checkout") and f"python3 -m llama_rpc_deploy {usage}" in err
    assert not (tmp_path / "x.gguf").exists()


def test_testmodel_from_a_subfolder_of_the_checkout_puts_the_checkout_on_sys_path(tmp_path):
    """As the installed `llama-rpc` runs it: the checkout is not on sys.path until the command puts it there."""
    out = tmp_path / "m.gguf"
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import llama_rpc_deploy.__main__ as m\n"
        f"sys.path[:] = [p for p in sys.path if p not in ({str(ROOT)!r}, '')]\n"
        f"assert 'lab' not in sys.modules\n"
        f"sys.exit(m.main(['testmodel', {str(out)!r}, '--n-layer', '1', '--n-embd', '32', '--n-head', '2', "
        f"'--n-head-kv', '1', '--n-ff', '64']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.is_file() and out.stat().st_size > 0


def test_bench_png_without_matplotlib_says_how_to_get_it_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "can_plot", lambda: False)
    monkeypatch.setattr(bench, "offline_cluster", lambda *a, **k: pytest.fail("the inventory was read"))
    assert cli.main(["bench", "-i", str(tmp_path / "none.py"), "--png", str(tmp_path / "x.png")]) == 2
    out, err = capsys.readouterr()
    assert err == "error: bench --png needs matplotlib: pip install 'llama-rpc-deploy[plot]'\n"
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(ValueError, match=r"llama-rpc-deploy\[plot\]"):  # bench.run, called from code: at once too
        bench.run(tmp_path / "none.py", None, [1], None, None, tmp_path / "x.png")


def test_matplotlib_is_found_when_installed():
    pytest.importorskip("matplotlib")
    assert bench.can_plot()
