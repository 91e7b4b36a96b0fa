"""systemd as the oracle for quoting.unit: a unit on a lab host whose ExecStart prints its words."""

from llama_rpc_deploy import quoting

from .lab_helpers import needs_docker, on
from ..unit.helpers import CORPUS

pytestmark = needs_docker
UNIT = "llama-rpc-quoting-test"


def test_systemd_reads_unit_words_as_quoting_wrote_them():
    words = [w for w in CORPUS if w.isprintable()]  # a control character is refused, not quoted
    exec_start = quoting.unit_line("/usr/bin/printf", "[%s]\\n", *words)  # printf's own \\n: one line a word
    unit = f"[Service]\nType=oneshot\nExecStart={exec_start}\n"
    on(0, f"systemctl stop {UNIT} 2>/dev/null; rm -f /run/systemd/system/{UNIT}.service")
    with_file = on(
        0,
        f"cat > /run/systemd/system/{UNIT}.service <<'EOF_UNIT'\n{unit}EOF_UNIT\n"
        f"systemctl daemon-reload && systemctl start {UNIT}",
    )
    try:
        assert with_file.returncode == 0, with_file.stderr
        out = on(0, f"journalctl -u {UNIT} -o cat --no-pager -n {len(words) + 20}").stdout
        printed = [line[1:-1] for line in out.splitlines() if line.startswith("[") and line.endswith("]")]
        assert printed[-len(words) :] == words
    finally:
        on(0, f"rm -f /run/systemd/system/{UNIT}.service; systemctl daemon-reload")
