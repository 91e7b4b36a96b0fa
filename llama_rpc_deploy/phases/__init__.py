"""The deploy's phases, in the order deploy.py runs them, each a module of pyinfra operations:

checks    - before any change: what each host has, and the planner on the model's header
build     - the service user, the image built once on the coordinator and carried to every worker
services  - the firewall, rpc-server, llama-server and their watchdogs as systemd units
rollback  - every host back on its previous version when the new one failed its health check
shared    - what they share (an upload that keeps the previous file, a unit's restart on new files, the health
            probes, the barrier between phases): a phase imports from here, never from another phase
"""
