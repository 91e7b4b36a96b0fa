"""`pyinfra INVENTORY benchmarks/prepare_only.py`: the deploy's prepare phase alone (phases/prepare.py), for
benchmarks/prepare_time.py: the same operations deploy.py runs first, nothing after them."""

from pyinfra import host, inventory, state

from llama_rpc_deploy.phases import prepare
from llama_rpc_deploy.refusal import refuse
from llama_rpc_deploy.run import Run
from llama_rpc_deploy.settings import SettingsError

try:
    run = Run.of(state, inventory)
except (SettingsError, FileNotFoundError) as error:
    refuse(str(error))
if run.deployment.cluster.role(host.name) is not None:
    prepare.prepare_host(run)
