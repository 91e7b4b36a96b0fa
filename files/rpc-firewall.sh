#!/bin/sh
# Host firewall for rpc-server on a worker: the TCP ports RPC_PORTS admit only ALLOW_IPV4 and ALLOW_IPV6 from the
# network (this host's own loopback traffic is not filtered: the RPC tunnel's end reaches rpc-server on 127.0.0.1).
# rpc-server is unauthenticated (raw memory operations for whoever connects), so nobody else may reach it.
# Shipped as is by llama-rpc-deploy (files/); run at boot by llama-rpc-firewall.service and again on every
# deploy that changes its settings.
# Only the chain CHAIN and one jump to it per port at the top of INPUT are ours: other rules are left alone.
# The chain is replaced in one iptables-restore transaction, and a port's new jump goes in before any old jump
# of ours goes: no port is ever open in between, also when the ports change (rpc_port, or the tunnel's added).
#
# Settings: the shell assignments in the file LLAMA_RPC_ENV, by default this script's path with .env for .sh
# (/opt/llama-rpc/rpc-firewall.env), written by llama-rpc-deploy:
#   RPC_PORTS   the worker's RPC ports, separated by spaces: the tunnel's and rpc-server's, or rpc-server's alone
#   CHAIN       our iptables chain (LLAMA-RPC)
#   ALLOW_IPV4  IPv4 addresses or networks that may connect, separated by spaces
#   ALLOW_IPV6  the same for IPv6 (may be empty: then nobody over IPv6)
set -eu  # a failed rule stops the script, so its unit fails and rpc-server (which requires it) does not start
set -f   # the source lists are split on spaces below, never expanded as file names
# shellcheck source=/dev/null
. "${LLAMA_RPC_ENV:-${0%.sh}.env}"
: "${RPC_PORTS:?}" "${CHAIN:?}" "${ALLOW_IPV4?}" "${ALLOW_IPV6?}"  # required (the source lists may be empty)

apply() {  # apply IPTABLES ALLOWED-SOURCE...
  ipt=$1; shift
  {
    echo '*filter'
    echo ":$CHAIN - [0:0]"
    for source in "$@"; do echo "-A $CHAIN -s $source -j ACCEPT"; done
    echo "-A $CHAIN -p tcp -j REJECT --reject-with tcp-reset"
    echo 'COMMIT'
  } | "$ipt-restore" --wait --noflush
  for port in $RPC_PORTS; do
    "$ipt" --wait -C INPUT ! -i lo -p tcp --dport "$port" -j "$CHAIN" 2>/dev/null \
      || "$ipt" --wait -I INPUT 1 ! -i lo -p tcp --dport "$port" -j "$CHAIN"
  done
  # then any other jump to our chain goes: one for a port no longer ours, or one of an earlier version that also
  # caught loopback (it would reset the tunnel's own connections to rpc-server)
  "$ipt" --wait -S INPUT | while read -r rule; do
    case "$rule" in "-A INPUT "*" -j $CHAIN") ;; *) continue ;; esac
    keep=
    for port in $RPC_PORTS; do
      case "$rule" in *" ! -i lo "*" --dport $port "*) keep=yes ;; esac
    done
    # shellcheck disable=SC2086  # the rule's words, as iptables -S printed them (no globbing: set -f)
    [ -n "$keep" ] || "$ipt" --wait -D ${rule#-A }
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
ports=
for port in $RPC_PORTS; do ports="${ports:+$ports, }$port"; done
case "$ports" in *,*) label=ports ;; *) label=port ;; esac
echo "$label $ports/tcp: only from $sources"
