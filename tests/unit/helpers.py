"""Build clusters from plain dicts, through the same layers (settings.layers) and checks as the deploy."""
from llama_rpc_deploy import cluster as cluster_
from llama_rpc_deploy.cluster_checks import build
from llama_rpc_deploy.settings import layers

MODEL = "/srv/models/lmstudio-community/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"


def host(name, role, data, all_data=None, groups=(), overrides=None):
    """One HostPlan: data is the host's own data in the inventory; groups: [(group name, its data)]."""
    return cluster_.host_plan(name, layers(name, role, overrides=overrides or {}, host_data=data, groups=list(groups),
                                           all_data={"llama_model_path": MODEL, **(all_data or {})},
                                           inventory_file="inventory.py"))


def cluster(coordinator=None, workers=(None,), all_data=None, names=None):
    """coordinator/workers: host data dicts; all_data: group_data/all."""
    names = names or ["10.0.0.10"] + [f"10.0.0.{20 + i}" for i in range(len(workers))]
    c = host(names[0], "coordinator", {"gpus": ["RTX 4080"], **(coordinator or {})}, all_data)
    ws = [host(n, "workers", {"gpus": ["RTX 5060 Ti"], **(w or {})}, all_data) for n, w in zip(names[1:], workers)]
    return build([c], ws)
