"""quoting.py: bash is the oracle for shell words (systemd's own reading of unit words is checked on the
lab, tests/e2e/test_lab_quoting.py)."""

import subprocess

import pytest

from llama_rpc_deploy import quoting

from .helpers import CORPUS


def test_shell_words_come_back_from_bash_as_they_went_in():
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {quoting.shell_line(*CORPUS)}"], capture_output=True, text=True, check=True
    ).stdout
    assert out.split("\0")[:-1] == CORPUS


def test_unit_words_escape_what_systemd_would_expand():
    assert quoting.unit("/opt/llama-rpc/x.sh") == '"/opt/llama-rpc/x.sh"'
    assert quoting.unit('a "b" \\c %h $X') == '"a \\"b\\" \\\\c %%h $$X"'
    assert quoting.unit_line("a b", "c") == '"a b" "c"'
    with pytest.raises(ValueError, match="control character"):
        quoting.unit("new\nline")


@pytest.mark.parametrize("path", ["/models/a:b", "/models/a,b", "/m\nx"])
def test_a_volume_path_docker_cannot_carry_is_refused(path):
    with pytest.raises(ValueError, match="docker --volume"):
        quoting.volume(path, "/models")
    assert quoting.volume("/srv/my models", "/models") == "/srv/my models:/models:ro"
    assert quoting.volume("/var/cache/x", "/cache", read_only=False) == "/var/cache/x:/cache"
