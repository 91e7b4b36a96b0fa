# A bare lab "host" (tests/e2e/test_lab_bare.py): systemd as PID 1 and sshd, nothing else the deploy needs
# (no Docker, no zstd, no iptables, no python3, no curl): the deploy's prepare phase installs them.
# Built FROM one of the debootstrap base images `lab up` imports (Debian 12 or 13, minbase).
ARG BASE_IMAGE=llama-rpc-lab/debian:bookworm
FROM ${BASE_IMAGE}

ENV container=docker DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends systemd systemd-sysv dbus openssh-server \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/ssh/ssh_host_* \
 && mkdir -p /etc/systemd/system/ssh.service.d /root/.ssh && chmod 700 /root/.ssh \
 && printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
      > /etc/systemd/system/ssh.service.d/hostkeys.conf \
 && printf 'PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n' \
      > /etc/ssh/sshd_config.d/lab.conf \
 && systemctl mask systemd-udevd.service systemd-udevd-kernel.socket systemd-udevd-control.socket \
      getty.target console-getty.service systemd-logind.service systemd-firstboot.service \
 && systemctl enable ssh.service

# The lab's stand-in for a registry (there is none here): when the deploy's Docker starts for the first time, it
# loads the images the lab left in /var/cache/lab-images (the base images, as a registry would serve them).
COPY bare-load-images.sh /usr/local/sbin/lab-load-images
RUN mkdir -p /etc/systemd/system/docker.service.d /var/cache/lab-images \
 && printf '[Service]\nExecStartPost=/usr/local/sbin/lab-load-images\n' > /etc/systemd/system/docker.service.d/lab-images.conf

STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
