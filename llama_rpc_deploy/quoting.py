"""Every value that reaches a host is quoted here, for the syntax it lands in.

- `shell` / `shell_line`: a word of a bash command (launch scripts, commands the deploy runs over SSH).
- `unit` / `unit_line`: a word of a systemd unit's Exec line. systemd is not a shell: it splits on
  spaces, takes "double quotes" with C-style escapes, and expands %specifiers and $VARIABLES, so
  `%` becomes `%%` and `$` becomes `$$`.
- `ini`: a value of llama-server's models preset (--models-preset). Its INI has no quoting: a value
  runs to the end of the line or to a `;` or `#`, without the spaces around it, so those are refused.
- `volume`: a `docker --volume SOURCE:TARGET[:ro]` argument. Its syntax has no escape for `:` (nor
  `,` in `--mount`), so such a path is refused, never mangled.

The schema (settings.py) already refuses what no quoting can carry (control characters, and `:` or
`,` in a path that becomes a volume); tests/unit/test_quoting.py and the Hypothesis test of every
setting (tests/unit/test_fuzz_settings.py) check that what passes comes out as the intended words.
"""

from __future__ import annotations

import shlex


def shell(word) -> str:
    return shlex.quote(str(word))


def shell_line(*words) -> str:
    return " ".join(shell(w) for w in words)


def unit(word) -> str:
    text = str(word)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{text!r}: a control character cannot go into a systemd unit")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def unit_line(*words) -> str:
    return " ".join(unit(w) for w in words)


def ini(value) -> str:
    text = str(value)
    if any(c in text for c in ";#\r\n") or text != text.strip():
        raise ValueError(
            f"{text!r}: llama-server's preset INI cannot carry ';', '#', a line break, or spaces at either end"
        )
    return text


def volume(source: str, target: str, read_only: bool = True) -> str:
    for path in (source, target):
        if ":" in path or "," in path or "\n" in path:
            raise ValueError(f"{path!r}: docker --volume has no way to quote ':' or ','")
    return f"{source}:{target}{':ro' if read_only else ''}"
