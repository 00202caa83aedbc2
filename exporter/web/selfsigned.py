"""A TLS certificate made at start-up, for `--web.auth=kubernetes` without a configured one.

Bearer tokens must not cross the node network in clear, and a DaemonSet should not need a
Secret minted per cluster before its pods can start: so when no `tls_server_config` is given
the exporter makes its own key (ECDSA P-256) and a self-signed certificate whose SANs are the
node name, `localhost` and the loopback addresses, and the names and addresses
`--web.tls.extra-san` adds: not every address of the host (storage, management, VPN networks),
which anyone who connects would read. Prometheus does not verify this certificate (below), so
it needs no SAN for the address it scrapes. The key never touches a filesystem: it is handed
to OpenSSL through a memfd (an anonymous in-memory file), and lives as long as the process. A
new key every start.
The key and certificate are made in a short-lived child process (`python -m
exporter.web.selfsigned`, answering on a pipe): the cryptography library it takes (~10 MiB of
RSS, its Rust core) is needed once, so it never enters the long-running exporter's memory.
A scraper cannot verify a self-signed certificate, so the ServiceMonitor skips verification;
docs/security.md says what that allows and how to use a certificate from a Secret or
cert-manager instead.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

_DNS_NAME = re.compile(r"(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_SANS = 64  # a host with many addresses still gets a certificate of a few KiB
VALID_DAYS = 365  # restarted long before: a new certificate every start
CHILD_TIMEOUT = 60.0  # seconds; the child takes ~0.3 s on an idle node


LOOPBACK = ("127.0.0.1", "::1")


def split_sans(values: tuple[str, ...] | list[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of `--web.tls.extra-san` values; ValueError naming the bad
    one (the runner exits 2)."""
    names, addresses = [], []
    for value in values:
        value = value.strip()
        try:
            addresses.append(str(ipaddress.ip_address(value)))
            continue
        except ValueError:
            pass
        if not _DNS_NAME.fullmatch(value) or len(value) > 253:
            raise ValueError(f"--web.tls.extra-san {value!r}: accepted values are a DNS name "
                             "(node-1.example.com, *.example.com) or an IP address")
        names.append(value.lower())
    return names, addresses


def certificate(names: list[str], addresses: list[str]) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM): self-signed, for `names` (DNS) and `addresses` (IP)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(names) if n]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(addresses)]
    sans = sans[:MAX_SANS]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64]),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "node-resize-exporter")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # a node clock a bit behind
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                         content_commitment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def certificate_in_child(names: list[str], addresses: list[str]) -> tuple[bytes, bytes]:
    """certificate(names, addresses) made by a child process; the two PEMs come back on its
    stdout (a pipe). ValueError saying why when it cannot."""
    request = json.dumps({"names": names, "addresses": addresses}).encode()
    try:
        done = subprocess.run([sys.executable, "-m", "exporter.web.selfsigned"], input=request,
                              capture_output=True, timeout=CHILD_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"--web.auth=kubernetes: cannot make the TLS certificate: {e}") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise ValueError(f"--web.auth=kubernetes: cannot make the TLS certificate (exit "
                         f"{done.returncode}: {why[0]}); or give one in --web.config.file "
                         "(tls_server_config)")
    answer = json.loads(done.stdout)
    return answer["certificate"].encode(), answer["key"].encode()


def _child() -> None:
    request = json.loads(sys.stdin.buffer.read())
    cert_pem, key_pem = certificate(request["names"], request["addresses"])
    sys.stdout.write(json.dumps({"certificate": cert_pem.decode(), "key": key_pem.decode()}))


def load_into(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """ctx.load_cert_chain from memory. OpenSSL reads files only: a memfd gives it one that no
    other process can open by name; where memfd or /proc is missing, a private temporary
    directory, removed at once."""
    try:
        fd = os.memfd_create("nre-tls", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            os.write(fd, cert_pem + key_pem)
            path = f"/proc/self/fd/{fd}"
            if os.path.exists(path):
                ctx.load_cert_chain(path)
                return
        finally:
            os.close(fd)
    directory = tempfile.mkdtemp(prefix="nre-tls-")  # 0700
    try:
        pem = Path(directory, "tls.pem")
        pem.write_bytes(cert_pem + key_pem)
        ctx.load_cert_chain(pem)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def self_signed_context(node_name: str, extra_sans: tuple[str, ...] = ()
                        ) -> tuple[ssl.SSLContext, bytes]:
    """A server context (TLS 1.2+, the web config's default suites) with a fresh self-signed
    certificate for this node (its name, localhost, loopback and `extra_sans`); also returns
    the certificate (PEM) for the log and tests. ValueError for a bad extra SAN."""
    from exporter.web.config import DEFAULT_TLS12_SUITES, TLS12_SUITES
    names, addresses = split_sans(extra_sans)
    cert_pem, key_pem = certificate_in_child([node_name, "localhost", *names],
                                             [*LOOPBACK, *addresses])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(":".join(TLS12_SUITES[n] for n in DEFAULT_TLS12_SUITES))
    ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    load_into(ctx, cert_pem, key_pem)
    return ctx, cert_pem


if __name__ == "__main__":
    _child()
