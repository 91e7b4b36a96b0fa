#!/usr/bin/env bash
# README's second command: set up this machine and run every test: unit tests (no hosts), then the
# end-to-end lab tests (lab up with two workers: deploy, testinfra verification, idempotent re-run,
# bad configurations, lockdown from an outsider host, faults and rollback, load, bench).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-machine.sh
exec python3 -m pytest -v tests/unit tests/e2e "$@"
