"""llama-rpc-deploy: everything deploy.py runs, and the commands around it.

A setting's way, from what a user edits to what runs on a host:
userdata       - group_data/*.yml, read for pyinfra by group_data/*.py (file:line:column errors)
settings       - every setting: its default (the only place), its check, who reads it; scopes() is the one
                 place where precedence (--data, host, group, all) is written
refusal        - refuse(): a run stops with our own line alone (config.py's preflight, deploy.py's checks)
gpus           - the cards a host's `gpus` may name: vendor, memory, bandwidth, CUDA architecture
cluster        - the hosts as the deploy sees them (ClusterHost): roles, devices in order, RPC endpoints, derived values
cluster_checks - the checks that span settings or hosts, each a named function; checked_cluster() runs them
loading        - pyinfra's own Inventory of an inventory file, and the checked Cluster from it
deployment     - the checked cluster with the llama.cpp source, the images' tags and the keys; config.py's preflight
roles          - what each role puts on a host, by name: its units, the paths of its files, its packages
render         - launch scripts and units from templates/, programs of files/ with their env files
programs       - the bash programs of files/ and their environment files
quoting        - every value quoted for where it lands: bash, systemd Exec lines, docker --volume
tunnel         - the RPC tunnel's CA, keys and certificates (made on the control machine)
paths          - the checkout, and templates/ and files/ wherever the package is installed
trees          - the files of a source tree (for source and webui)

The deploy itself (pyinfra inventory.py deploy.py):
run            - one pyinfra run's shared state (the settled Cluster, files replaced, workers restarted, the health check)
phases/        - checks (and settle: the Cluster from the coordinator's files), build, services, rollback: the
                 operations, per role; shared: what they share
facts          - pyinfra facts read on the hosts before anything changes
operations     - a pyinfra operation pyinfra lacks (a secret file, never shown)
image          - the image's identity: CUDA architectures, build arguments, tag
source         - the llama.cpp source tarball the coordinator builds from
webui          - llama-server's chat page, built once on the control machine for a local tree
transfer       - the image's way from the coordinator to a worker

Around it (llama-rpc COMMAND, or python -m llama_rpc_deploy COMMAND: __main__ dispatches to each command's module):
plan           - the capacity planner and `plan`; gguf_header reads what it needs from a GGUF file (every shard)
status         - every host's services, restarts and their cause, cache, load report (load_report)
bench, client  - tokens/s against the planner's ceiling (`bench`); requests to llama-server (`complete`)
loadtest       - concurrent clients, time until serving again (tests, bench)
remote         - the hosts over SSH the way pyinfra reaches them (status, bench, tune, testinfra)
tune/          - the fastest split, measured (`tune`): candidates restart llama-server only; tune.search the search
                 and its statistics, tune.writeback the group_data file written back (--apply)
Not in the package: lab/ at the top of the checkout (lab.lab, lab.testmodel, lab.testprojector): the local
lab (containers that behave like real hosts) and the small GGUFs it and the tests generate.
"""
