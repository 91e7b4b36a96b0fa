#!/usr/bin/env bash
# README's second command: set up this machine and run every test: the formatter and the linter, unit tests
# (no hosts), the front's tests (the real HAProxy before a fake llama-server, on this machine), then the lab's
# end-to-end tests (lab up with two workers: deploy, testinfra verification, idempotent re-run, bad configurations,
# lockdown from an outsider host, faults and rollback, load, bench). Arguments go to pytest, both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-machine.sh
# First, in seconds: the code as ruff formats it, and its linter (pyproject.toml [tool.ruff]).
python3 -m ruff format --check --diff .
python3 -m ruff check .
# The unit tests first, in one worker per core (they share no port and no path; tests/unit/conftest.py), and a
# failure stops here; then the front's and the lab's tests in one process: they share one lab and its ports.
# Status 5 is pytest's "no test selected": arguments such as -k may select tests of one run only.
unit=0
python3 -m pytest -v -n auto --dist loadgroup tests/unit "$@" || unit=$?
if [ "$unit" -ne 0 ] && [ "$unit" -ne 5 ]; then exit "$unit"; fi
lab=0
python3 -m pytest -v tests/front tests/e2e "$@" || lab=$?
if [ "$lab" -eq 5 ] && [ "$unit" -eq 0 ]; then exit 0; fi
exit "$lab"
