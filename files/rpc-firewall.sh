#!/bin/sh
# Host firewall for rpc-server on a worker: TCP port RPC_PORT admits only ALLOW_IPV4 and ALLOW_IPV6.
# rpc-server is unauthenticated (raw memory operations for whoever connects), so nobody else may reach it.
# Shipped as is by llama-rpc-deploy (files/); run at boot by llama-rpc-firewall.service and again on every
# deploy that changes its settings.
# Only the chain CHAIN and one jump to it at the top of INPUT are ours: other rules are left alone.
# The chain is replaced in one iptables-restore transaction, so the port is never open in between.
#
# Settings: the shell assignments in the file LLAMA_RPC_ENV, by default this script's path with .env for .sh
# (/opt/llama-rpc/rpc-firewall.env), written by llama-rpc-deploy:
#   RPC_PORT    rpc-server's TCP port
#   CHAIN       our iptables chain (LLAMA-RPC)
#   ALLOW_IPV4  IPv4 addresses or networks that may connect, separated by spaces
#   ALLOW_IPV6  the same for IPv6 (may be empty: then nobody over IPv6)
set -eu  # a failed rule stops the script, so its unit fails and rpc-server (which requires it) does not start
set -f   # the source lists are split on spaces below, never expanded as file names
# shellcheck source=/dev/null
. "${LLAMA_RPC_ENV:-${0%.sh}.env}"
: "${RPC_PORT:?}" "${CHAIN:?}" "${ALLOW_IPV4?}" "${ALLOW_IPV6?}"  # required (the source lists may be empty)

apply() {  # apply IPTABLES ALLOWED-SOURCE...
  ipt=$1; shift
  {
    echo '*filter'
    echo ":$CHAIN - [0:0]"
    for source in "$@"; do echo "-A $CHAIN -s $source -j ACCEPT"; done
    echo "-A $CHAIN -p tcp -j REJECT --reject-with tcp-reset"
    echo 'COMMIT'
  } | "$ipt-restore" --wait --noflush
  "$ipt" --wait -C INPUT -p tcp --dport "$RPC_PORT" -j "$CHAIN" 2>/dev/null \
    || "$ipt" --wait -I INPUT 1 -p tcp --dport "$RPC_PORT" -j "$CHAIN"
  # a jump to our chain for another port goes, once the new one is in (the port changed: rpc_port, or the
  # tunnel's port once rpc-server moved to loopback, where a stale jump would reset the tunnel's own connections)
  "$ipt" --wait -S INPUT | while read -r rule; do
    # shellcheck disable=SC2086  # the rule's words, as iptables -S printed them (no globbing: set -f)
    case "$rule" in
      *" --dport $RPC_PORT "*) ;;
      "-A INPUT "*" -j $CHAIN") "$ipt" --wait -D ${rule#-A } ;;
    esac
  done
}

# shellcheck disable=SC2086  # one argument per source: split on spaces on purpose
apply iptables $ALLOW_IPV4
if command -v ip6tables >/dev/null; then
  # shellcheck disable=SC2086
  apply ip6tables $ALLOW_IPV6
fi

sources=
for source in $ALLOW_IPV4 $ALLOW_IPV6; do sources="${sources:+$sources, }$source"; done
echo "port $RPC_PORT/tcp: only from $sources"
