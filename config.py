# pyinfra reads this file before it connects to any host: every setting is checked here first,
# so a typo in group_data/ or inventory.py stops the run before anything is touched.
from pyinfra import config

from llama_rpc_deploy.deployment import preflight
from llama_rpc_deploy.sleep import wake_for_deploy

preflight()
wake_for_deploy()  # workers asleep (sleep_idle_seconds): the coordinator wakes them before pyinfra connects

# One host failing stops every host: a worker must not install a version the coordinator failed to build.
# (The service starts and the health check ignore their own errors: the health check decides, and a
# failed one rolls every host back, see llama_rpc_deploy/phases/rollback.py.)
config.FAIL_PERCENT = 0  # (a bare FAIL_PERCENT = 0 here is read by nothing: pyinfra 3 only runs this file)
