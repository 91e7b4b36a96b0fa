# pyinfra reads this file before it connects to any host: every setting is checked here first,
# so a typo in group_data/ or inventory.py stops the run before anything is touched.
from llama_rpc_deploy.deployment import preflight

preflight()
