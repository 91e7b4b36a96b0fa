#!/bin/bash
# A worker's sleep: the one command the coordinator's sleep key may run here (authorized_keys:
# restrict,command="THIS"). llama-sleep.py on the coordinator runs it once the cluster has been idle for
# sleep_idle_seconds, after llama-server stopped; the worker then sleeps 2 s later, once this SSH session
# has closed, and wakes on a magic packet (Wake-on-LAN), rpc-server still running or started at boot.
# Shipped as is by llama-rpc-deploy (files/).
#
# Settings: the shell assignments in sleep-now.env beside this script (or the file LLAMA_RPC_ENV):
#   SLEEP_COMMAND  the shell line that puts this host to sleep (systemctl suspend, hibernate or poweroff:
#                  sleep_mode; or sleep_command's)
set -u
# shellcheck source=/dev/null
. "${LLAMA_RPC_ENV:-${0%.sh}.env}" || exit 1
: "${SLEEP_COMMAND:?}"
systemd-run --quiet --collect --on-active=2 --timer-property=AccuracySec=100ms /bin/sh -c "$SLEEP_COMMAND" || exit 1
echo "$(hostname) sleeps in 2 s: $SLEEP_COMMAND"
