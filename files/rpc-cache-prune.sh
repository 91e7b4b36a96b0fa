#!/bin/bash
# Keeps rpc-server's tensor cache under a size limit. Shipped as is by llama-rpc-deploy (files/); run by
# rpc-cache-prune.timer every 30 s, and by the deploy.
#
# rpc-server --cache writes one file per weight tensor it receives (those over 10 MiB), named by the
# tensor's hash, and never removes one (llama.cpp issue #26143 reports 400 GB for one large model).
# This removes the least recently used files first (the later of last access and last change: under
# relatime the access time moves at most once a day, so a file read twice today counts from its first
# read) until the cache fits, and never a file that a process holds open (rpc-server writing or
# reading it) nor one changed in the last MIN_AGE seconds (a file being written).
#
# Settings: the shell assignments in the file LLAMA_RPC_ENV, by default this script's path with .env
# for .sh (/opt/llama-rpc/rpc-cache-prune.env), written by llama-rpc-deploy:
#   CACHE_DIR  the folder of the cache files (rpc_cache_dir/rpc on the host)
#   MAX_BYTES  the limit (rpc_cache_max_gib)
#   MIN_AGE    seconds a file must be left alone after its last change
# Prints one line: the cache's size after, and what it removed.
#
# It runs as the service user (the unit's User=), inside the folder (cd once: a folder swapped for a
# link afterwards changes nothing), and removes only names rpc-server writes (16 hex digits).
set -euo pipefail

# shellcheck source=/dev/null
. "${LLAMA_RPC_ENV:-${0%.sh}.env}"
: "${CACHE_DIR:?}" "${MAX_BYTES:?}" "${MIN_AGE:?}"
if [ ! -d "$CACHE_DIR" ]; then
  echo "tensor cache: 0 bytes in 0 files (no $CACHE_DIR yet), limit $MAX_BYTES"
  exit 0
fi
cd -P -- "$CACHE_DIR"

# the files some process holds open, by name: rpc-server sees the cache at its own path in its container
declare -A busy=()
while IFS= read -r target; do
  busy["${target##*/}"]=1
done < <(find /proc/[0-9]*/fd -lname "*/rpc/*" -printf '%l\n' 2>/dev/null || true)

now=$(date +%s)
total=0
count=0
entries=()
# "last use, last change, size, name" per file, least recently used first (names are hashes: no spaces)
while read -r used changed size name; do
  entries+=("$used $changed $size $name")
  total=$((total + size))
  count=$((count + 1))
done < <(find . -maxdepth 1 -type f -regextype posix-extended -regex '\./[0-9a-f]{16}' -printf '%A@ %T@ %s %f\n' |
         awk '{ printf "%.0f %.0f %.0f %s\n", ($1 > $2 ? $1 : $2), $2, $3, $4 }' | sort -n -k1,1)

removed=0
freed=0
for entry in "${entries[@]}"; do
  [ "$total" -gt "$MAX_BYTES" ] || break
  read -r _ changed size name <<< "$entry"
  [ -z "${busy[$name]:-}" ] || continue
  [ $((now - changed)) -ge "$MIN_AGE" ] || continue
  rm -f -- "./$name"
  total=$((total - size))
  freed=$((freed + size))
  removed=$((removed + 1))
done
echo "tensor cache: $total bytes in $((count - removed)) files, limit $MAX_BYTES; removed $removed files ($freed bytes)"
