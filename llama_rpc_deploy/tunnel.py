"""The RPC tunnel's keys and certificates (rpc_transport = 'tunnel').

rpc-server has no authentication, so a tunnelled worker's rpc-server listens on its loopback only, and
stunnel (Debian's stunnel4) carries the coordinator's connections to it over mutual TLS 1.3: the worker's
stunnel accepts only a client that shows the coordinator's certificate, the coordinator's only a server
that shows that worker's. Both are issued by a small CA of the deploy's own, made on the control machine:

    .state/tunnel/<rpc_tunnel_key_generation>/ca.crt       the CA's certificate (every host gets it)
                                              ca.key       the CA's key (never leaves this machine)
                                              NAME.crt     one host's certificate (NAME: tunnel_name)
                                              NAME.key     its key (only that host gets it)

Every file is mode 600 in a folder of mode 700; a key or certificate anyone else may read is refused
before any host is touched (check_modes). Raising rpc_tunnel_key_generation makes a new CA and new keys
for every host; the next deploy installs them and reloads the tunnels (the connections open stay up).
On a host, the files are TUNNEL_DIR/ca.crt, host.crt and host.key, owned by the service user, mode 400.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
from pathlib import Path

from .roles import TUNNEL_DIR
from .settings import SettingsError

HOST_FILES = ("ca.crt", "host.crt", "host.key")  # in TUNNEL_DIR, from the control machine's CA, cert and key
DNS_SUFFIX = "llama-rpc.invalid"  # certificates name hosts in a domain that resolves nowhere (RFC 6761)
VALID_DAYS = 3650  # rotation is rpc_tunnel_key_generation's job, not the clock's


def tunnel_name(host_name: str) -> str:
    """The name a host's certificate carries and the other end checks (stunnel's checkHost): the inventory
    name as a DNS label, with a short hash so that two names that differ only in punctuation stay apart."""
    label = re.sub(r"[^a-z0-9-]+", "-", host_name.lower()).strip("-")[:40] or "host"
    return f"{label}-{hashlib.sha256(host_name.encode()).hexdigest()[:8]}.{DNS_SUFFIX}"


def folder(state: Path, generation: int) -> Path:
    return state / "tunnel" / str(generation)


def generation(cluster) -> tuple[int, str]:
    """rpc_tunnel_key_generation, and where it was set (for messages about its folder)."""
    value = cluster.settings["rpc_tunnel_key_generation"]
    return value, f"{cluster.coordinator.origins['rpc_tunnel_key_generation']} (rpc_tunnel_key_generation = {value})"


def check_modes(where: Path, origin: str) -> None:
    """Every file of the generation folder readable by its owner only, the folder itself 700: a key someone
    else can read is a key someone else may have. origin names the setting, for the message."""
    if not where.exists():
        return
    for path in [where, *sorted(where.iterdir())]:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            wanted = "700" if path.is_dir() else "600"
            raise SettingsError(
                f"{origin}: {path} has mode {mode:o}: expected {wanted}, readable by you alone "
                f"(chmod {wanted} {path}; or raise rpc_tunnel_key_generation for new keys)"
            )


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def ensure(state: Path, generation: int, host_names: list[str], origin: str) -> Path:
    """The generation folder with the CA and a key and certificate for every host named, made as needed
    (a host new to the cluster gets its own from the same CA). Returns the folder."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    where = folder(state, generation)
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_modes(where, origin)
    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM

    def new_key(path: Path):
        key = ec.generate_private_key(ec.SECP256R1())
        _write(path, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return key

    def certificate(subject: str, key, issuer: str, signer, ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_name = f"llama-rpc-deploy tunnel CA, generation {generation}"
    if not (where / "ca.crt").exists():
        for stale in where.iterdir():  # a CA that never got its certificate: start this generation over
            stale.unlink()
        ca_key = new_key(where / "ca.key")
        _write(where / "ca.crt", certificate(ca_name, ca_key, ca_name, ca_key, ca=True).public_bytes(pem))
    ca_key = serialization.load_pem_private_key((where / "ca.key").read_bytes(), password=None)
    for name in host_names:
        crt, key_path = where / f"{tunnel_name(name)}.crt", where / f"{tunnel_name(name)}.key"
        if crt.exists():
            continue
        key_path.unlink(missing_ok=True)
        key = new_key(key_path)
        _write(crt, certificate(tunnel_name(name), key, ca_name, ca_key, ca=False).public_bytes(pem))
    return where


def host_sources(where: Path, host_name: str) -> dict[str, Path]:
    """The files one host gets: path on the host -> the file here."""
    name = tunnel_name(host_name)
    return {
        f"{TUNNEL_DIR}/ca.crt": where / "ca.crt",
        f"{TUNNEL_DIR}/host.crt": where / f"{name}.crt",
        f"{TUNNEL_DIR}/host.key": where / f"{name}.key",
    }
