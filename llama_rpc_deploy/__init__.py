"""llama-rpc-deploy: everything deploy.py runs, and the commands around it.

A setting's way, from what a user edits to what runs on a host:
userdata       - group_data/*.yml, read for pyinfra by group_data/*.py (file:line:column errors)
settings       - every setting: its default (the only place), its check, who reads it; layers() is
                 the one place where precedence (--data, host, group, all) is written
cluster        - the hosts as the deploy sees them: roles, devices in order, RPC endpoints, derived values
cluster_checks - the checks that span settings or hosts, each a named function; checked_cluster() runs them
deployment     - the checked cluster with the llama.cpp source and the image tag, from pyinfra's inventory
render         - launch scripts and units from templates/, programs of files/ with their env files
programs       - the bash programs of files/ and their environment files
quoting        - every value quoted for where it lands: bash, systemd Exec lines, docker --volume
paths          - the checkout, and templates/ and files/ wherever the package is installed
trees          - the files of a source tree (for source and webui)

The deploy itself (pyinfra inventory.py deploy.py):
run            - one pyinfra run's shared state (files replaced, workers restarted, the health check)
phases/        - checks, build, services, rollback: the operations, per role
facts          - pyinfra facts read on the hosts before anything changes
operations     - a pyinfra operation pyinfra lacks (a secret file, never shown)
image          - the image's identity: CUDA architectures, build arguments, tag
source         - the llama.cpp source tarball the coordinator builds from
transfer       - the image's way from the coordinator to a worker

Around it (llama-rpc COMMAND, or python -m llama_rpc_deploy COMMAND, runs the module of the same name):
plan           - the capacity planner; gguf_header reads what it needs from a GGUF file (every shard)
status         - every host's services, restarts and their cause, cache, load report (load_report)
bench, client  - tokens/s against the planner's ceiling; requests to llama-server
loadtest       - concurrent clients, time until serving again (tests, bench)
tune           - the fastest split, measured: candidates restart llama-server only; tune_search the search and
                 its statistics, tune_apply the group_data file written back (--apply)
Not in the package: lab/ at the top of the checkout (lab.lab, lab.testmodel, lab.testprojector): the local
lab (containers that behave like real hosts) and the small GGUFs it and the tests generate.
"""
