#!/usr/bin/env bash
# README's second command: set up this machine and run every test: unit tests (no hosts), the front's
# tests (the real HAProxy before a fake llama-server, on this machine), then the end-to-end lab tests
# (lab up with two workers: deploy, testinfra verification, idempotent re-run, bad configurations,
# lockdown from an outsider host, faults and rollback, load, bench).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-machine.sh
exec python3 -m pytest -v tests/unit tests/front tests/e2e "$@"
