#!/bin/sh
# One stable entry point per role, whatever the llama.cpp tree called its binaries.
set -e
role="${1:-}"
case "$role" in
  server) shift; exec /app/llama-server "$@" ;;
  rpc)    shift; exec /app/rpc-server "$@" ;;
  version) exec /app/llama-server --version ;;
  rpc-protocol) exec cat /app/rpc-protocol ;;  # the RPC protocol version rpc-server and llama-server speak
  *) echo "usage: IMAGE server|rpc|version|rpc-protocol [ARGS...]" >&2; exit 64 ;;
esac
