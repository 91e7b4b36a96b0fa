#!/bin/bash
# On a worker: the forced command of the coordinator's image-transfer key
# (authorized_keys: restrict,command="THIS"). The coordinator runs
#     docker save ID | zstd | ssh worker "receive ID NAME:TAG"
# The stream is loaded, the image with exactly that ID must then exist, and only
# then does it get its tag: an interrupted or different stream never gets the tag.
set -euo pipefail
read -r verb id tag extra <<<"${SSH_ORIGINAL_COMMAND:-}"
if [[ $verb != receive || ! $id =~ ^sha256:[0-9a-f]{64}$ || ! $tag =~ ^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_.-]+$ || -n ${extra:-} ]]; then
  echo "receive-image: usage: receive sha256:ID NAME:TAG (got: ${SSH_ORIGINAL_COMMAND:-nothing})" >&2
  exit 64
fi
if ! out=$(zstd -dc | docker load 2>&1); then
  echo "receive-image: docker load failed, nothing tagged: $out" >&2
  exit 1
fi
if ! docker image inspect "$id" >/dev/null 2>&1; then
  echo "receive-image: the stream did not contain image $id, nothing tagged ($out)" >&2
  exit 1
fi
docker tag "$id" "$tag"
echo "receive-image: $tag is $id"
