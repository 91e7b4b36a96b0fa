#!/bin/bash
# The front's two states for llama-server's planned restarts (llama-server.service runs both).
# Shipped as is by llama-rpc-deploy (files/).
# Usage: front-drain.sh drain   stop sending new requests to llama-server (the front holds them) and wait,
#                               at most DRAIN_SECONDS, until no request is in flight at llama-server
#        front-drain.sh ready   send requests to llama-server again as soon as its health check passes
# A missing front (its admin socket absent: not installed or not running yet) is not an error: nothing
# to drain. `drain` is skipped once when NO_DRAIN_FLAG exists: the watchdog leaves it before restarting a
# llama-server that lost a worker, whose requests in flight will never finish.
#
# Settings: the shell assignments in front-drain.env beside this script (or the file LLAMA_RPC_ENV):
#   SOCKET         the front's admin socket (HAProxy's runtime API)
#   BACKEND        the HAProxy backend of llama-server, and SERVER its server line
#   SERVER
#   DRAIN_SECONDS  the longest wait for the requests in flight
#   NO_DRAIN_FLAG  the watchdog's file
set -u
# shellcheck source=/dev/null
. "${LLAMA_RPC_ENV:-${0%.sh}.env}" || exit 1
: "${SOCKET:?}" "${BACKEND:?}" "${SERVER:?}" "${DRAIN_SECONDS:?}" "${NO_DRAIN_FLAG:?}"

api() { echo "$1" | socat -t 5 stdio "unix-connect:$SOCKET"; }

in_flight() {  # requests at llama-server now: the server's scur in HAProxy's CSV statistics (5th field)
  api "show stat $BACKEND 4 -1" | awk -F, -v s="$SERVER" '$2 == s { print $5 }'
}

case "${1:-}" in
  drain | ready) ;;
  *)
    echo "usage: front-drain.sh drain|ready" >&2
    exit 2
    ;;
esac
if [ "$1" = drain ] && [ -e "$NO_DRAIN_FLAG" ]; then  # this stop's, front or not: the next one drains again
  rm -f "$NO_DRAIN_FLAG"
  echo "front-drain: llama-server lost a worker: no drain (its requests in flight cannot finish)"
  exit 0
fi
if [ ! -S "$SOCKET" ]; then
  echo "front-drain: no front at $SOCKET: nothing to do"
  exit 0
fi
case "$1" in
  ready)
    api "set server $BACKEND/$SERVER state ready" >/dev/null
    echo "front-drain: requests go to llama-server once its health check passes"
    ;;
  drain)
    api "set server $BACKEND/$SERVER state drain" >/dev/null
    deadline=$((SECONDS + DRAIN_SECONDS))
    while :; do
      n=$(in_flight)
      [ "${n:-0}" -gt 0 ] || { echo "front-drain: drained, new requests are held"; exit 0; }
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "front-drain: $n request(s) still in flight after ${DRAIN_SECONDS}s: going on"
        exit 0
      fi
      sleep 0.5
    done
    ;;
esac
