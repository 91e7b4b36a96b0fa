"""What the unit tests share (no test module imports another): clusters built from plain dicts, through the same
layers (settings.scopes) and checks as the deploy; the image tag they render with and the words of a rendered
launch script; two llama.cpp sources; a model of the seed pair's size; a corpus of shell words; fewer examples
for a dear property test under Hypothesis' ci profile."""

import os
import shlex

from llama_rpc_deploy import cluster as cluster_
from llama_rpc_deploy.cluster_checks import checked_cluster
from llama_rpc_deploy.gguf_header import ModelInfo
from llama_rpc_deploy.image import FILES
from llama_rpc_deploy.render import coordinator_files
from llama_rpc_deploy.settings import scopes
from llama_rpc_deploy.source import Source

MODEL = "/srv/models/lmstudio-community/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"
IMAGE = "llama-rpc:0c1e57098-abcdef012345"  # the image tag the tests render with
# a local tarball (its sha256 the ident) and a commit downloaded from a URL
LOCAL = Source(ident="a" * 64, local_tarball=FILES / "Dockerfile", url=None)
REF = Source(
    ident="0c1e57098bba43ac29e6e3b677cdceebdd22334f", local_tarball=None, url="https://example.invalid/x.tar.gz"
)
# shell words that need quoting (tests/unit/test_quoting.py: bash reads them back; tests/e2e/test_lab_quoting.py: systemd)
CORPUS = [
    "plain",
    "two words",
    "it's",
    'say "hi"',
    "$(id)",
    "`id`",
    "a;b",
    "a&b",
    "a|b",
    "*",
    "~",
    "-n",
    "",
    "%h %n",
    "$HOME",
    "${HOME}",
    "back\\slash",
    "tab\there",
    "é中文🙂",
    "new\nline",
]


def host(name, role, data, all_data=None, groups=(), overrides=None):
    """One ClusterHost: data is the host's own data in the inventory; groups: [(group name, its data)]."""
    return cluster_.cluster_host(
        name,
        scopes(
            name,
            role,
            overrides=overrides or {},
            host_data=data,
            groups=list(groups),
            all_data={"llama_model_path": MODEL, **(all_data or {})},
            inventory_file="inventory.py",
        ),
    )


def cluster(coordinator=None, workers=(None,), all_data=None, names=None):
    """coordinator/workers: host data dicts; all_data: group_data/all."""
    names = names or ["10.0.0.10"] + [f"10.0.0.{20 + i}" for i in range(len(workers))]
    c = host(names[0], "coordinator", {"gpus": ["RTX 4080"], **(coordinator or {})}, all_data)
    ws = [host(n, "workers", {"gpus": ["RTX 5060 Ti"], **(w or {})}, all_data) for n, w in zip(names[1:], workers)]
    return checked_cluster([c], ws)


def server_script(c, image=IMAGE):
    return coordinator_files(c, image)["/opt/llama-rpc/llama-server.sh"]


def words(script):
    """The command line the script runs, as the shell would split it."""
    body = script.split("exec ", 1)[1].replace("\\\n", " ")
    return shlex.split(body.split('"$@"')[0])


def flag(argv, name):
    return argv[argv.index(name) + 1]


def seed_model(weights_gb=17.0, n_layer=60):
    """A model as the planner sees it: weights_gb in n_layer equal layers, K and V 2048 wide in each."""
    layer = int(weights_gb * 1e9 / n_layer)
    return ModelInfo(
        path="-",
        arch="x",
        n_layer=n_layer,
        n_embd=5376,
        n_vocab=262144,
        n_ctx_train=131072,
        layer_bytes=(layer,) * n_layer,
        input_bytes=0,
        output_bytes=0,
        kv_per_token=((2048, 2048),) * n_layer,
    )


def ci_examples(examples: int):
    """@ci_examples(N): a property test whose examples are dear tries N of them under Hypothesis' ci profile (the
    default, tests/conftest.py: 100, the same ones every run) and the profile's own number under any other
    (HYPOTHESIS_PROFILE=explore: 3000 new ones)."""
    from hypothesis import settings

    if os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci":
        return settings()
    return settings(max_examples=examples)
