"""Build clusters from plain dicts, the way deploy.py builds them from pyinfra's inventory."""
from llama_rpc_deploy.plan import host_plan, make_cluster
from llama_rpc_deploy.settings import Layer

MODEL = "/srv/models/lmstudio-community/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"


def cluster(coordinator=None, workers=(None,), all_data=None, names=None):
    """coordinator/workers: host data dicts; all_data: group_data/all.py."""
    all_layer = Layer("group_data/all.py", {"llama_model_path": MODEL, **(all_data or {})})
    coordinator = {"gpus": ["RTX 4080"], **(coordinator or {})}
    names = names or ["10.0.0.10"] + [f"10.0.0.{20 + i}" for i in range(len(workers))]
    c = host_plan(names[0], [Layer(f"inventory.py (host {names[0]})", coordinator), all_layer])
    ws = [host_plan(n, [Layer(f"inventory.py (host {n})", {"gpus": ["RTX 5060 Ti"], **(w or {})}), all_layer])
          for n, w in zip(names[1:], workers)]
    return make_cluster([c], ws)
