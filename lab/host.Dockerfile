# A lab "host": behaves like a real machine for the deploy.
# systemd is PID 1, sshd listens on 22, and the host runs its own dockerd
# (with /var/lib/docker on a Docker volume so it can use overlay2).
# Built FROM the debootstrap base image that `lab up` imports (no registry here).
ARG BASE_IMAGE=llama-rpc-lab/debian:bookworm
FROM ${BASE_IMAGE}

ENV container=docker DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      systemd systemd-sysv dbus openssh-server docker.io iptables iproute2 \
      ca-certificates curl zstd procps netcat-openbsd python3 ethtool \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 # every lab host gets its own SSH host keys at first boot, not the image's
 && rm -f /etc/ssh/ssh_host_* \
 && mkdir -p /etc/systemd/system/ssh.service.d /root/.ssh && chmod 700 /root/.ssh \
 && printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
      > /etc/systemd/system/ssh.service.d/hostkeys.conf \
 && printf 'PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n' \
      > /etc/ssh/sshd_config.d/lab.conf \
 # units that make no sense in a container
 && systemctl mask systemd-udevd.service systemd-udevd-kernel.socket systemd-udevd-control.socket \
      getty.target console-getty.service systemd-logind.service systemd-firstboot.service \
 && systemctl enable ssh.service docker.service \
 # With cgroup v1, the host's own containers in the host's cgroups (under its dockerd's), not beside the host at
 # the top of this machine's tree: then `lab pin`, which confines a lab host to one core, confines what the deploy
 # runs in it too, as a real machine's cores confine its containers (with --cgroupns=host they escaped it). Not
 # with cgroup v2, where dockerd 20.10 uses systemd's driver, which takes only a slice as cgroup-parent.
 && mkdir -p /etc/docker /etc/systemd/system/docker.service.d \
 && printf '{"cgroup-parent": "lab-nested"}\n' > /etc/docker/lab-cgroup-v1.json \
 && printf '[Service]\nExecStartPre=/bin/sh -c %s\n' \
      "'if [ -e /sys/fs/cgroup/cgroup.controllers ]; then rm -f /etc/docker/daemon.json; else cp /etc/docker/lab-cgroup-v1.json /etc/docker/daemon.json; fi'" \
      > /etc/systemd/system/docker.service.d/lab-cgroup.conf

STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
