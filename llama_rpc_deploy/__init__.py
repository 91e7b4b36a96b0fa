"""llama-rpc-deploy: the parts of the deploy that can be checked without any host.

settings  - every setting, its default and its check (the schema)
plan      - the cluster as the deploy sees it: devices, endpoints, image tag
render    - launch scripts and systemd units from templates/
source    - the llama.cpp source tarball that the coordinator builds from
facts     - pyinfra facts read on the hosts before anything changes
testmodel - a small llama GGUF with random weights, for the lab and the tests
lab       - the local lab: containers that behave like real hosts
"""
