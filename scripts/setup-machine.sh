#!/usr/bin/env bash
# Make this (Debian/Ubuntu) control machine ready: Docker Engine running, debootstrap for the lab's
# base image, ssh-keygen, HAProxy and socat for the front's tests, and the Python packages. Safe to run
# again; it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v curl >/dev/null || need+=(curl)
command -v shellcheck >/dev/null || need+=(shellcheck)  # the unit tests check every rendered script
command -v gpg >/dev/null || need+=(gpg)  # tests/unit/test_prepare.py runs the NVIDIA key check with keys made here
[ -x /usr/sbin/haproxy ] || need+=(haproxy)  # tests/front run the front (HAProxy) as the coordinator does
command -v socat >/dev/null || need+=(socat)  # ... and reach its admin socket as front-drain.sh does
command -v stunnel4 >/dev/null || need+=(stunnel4)  # tests/unit/test_tunnel.py runs the RPC tunnel as the hosts do
command -v npm >/dev/null || need+=(nodejs npm)  # builds llama-server's chat page once (llama_rpc_deploy/webui.py)
command -v chromium >/dev/null || need+=(chromium)  # the chat page test runs a real browser, headless
command -v chromedriver >/dev/null || need+=(chromium-driver)
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# a dockerd that is still starting or stopping is waited for, not raced
for _ in $(seq 90); do
  docker info >/dev/null 2>&1 || pgrep -x dockerd >/dev/null || break
  docker info >/dev/null 2>&1 && break
  sleep 1
done
if ! docker info >/dev/null 2>&1; then
  if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
    systemctl start docker
  else
    echo "setup: starting dockerd (no systemd here), log in /var/log/dockerd.log"
    setsid dockerd >/var/log/dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start, see /var/log/dockerd.log" >&2; exit 1; }
fi

python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "Running pip as the 'root' user" || true
python3 -c "import pyinfra, testinfra, gguf, jinja2" || { echo "setup: Python packages missing" >&2; exit 1; }
echo "setup: ready (docker $(docker version --format '{{.Server.Version}}'), pyinfra $(python3 -c 'import importlib.metadata as m; print(m.version("pyinfra"))'))"
