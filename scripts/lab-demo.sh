#!/usr/bin/env bash
# README's first command: set up this machine, bring up the local lab (a coordinator and a worker),
# deploy to it over SSH like to real machines, and print a completion from the model split across them.
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${WORKERS:-1}"
scripts/setup-machine.sh
python3 -m llama_rpc_deploy lab up --workers "$workers"
pyinfra -y .lab/inventory.py deploy.py
python3 -m llama_rpc_deploy complete -i .lab/inventory.py --prompt "${PROMPT:-Two computers, one model:}" -n 32
echo "chat page: http://$(python3 -c 'from lab import lab; print(lab.ip_of(0))'):8080/  (API key: $(pwd)/.lab/api_key)"
