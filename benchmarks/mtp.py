"""MTP-style drafting over the split (issue 36): a Gemma 4 assistant, where the deploy puts it and elsewhere, against
plain decoding, at a short prompt and at 3/4 of the context; tokens/s and what crosses the wire per generated token.

    python3 -m benchmarks.mtp [--rounds 3] [--runs 3] [--local] [--out docs/results/mtp.md]

The lab up and deployed (`python3 -m llama_rpc_deploy lab up --workers 2`, then `pyinfra -y .lab/inventory.py
deploy.py`); about 15 minutes with 3 rounds. Each lab host is pinned to its own core (`lab pin`).

The article's case: MTP drafting over RPC gave nothing, and half the speed at a long context. The lab's stand-in
(lab/testgemma4.py): lab.GEMMA4_MODEL, the lab's sentence in Gemma 4's architecture (8 layers, sliding and global
attention), and lab.ASSISTANT_MODEL, its gemma4-assistant (llama-server --spec-type draft-mtp), whose drafts skip
every third word of the sentence, so some are rejected. The assistant has no KV cache of its own: its layers read the
target's last two layers' KV, and its first input is the target's last hidden state. The lab's split: layers 3..7 and
the output on the two workers (-ngl 6), so the target's last layers are on RPC1.

Modes, each deployed once a round (the order turned by one every round), one slot (llama_parallel 1, 2048 tokens):
  plain                       no speculation;
  assistant (default: RPC1)   the deploy's placement: the device of the target's last layers
                              (speculation.assistant_device, settled by the deploy);
  assistant following --device
                              llama.cpp's default placement, as the article ran it (the draft's flags in
                              llama_extra_args, no --spec-draft-device): the assistant's layers spread over RPC0 and
                              RPC1, so the KV they read is copied between devices through the coordinator on every
                              draft pass. (Asked for on RPC0 alone, or on the CPU, llama.cpp aborts at load: the
                              deploy refuses both, speculation.placement_problem.)
With --local, the coordinator has a device of its own, as on real hardware (the deploy puts its last GPU last, with
the target's last layers, the output, and so the assistant): the lab's coordinator has no GPU, so its stand-in is
Mesa's lavapipe (image_backend 'vulkan' with no gpus: Vulkan0, the CPU's Vulkan device, in llama-server's own
process). The split: every layer offloaded (-ngl 99), a third each to RPC0, RPC1 and Vulkan0, so layers 6 and 7,
whose KV the assistant reads, and the output are on Vulkan0. Modes: plain, and the assistant where the deploy puts
it (Vulkan0, local: no draft pass crosses the network). Written to docs/results/mtp-local.md. lavapipe compiles its
shaders at every start (about 2 minutes a deploy on the lab).

Each mode is measured at two prompts: PROMPT (short), and a prompt of 3/4 of the context (sentence words, then
PROMPT), the case where the article measured 0.5x. As in benchmarks/speculation.py: --runs times, after a warm-up, two
greedy completions (16 and 64 tokens); llama-server's tokens/s (the 64-token one's), drafted and accepted tokens,
and the coordinator's kernel counters for its connection to each worker, per generated token = (64's - 16's) / the
tokens between: bytes down and up, and data segments down, about two a round trip (rpc-server writes a reply's size,
then the reply). Ratios: mode / plain, the median of the rounds' ratios, 95% bootstrap interval over rounds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.labkit import INVENTORY, RESULTS, cpu_model, deploy, git, log
from benchmarks.speculation import deployed, measure, ratio_rows, table
from lab import lab
from lab.testmodel import PROMPT, SENTENCE, tokenize

CONTEXT = 2048  # the lab's llama_ctx_size, one slot
BASE = {"llama_model_path": lab.GEMMA4_MODEL, "llama_parallel": 1}
MODES = {
    "plain": {},
    "assistant (default: RPC1)": {"llama_spec_draft_path": lab.ASSISTANT_MODEL},
    "assistant following --device": {  # llama.cpp's default placement, as the article ran it: by flags alone
        "llama_extra_args": [
            "--spec-draft-model",
            f"/models/{Path(lab.ASSISTANT_MODEL).name}",
            "--spec-type",
            "draft-mtp",
        ]
    },
}


def long_prompt(tokens: int = CONTEXT * 3 // 4) -> str:
    """Words of the sentence, five at a time from a moving start, before PROMPT: at least `tokens` tokens (the lab's
    tokenizer, testmodel.tokenize, is llama.cpp's), so the recital starts past 3/4 of the context."""
    words, text, k = SENTENCE.split(), PROMPT, 0
    while len(tokenize(text)) < tokens:
        text = " ".join(words[k % len(words) : k % len(words) + 5]) + " " + text
        k += 3
    return text


PROMPTS = {"short prompt": PROMPT, "3/4 context": long_prompt()}
CASES = [(p, m) for p in PROMPTS for m in MODES]

# --local: the coordinator's own device (lavapipe's Vulkan0) holds the target's last layers and the assistant
LOCAL_INVENTORY = lab.LAB_DIR / "inventory-local.py"
LOCAL_SPLIT = {"llama_n_gpu_layers": 99, "llama_tensor_split": [1, 1, 1]}  # RPC0 0-2, RPC1 3-5, Vulkan0 6, 7, output
LOCAL_MODES = {"plain": {}, "assistant (the deploy's: Vulkan0, local)": MODES["assistant (default: RPC1)"]}
LOCAL_CASES = [(p, m) for p in PROMPTS for m in LOCAL_MODES]


def local_inventory() -> Path:
    """The lab's inventory, its coordinator on image_backend 'vulkan' with no gpus (lavapipe); the workers stay CPUs."""
    LOCAL_INVENTORY.write_text(
        INVENTORY.read_text() + "\n# benchmarks/mtp.py --local: the coordinator's own device, lavapipe's Vulkan0\n"
        'coordinator = [(coordinator[0][0], {**coordinator[0][1], "image_backend": "vulkan"})]\n'
    )
    return LOCAL_INVENTORY


def report(rows: list[dict], meta: dict) -> str:
    local = meta.get("local")
    where = (
        "; the coordinator's device is lavapipe's Vulkan0, holding layers 6 and 7, the output and the assistant; "
        "RPC0 holds layers 0-2, RPC1 layers 3-5"
        if local
        else ""
    )
    lines = [
        "# MTP-style drafting over the split: a Gemma 4 assistant (issue 36)"
        + (", the coordinator with a device of its own" if local else ""),
        "",
        f"`python3 -m benchmarks.mtp --rounds {meta['rounds']} --runs {meta['runs']}{' --local' if local else ''}`, "
        f"{meta['date']}, commit {meta['commit']}, {meta['cpu']}: the lab (coordinator and two CPU workers, each "
        f"pinned to its own core{where}), "
        f"the lab's Gemma 4 target and assistant (lab/testgemma4.py), one slot of {CONTEXT} tokens; the 3/4-context "
        f"prompt is {meta['long_prompt_tokens']} tokens. Ratios: mode / plain tokens/s at the same prompt, the median "
        "of the rounds' ratios with a 95% bootstrap interval over rounds. Per generated token, per worker (RPC0; RPC1): "
        "bytes down / up and data segments down (about two a round trip).",
        "",
        *table(rows, "prompt"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--local", action="store_true", help="the coordinator with a device of its own (lavapipe)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    out = args.out or RESULTS / ("mtp-local.md" if args.local else "mtp.md")
    table_modes, cases = (LOCAL_MODES, LOCAL_CASES) if args.local else (MODES, CASES)
    inventory, base = (local_inventory(), {**BASE, **LOCAL_SPLIT}) if args.local else (INVENTORY, BASE)
    modes = list(table_modes)
    results: dict = {p: {m: [] for m in table_modes} for p in PROMPTS}
    lab.pin()
    try:
        for round_ in range(args.rounds):
            turn = round_ % len(modes)
            for mode in modes[turn:] + modes[:turn]:
                data = {**base, **table_modes[mode]}
                log(f"round {round_ + 1}: {mode}")
                cluster = deployed(data, inventory)
                for name, prompt in PROMPTS.items():
                    results[name][mode].append(measure(cluster, args.runs, prompt))
    finally:
        deploy(INVENTORY)
        lab.pin(unpin=True)
    rows = ratio_rows(results, cases)
    meta = {
        "local": args.local,
        "rounds": args.rounds,
        "runs": args.runs,
        "date": time.strftime("%Y-%m-%d"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "cpu": cpu_model(),
        "long_prompt_tokens": len(tokenize(PROMPTS["3/4 context"])),
    }
    out.write_text(report(rows, meta))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
