#!/bin/sh
# One stable entry point per role, whatever the llama.cpp tree called its binaries.
set -e
role="${1:-}"
case "$role" in
  server) shift; exec /app/llama-server "$@" ;;
  rpc)    shift; exec /app/rpc-server "$@" ;;
  fit-params) shift; exec /app/llama-fit-params "$@" ;;  # llama.cpp's memory estimate (--fit-print on)
  version) exec /app/llama-server --version ;;
  rpc-protocol) exec cat /app/rpc-protocol ;;  # the RPC protocol version rpc-server and llama-server speak
  *) echo "usage: IMAGE server|rpc|fit-params|version|rpc-protocol [ARGS...]" >&2; exit 64 ;;
esac
