#!/bin/bash
# Watchdog for llama-server on the coordinator: restart it when it has lost a worker.
# Shipped as is by llama-rpc-deploy (files/); run by llama-server-watchdog.service.
# Usage: llama-server-watchdog.sh [--passes N]   N looks, then exit 0 (default: look for ever); needs watchdog-loop.sh beside it
#
# llama-server cannot reconnect to a worker: once a worker's rpc-server restarted (crash, worker
# reboot), or the network between them dropped, llama-server answers /health with ok and then
# crashes or hangs on the next request. Its TCP connection to each worker tells the truth first:
#   CLOSE-WAIT                 the worker closed it (rpc-server exited or its host went down cleanly)
#   data unacknowledged, RETRANSMISSIONS+ retransmissions   the worker or the network is gone
# Either way llama-server is restarted; its unit then waits (bounded) for every worker before it starts.
# The watchdog only reads socket states: it never connects to rpc-server, which serves one client at a time.
#
# Settings: the shell assignments in the file LLAMA_RPC_ENV, by default this script's path with .env for .sh
# (/opt/llama-rpc/llama-server-watchdog.env), written by llama-rpc-deploy:
#   RPC_ENDPOINTS    the workers' rpc-servers, HOST:PORT as llama-server's --rpc names them, separated by spaces
#   TUNNEL_REMOTES   through a tunnel (optional): the workers' TLS ends, HOST:PORT, separated by spaces. llama-server's
#                    connection then ends at the tunnel on this host, which closes it when the worker closes (seen in
#                    RPC_ENDPOINTS); a network that drops shows on the tunnel's own connection out, as data
#                    unacknowledged. (Not CLOSE-WAIT there: that is the tunnel's normal close, a router's child leaving.)
#   INTERVAL         seconds between two looks
#   RETRANSMISSIONS  retransmissions of the same unacknowledged data that mean the worker is gone (7: about 25 s)
#   GRACE            seconds to leave llama-server after restarting it, before looking again
#   SERVER_UNIT      llama-server's systemd unit
#   NO_DRAIN_FLAG    a file this watchdog creates before its restart: llama-server's stop then skips the
#                    front's drain (front-drain.sh), since the requests in flight cannot finish
set -u  # a setting missing from the env file stops the watchdog instead of reading as empty

# shellcheck source=SCRIPTDIR/watchdog-loop.sh
. "$(dirname "$0")/watchdog-loop.sh" || exit 1
watchdog_settings "$@"
: "${RPC_ENDPOINTS:?}" "${INTERVAL:?}" "${RETRANSMISSIONS:?}" "${GRACE:?}" "${SERVER_UNIT:?}" "${NO_DRAIN_FLAG:?}"  # required
read -ra endpoints <<< "$RPC_ENDPOINTS"  # no pathname expansion: "[fd00::1]:50052" is a glob
read -ra remotes <<< "${TUNNEL_REMOTES:-}"

unacknowledged() {  # unacknowledged ENDPOINT: is data to ENDPOINT unacknowledged after RETRANSMISSIONS or more tries?
  # ss -o shows timer:(on,25s,8) while data waits for its acknowledgement (persist: a zero-window probe), the last
  # number being the retransmissions so far; keepalive timers and idle connections do not count.
  local count
  while read -r count; do
    [ "$count" -ge "$RETRANSMISSIONS" ] && return 0
  done < <(ss -Htno state established dst "$1" | sed -nE 's/.*timer:\((on|persist),[^)]*,([0-9]+)\).*/\2/p')
  return 1
}

look() {  # one look at llama-server's connections; restarts it when one of them is lost
  [ "$(systemctl is-active "$SERVER_UNIT")" = active ] || return 0
  local endpoint reason
  for endpoint in "${endpoints[@]}"; do
    reason=
    if [ -n "$(ss -Htn state close-wait dst "$endpoint")" ]; then
      reason="rpc-server at $endpoint closed llama-server's connection (it restarted, or its host went down)"
    elif unacknowledged "$endpoint"; then
      reason="rpc-server at $endpoint stopped acknowledging data (the worker or the network is down)"
    fi
    if [ -n "$reason" ]; then
      restart "$reason"
      return 0
    fi
  done
  for endpoint in "${remotes[@]}"; do
    if unacknowledged "$endpoint"; then
      restart "the tunnel to rpc-server at $endpoint stopped getting data acknowledged (the worker or the network is down)"
      return 0
    fi
  done
}
restart() {  # restart REASON
  echo "$1: restarting $SERVER_UNIT"
  : >"$NO_DRAIN_FLAG"
  systemctl restart --no-block "$SERVER_UNIT"
  sleep "$GRACE"  # let it stop and start before looking again
}

watch look
