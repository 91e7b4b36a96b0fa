#!/bin/bash
# Before llama-server starts: wait until every worker's rpc-server answers, at most RPC_WAIT_TIMEOUT s in all,
# and refuse to start when one speaks another RPC protocol version than this image's llama-server
# (a mismatched pair crashes or hangs instead of saying so).
# Shipped as is by llama-rpc-deploy (files/); run as llama-server.service's ExecStartPre.
#
# Settings: the shell assignments in the file LLAMA_RPC_ENV, by default this script's path with .env for .sh
# (/opt/llama-rpc/wait-for-workers.env), written by llama-rpc-deploy:
#   RPC_ENDPOINTS     the workers' rpc-servers, HOST:PORT, separated by spaces
#   RPC_REMOTES       for each endpoint, in the same order: where its tunnel leads (HOST:PORT of the worker's
#                     TLS end), or - for an rpc-server reached directly. A tunnel's end on this host accepts
#                     at once and closes while its worker is away: for it, no answer to HELLO means "not yet".
#                     (Optional: all direct when unset.)
#   RPC_WAIT_TIMEOUT  seconds to wait for all of them together
#   IMAGE             this llama-server's image: `docker run IMAGE rpc-protocol` prints its RPC protocol version
#   RETRY_DELAY       seconds between two tries (default 1)
set -u  # a setting missing from the env file stops the script instead of reading as empty
# shellcheck source=/dev/null
. "${LLAMA_RPC_ENV:-${0%.sh}.env}" || exit 1
: "${RPC_ENDPOINTS:?}" "${RPC_WAIT_TIMEOUT:?}" "${IMAGE:?}"  # required; ${X:?} names the one missing
RETRY_DELAY=${RETRY_DELAY:-1}
read -ra endpoints <<< "$RPC_ENDPOINTS"  # no pathname expansion: "[fd00::1]:50052" is a glob
read -ra remotes <<< "${RPC_REMOTES:-}"

deadline=$((SECONDS + RPC_WAIT_TIMEOUT))
want=$(docker run --rm --network none "$IMAGE" rpc-protocol) || exit 1

hello() {  # hello HOST PORT: the version rpc-server reports in the RPC HELLO handshake (MAJOR.MINOR.PATCH)
  exec 3<>"/dev/tcp/$1/$2" || return 1
  # RPC_CMD_HELLO (14), its input size (24, uint64 little-endian), 24 bytes of capabilities: none
  { printf '\016\030\0\0\0\0\0\0\0'; head -c 24 /dev/zero; } >&3
  # reply: uint64 size, then major, minor, patch
  timeout 10 head -c 11 <&3 | od -An -tu1 -j8 | awk 'NF == 3 { print $1 "." $2 "." $3 }'
  exec 3<&-
}

for i in "${!endpoints[@]}"; do
  endpoint=${endpoints[i]} remote=${remotes[i]:--}
  host=${endpoint%:*} port=${endpoint##*:}
  if [ "$remote" = - ]; then
    until timeout 2 bash -c ">/dev/tcp/$host/$port" 2>/dev/null; do
      if (( SECONDS >= deadline )); then
        echo "rpc-server at $endpoint did not answer within $RPC_WAIT_TIMEOUT s: is rpc-server.service running on that worker?" >&2
        exit 1
      fi
      sleep "$RETRY_DELAY"
    done
    for _ in 1 2 3; do  # an rpc-server that is just (re)starting may refuse a moment
      have=$(hello "$host" "$port") && [ -n "$have" ] && break
      sleep "$RETRY_DELAY"
    done
  else
    until have=$(hello "$host" "$port" 2>/dev/null) && [ -n "$have" ]; do
      if (( SECONDS >= deadline )); then
        echo "rpc-server at $endpoint (the tunnel to $remote) did not answer within $RPC_WAIT_TIMEOUT s: is" \
             "rpc-server.service running on that worker, and llama-rpc-tunnel.service on both ends?" >&2
        exit 1
      fi
      sleep "$RETRY_DELAY"
    done
  fi
  if [ "$have" != "$want" ]; then
    echo "rpc-server at $endpoint speaks RPC protocol ${have:-(no answer to HELLO: an older llama.cpp?)}, this llama-server $want:" \
         "every host must run this deploy's images, built from one llama.cpp commit (this one's: $IMAGE): deploy again" >&2
    exit 1
  fi
  echo "rpc-server at $endpoint answers, RPC protocol $have"
done
