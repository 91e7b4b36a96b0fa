#!/bin/bash
# Watchdog for rpc-server on a worker: restart it when it holds on to a dead client.
# Shipped as is by llama-rpc-deploy (files/); run by rpc-server-watchdog.service.
# Usage: rpc-server-watchdog.sh [--passes N]   N looks, then exit 0 (default: look for ever); needs watchdog-loop.sh beside it
#
# rpc-server serves one client at a time, and it cannot tell an idle client from a vanished one.
# When the network to the coordinator was down long enough for llama-server to be restarted, the
# old connection never closes on this side, and the new llama-server's connection waits behind it
# for ever. Only the coordinator may connect (the firewall), and it runs one llama-server: so a
# connection waiting PATIENCE s or more in rpc-server's accept queue means the one being served is dead.
#
# Settings: the shell assignments in the file LLAMA_RPC_ENV, by default this script's path with .env for .sh
# (/opt/llama-rpc/rpc-server-watchdog.env), written by llama-rpc-deploy:
#   RPC_PORT     rpc-server's TCP port
#   INTERVAL     seconds between two looks (a whole number: the wait is counted in looks times INTERVAL)
#   PATIENCE     seconds a new connection may wait in the accept queue before rpc-server is restarted
#   SERVER_UNIT  rpc-server's systemd unit
set -u  # a setting missing from the env file stops the watchdog instead of reading as empty

# shellcheck source=SCRIPTDIR/watchdog-loop.sh
. "$(dirname "$0")/watchdog-loop.sh" || exit 1
watchdog_settings "$@"
: "${RPC_PORT:?}" "${INTERVAL:?}" "${PATIENCE:?}" "${SERVER_UNIT:?}"  # required

waited=0
look() {  # one look at rpc-server's accept queue; restarts it when a connection has waited PATIENCE s
  [ "$(systemctl is-active "$SERVER_UNIT")" = active ] || { waited=0; return 0; }
  local queued
  # the listening socket's Recv-Q: connections accepted by the kernel that rpc-server has not taken yet
  queued=$(ss -Hltn "sport = :$RPC_PORT" | awk '{ print $2; exit }')
  if [ "${queued:-0}" -gt 0 ]; then waited=$((waited + INTERVAL)); else waited=0; fi
  if [ "$waited" -ge "$PATIENCE" ]; then
    echo "a new connection has waited ${waited} s while rpc-server still serves an old one" \
         "(llama-server restarted while the network was down?): restarting $SERVER_UNIT"
    systemctl restart "$SERVER_UNIT"
    waited=0
  fi
}

watch look
