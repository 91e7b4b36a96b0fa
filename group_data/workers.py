# Settings live in group_data/workers.yml; this loader hands them to pyinfra (it reads only .py files).
from llama_rpc_deploy.userdata import group_vars; globals().update(group_vars(__file__))
