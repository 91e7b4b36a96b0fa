"""Every operation and every rendered file of a deploy, per host, for three inventories: to show that a change
meant to keep behaviour keeps it (run it before and after, then diff the two files).

    python3 scripts/snapshot.py OUT.json          # in each of the two checkouts
    diff <(python3 -m json.tool A.json) <(python3 -m json.tool B.json)

The inventories: the lab's (as `lab up --workers 2` writes it), the example (inventory.py's two NVIDIA hosts),
and three workers that differ (their own threads, no tensor cache, a vulkan worker) with files changed
differently on each. deploy.py runs through pyinfra's own prepare stage with the facts faked (tests/wiring.py);
each operation is written with its name and the commands it would run, file uploads with their whole content.
The RPC tunnel's keys are made once in this checkout's .state/ and reused; copy that folder between the two
checkouts so that both render the same keys.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from the checkout
    sys.path.insert(0, str(ROOT))

from pyinfra.api.host import Host  # noqa: E402
from pyinfra.context import ctx_host, ctx_inventory, ctx_state  # noqa: E402

from lab import lab  # noqa: E402
from tests import wiring  # noqa: E402


def lab_inventory(tmp: Path) -> tuple[str, dict]:
    api_key = tmp / "api_key"
    api_key.write_text("0" * 64 + "\n")
    api_key.chmod(0o600)
    settings = lab.lab_settings(tmp / "llama.cpp.tar.gz", 2, api_key)
    with mock.patch.object(lab, "LAB_DIR", tmp / "lab"):
        (tmp / "lab").mkdir()
        path = lab.write_inventory(2, tmp / "lab_key", tmp / "known_hosts", settings)
    return path.read_text(), wiring.EVERY_FILE


def example_inventory(tmp: Path) -> tuple[str, dict]:
    text = (ROOT / "inventory.py").read_text().replace("192.0.2.", "10.0.2.")
    text += (
        f'\nfor _, _data in coordinator: _data.update(llama_model_path="/models/example.gguf", '
        f'llama_cpp_source="{tmp / "llama.cpp.tar.gz"}")\n'
    )
    return text, wiring.EVERY_FILE


def three_workers(tmp: Path) -> tuple[str, dict]:
    text = (
        f'LAB = {{"image_backend": "cpu", "llama_model_path": "/models/wiring.gguf", '
        f'"llama_cpp_source": "{tmp / "llama.cpp.tar.gz"}"}}\n'
        'coordinator = [("10.0.0.10", LAB)]\n'
        'workers = [("10.0.0.11", {"rpc_threads": 2}), ("10.0.0.12", {"rpc_cache": False}),\n'
        '           ("10.0.0.13", {"image_backend": "vulkan"})]\n'
    )
    changed = {
        "10.0.0.11": {"/opt/llama-rpc/rpc-server.sh"},
        "10.0.0.12": {"/etc/systemd/system/rpc-server.service"},
        "10.0.0.13": {"/etc/systemd/system/rpc-server-watchdog.service"},
        "10.0.0.10": {"/opt/llama-rpc/llama-server.sh"},
    }
    return text, changed


INVENTORIES = {"lab": lab_inventory, "example": example_inventory, "three-workers": three_workers}


def command_text(command, tmp: str) -> str | dict:
    src = getattr(command, "src", None)
    if src is not None:  # a file upload: its content
        if isinstance(src, io.StringIO):
            content = src.getvalue()
        elif isinstance(src, io.BytesIO):
            content = src.getvalue().decode(errors="replace")
        else:
            data = Path(src).read_bytes()
            content = "sha256:" + hashlib.sha256(data).hexdigest() if b"\0" in data else data.decode(errors="replace")
        return {"upload": command.dest, "content": content.replace(tmp, "<TMP>")}
    function = getattr(command, "function", None)
    if function is not None:
        return f"function {function.__qualname__}"
    text = str(getattr(command, "get_raw_value", lambda: command)()).replace(tmp, "<TMP>")
    return re.sub(r"(authorized_keys|sed -i)\.\d{10}\b", r"\1.<TIME>", text)  # files.line's backup suffix: the clock


def snapshot_of(name: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="snapshot-") as folder:
        tmp = Path(folder).resolve()
        (tmp / "llama.cpp.tar.gz").write_bytes(b"not really a tarball")
        text, changed = INVENTORIES[name](tmp)
        inventory = tmp / "inventory.py"
        inventory.write_text(text)
        header = wiring.model_header(tmp / "model.gguf")
        fixed = time.struct_time((2026, 1, 1, 0, 0, 0, 3, 1, 0))
        get_fact = wiring.fake_facts(changed, header, 4_000_000, ("runc", "nvidia"))
        with mock.patch.object(time, "gmtime", lambda *a: fixed), mock.patch.object(Host, "get_fact", get_fact):
            try:
                state = wiring.prepare(inventory, get_fact, wiring.fake_transfer_key(tmp))
            except Exception as error:  # a refusal is behaviour too
                return {"refused": f"{type(error).__name__}: {error}".replace(str(tmp), "<TMP>")}
            order = state.get_op_order()
            hosts = {}
            for host in state.inventory:
                ops = []
                for op_hash in order:
                    if op_hash not in host.op_hash_order:
                        continue
                    meta = state.get_op_meta(op_hash)
                    data = state.get_op_data_for_host(host, op_hash)
                    with ctx_state.use(state), ctx_inventory.use(state.inventory), ctx_host.use(host):
                        commands = [command_text(c, str(tmp)) for c in data.command_generator()]
                    ops.append({"name": sorted(meta.names), "commands": commands})
                hosts[host.name] = ops
        return hosts


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    result = {name: snapshot_of(name) for name in INVENTORIES}
    text = json.dumps(result, indent=1, sort_keys=True)
    if out:
        out.write_text(text + "\n")
        counts = {
            name: {h: len(ops) for h, ops in hosts.items()} if "refused" not in hosts else hosts
            for name, hosts in result.items()
        }
        print(f"snapshot: {out}: operations per host {counts}")
    else:
        print(text)


if __name__ == "__main__":
    main()
