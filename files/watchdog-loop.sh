# shellcheck shell=bash
# What both watchdogs share, sourced by llama-server-watchdog.sh and rpc-server-watchdog.sh (shipped
# next to them by llama-rpc-deploy): their command line, their settings file and their loop.

usage() { echo "usage: $0 [--passes N]" >&2; exit 2; }

# watchdog_settings "$@": [--passes N] into $passes (empty: look for ever), then the settings: the shell
# assignments in the file LLAMA_RPC_ENV, by default the watchdog's own path with .env for .sh.
watchdog_settings() {
  passes=
  while [ $# -gt 0 ]; do
    case $1 in
      --passes) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || usage; passes=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  # shellcheck source=/dev/null
  . "${LLAMA_RPC_ENV:-${0%.sh}.env}" || exit 1
}

# watch LOOK: sleep INTERVAL seconds, then run LOOK; $passes times, or for ever.
watch() {
  local pass=0
  while [ -z "$passes" ] || [ "$pass" -lt "$passes" ]; do
    sleep "$INTERVAL" || exit 1
    "$1"
    pass=$((pass + 1))
  done
}
