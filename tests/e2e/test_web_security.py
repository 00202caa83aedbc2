"""--web.config.file: TLS, client certificates and basic auth, against a real `run`.

Certificates are made here with `cryptography` (a CA, a server certificate for 127.0.0.1, a good
client certificate, an expired one, one from a CA the exporter does not trust); the clients are
the standard library's ssl and http.client, as a Prometheus scraper would be.
"""
from __future__ import annotations

import base64
import datetime as dt
import http.client
import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from exporter.web.auth import AuthBusy, BasicAuth
from exporter.web.config import DEFAULT_TLS12_SUITES, load_web_config
from testkit.exporter_proc import REPO, RunningExporter, Scrape

QUICK = ("--source", "uevent", "--kubernetes", "off")  # no BPF compile: these tests are about HTTP
PASSWORD = "correct horse battery staple"


# ------------------------------------------------------------------ certificates


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject_cn: str, key, issuer_cn: str, issuer_key, *, ca: bool = False,
          days: tuple[int, int] = (-1, 30), san_ip: str | None = None,
          san_dns: str | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now + dt.timedelta(days=days[0]))
               .not_valid_after(now + dt.timedelta(days=days[1]))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    sans: list[x509.GeneralName] = []
    if san_ip:
        sans.append(x509.IPAddress(ipaddress.ip_address(san_ip)))
    if san_dns:
        sans.append(x509.DNSName(san_dns))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    def __init__(self, folder: Path):
        self.dir = folder
        ca_key, other_ca_key = _key(), _key()
        self.ca = self._write("ca", _cert("test CA", ca_key, "test CA", ca_key, ca=True), ca_key)
        self._write("other-ca", _cert("other CA", other_ca_key, "other CA", other_ca_key,
                                      ca=True), other_ca_key)
        k = _key()
        self._write("server", _cert("exporter", k, "test CA", ca_key, san_ip="127.0.0.1"), k)
        k = _key()
        self._write("client", _cert("prometheus", k, "test CA", ca_key,
                                    san_dns="prometheus.test"), k)
        k = _key()
        self._write("client-other-san", _cert("intruder", k, "test CA", ca_key,
                                              san_dns="intruder.test"), k)
        k = _key()
        self._write("expired", _cert("prometheus", k, "test CA", ca_key, days=(-30, -1),
                                     san_dns="prometheus.test"), k)
        k = _key()
        self._write("stranger", _cert("prometheus", k, "other CA", other_ca_key,
                                      san_dns="prometheus.test"), k)

    def _write(self, name: str, cert: x509.Certificate, key) -> Path:
        (self.dir / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (self.dir / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        return self.dir / f"{name}.crt"

    def client_context(self, cert: str | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        if cert:
            ctx.load_cert_chain(self.dir / f"{cert}.crt", self.dir / f"{cert}.key")
        return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


# ------------------------------------------------------------------ clients


def https_get(port: int, path: str, ctx: ssl.SSLContext, auth: tuple[str, str] | None = None):
    """(status, headers, body) or the exception the TLS layer raised."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    except (ssl.SSLError, ConnectionError, OSError) as e:
        return e
    finally:
        conn.close()


class WebExporter(RunningExporter):
    """A RunningExporter that waits for readiness over TLS (and with the client's certificate)."""

    def __init__(self, config: Path, ready_ctx: ssl.SSLContext | None, *args: str):
        super().__init__(*QUICK, "--web.config.file", str(config), *args)
        self.ready_ctx = ready_ctx

    def ready(self) -> bool:
        got = https_get(self.port, "/healthz", self.ready_ctx)
        return isinstance(got, tuple) and got[0] == 200


def write_config(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ client certificates


@pytest.fixture(scope="module")
def mtls_exporter(pki):
    # Relative paths: exporter-toolkit resolves them against the config file's folder.
    config = write_config(pki.dir, "mtls.yml", """\
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus.test]
""")
    with WebExporter(config, pki.client_context("client")) as exp:
        yield exp


def test_good_client_certificate_gets_metrics(pki, mtls_exporter):
    status, _, body = https_get(mtls_exporter.port, "/metrics", pki.client_context("client"))
    assert status == 200
    scrape = Scrape(body.decode())
    assert scrape.total("node_resize_exporter_build_info", version=_version()) == 1.0
    assert "serving https://127.0.0.1" in mtls_exporter.logs()


@pytest.mark.parametrize("cert,reason", [
    (None, "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
    ("expired", "certificate has expired"),
    ("stranger", "unable to get local issuer certificate"),
], ids=["no-certificate", "expired", "untrusted-ca"])
def test_bad_client_certificate_is_refused(pki, mtls_exporter, cert, reason):
    seen = len(mtls_exporter.logs())
    got = https_get(mtls_exporter.port, "/metrics", pki.client_context(cert))
    # TLS 1.3 clients learn of the refusal at their first read: an alert, or an EOF/reset when
    # the server closed before the alert was read. Which one is a race, so the reason is taken
    # from the server's log instead.
    assert isinstance(got, (ssl.SSLError, ConnectionError)), got
    wait_for_log(mtls_exporter, seen, "TLS handshake with 127.0.0.1 failed")
    assert reason in mtls_exporter.logs()[seen:], mtls_exporter.logs()[seen:]
    # ... and the server is still fine for the next, good client.
    assert https_get(mtls_exporter.port, "/healthz", pki.client_context("client"))[0] == 200


def wait_for_log(exp: RunningExporter, offset: int, text: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in exp.logs()[offset:]:
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{exp.logs()[offset:]}"
        time.sleep(0.05)


def test_client_certificate_outside_allowed_sans_gets_nothing(pki, mtls_exporter):
    seen = len(mtls_exporter.logs())
    got = https_get(mtls_exporter.port, "/metrics", pki.client_context("client-other-san"))
    assert isinstance(got, (ConnectionError, http.client.HTTPException, ssl.SSLError)), got
    wait_for_log(mtls_exporter, seen, "no SAN in client_allowed_sans")


def test_client_must_verify_the_server(pki, mtls_exporter):
    # The server's certificate is for 127.0.0.1, signed by the test CA: a client trusting only
    # the system CAs must refuse it (proves the client tests above really verify).
    ctx = ssl.create_default_context()
    ctx.load_cert_chain(pki.dir / "client.crt", pki.dir / "client.key")
    got = https_get(mtls_exporter.port, "/healthz", ctx)
    assert isinstance(got, ssl.SSLCertVerificationError), got


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_below_1_2_is_refused(pki, mtls_exporter, tmp_path):
    def tls11_client() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 would not offer TLS 1.1 otherwise
        return ctx

    # Control: this client really speaks TLS 1.1 to a server that allows it ...
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki.dir / "server.crt", pki.dir / "server.key")
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_1
    server_ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        versions = []

        def accept_one():
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    versions.append(tls.version())
            except OSError:
                pass

        t = threading.Thread(target=accept_one)
        t.start()
        with tls11_client().wrap_socket(socket.create_connection(listener.getsockname())) as c:
            assert c.version() == "TLSv1.1"
        t.join(10)
    # ... and the exporter answers it with a protocol_version alert.
    with pytest.raises(ssl.SSLError) as refused:
        with tls11_client().wrap_socket(socket.create_connection(("127.0.0.1",
                                                                   mtls_exporter.port))):
            pass
    assert "PROTOCOL_VERSION" in str(refused.value).upper() \
        or "UNSUPPORTED_PROTOCOL" in str(refused.value).upper(), refused.value


# ------------------------------------------------------------------ basic auth


@pytest.fixture(scope="module")
def auth_exporter(pki):
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=6)).decode()
    config = write_config(pki.dir, "auth.yml", f"""\
tls_server_config:
  cert_file: {pki.dir / 'server.crt'}
  key_file: {pki.dir / 'server.key'}
  min_version: TLS12
http_server_config:
  headers:
    Strict-Transport-Security: max-age=31536000
basic_auth_users:
  prometheus: '{hashed}'
""")
    with WebExporter(config, pki.client_context()) as exp:
        yield exp


def test_right_password_gets_metrics(pki, auth_exporter):
    status, headers, body = https_get(auth_exporter.port, "/metrics", pki.client_context(),
                                      ("prometheus", PASSWORD))
    assert status == 200
    assert b"node_resize_kernel_cpus" in body
    assert headers["Strict-Transport-Security"] == "max-age=31536000"


@pytest.mark.parametrize("auth", [("prometheus", "wrong"), ("nobody", PASSWORD), None,
                                  ("prometheus", PASSWORD + "x" * 80)],
                         ids=["wrong-password", "unknown-user", "no-credentials", "too-long"])
def test_wrong_credentials_get_401(pki, auth_exporter, auth):
    status, headers, body = https_get(auth_exporter.port, "/metrics", pki.client_context(),
                                      auth)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic realm=")
    assert b"node_" not in body


def test_garbage_authorization_header_gets_401(pki, auth_exporter):
    for value in ("Basic !!!not-base64", "Basic " + base64.b64encode(b"no-colon").decode(),
                  "Bearer abc", "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode()):
        conn = http.client.HTTPSConnection("127.0.0.1", auth_exporter.port,
                                           context=pki.client_context(), timeout=10)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": value})
            assert conn.getresponse().status == 401, value
        finally:
            conn.close()


def test_healthz_needs_no_password(pki, auth_exporter):
    assert https_get(auth_exporter.port, "/healthz", pki.client_context())[0] == 200


def test_plain_http_on_a_tls_port_gets_400_as_from_go(auth_exporter):
    """Go's net/http answer, word for word (curl then says what is wrong, not "empty reply"),
    and nothing after it: the connection is closed."""
    with socket.create_connection(("127.0.0.1", auth_exporter.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer == (b"HTTP/1.0 400 Bad Request\r\n\r\n"
                      b"Client sent an HTTP request to an HTTPS server.\n")


def test_the_status_line_carries_its_reason_phrase(pki, auth_exporter):
    """HTTP/1.1 200 OK, 401 Unauthorized: the phrase each code has (RFC 9110), not empty."""
    for path, auth, line in [("/healthz", None, b"HTTP/1.1 200 OK\r\n"),
                             ("/metrics", None, b"HTTP/1.1 401 Unauthorized\r\n")]:
        ctx = pki.client_context()
        with socket.create_connection(("127.0.0.1", auth_exporter.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                         .encode())
            head = sock.recv(4096)
        assert head.startswith(line), head[:80]


# ------------------------------------------------------------------ default and bad files


def test_default_is_plain_http_without_auth():
    with RunningExporter(*QUICK) as exp:
        assert exp.scrape().value("node_resize_exporter_episodes_open") is not None
        assert "serving http://127.0.0.1" in exp.logs()


@pytest.mark.parametrize("body,words", [
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
     "  min_version: TLS11\n", ["tls_server_config.min_version", "TLS11 is refused"]),
    ("tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n",
     ["tls_server_config.cert_file", "missing.crt"]),
    ("basic_auth_users:\n  prometheus: hunter2\n", ["basic_auth_users.prometheus",
                                                   "bcrypt hash"]),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
     "  client_auth_type: RequireAndVerifyClientCert\n", ["client_ca_file", "missing"]),
    ("tls_server_confg: {}\n", ["unknown key tls_server_confg"]),
    ("- a list\n", ["must be a mapping"]),
    ("tls_server_config: [\n", ["not valid YAML"]),
    # These passed the check, then printed a traceback on every request
    ("basic_auth_users:\n  prometheus: '$2b$99$" + "a" * 53 + "'\n",
     ["basic_auth_users.prometheus", "cost 99 is outside 4..31"]),
    ("basic_auth_users:\n  prometheus: '$2b$03$" + "a" * 53 + "'\n",
     ["basic_auth_users.prometheus", "cost 03 is outside 4..31"]),
    ("basic_auth_users:\n  prometheus: '$2b$10$" + "a" * 53 + "'\n",
     ["basic_auth_users.prometheus", "malformed bcrypt salt"]),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
     "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
     ["tls_server_config.cipher_suites", "unknown cipher TLS_RSA_WITH_RC4_128_SHA"]),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
     "  curve_preferences: [CurveP999]\n",
     ["tls_server_config.curve_preferences", "unknown curve CurveP999"]),
])
def test_bad_web_config_exits_2_naming_the_key(pki, tmp_path, body, words):
    # The server certificate sits next to the config so relative names resolve.
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((pki.dir / name).read_bytes())
    config = write_config(tmp_path, "web.yml", body)
    r = subprocess.run([sys.executable, "-m", "exporter", "run",
                        "--web.listen-address", "127.0.0.1:1",
                        "--no-journal", *QUICK, "--web.config.file", str(config)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_empty_file_means_plain_http(tmp_path):
    config = load_web_config(str(write_config(tmp_path, "web.yml", "")))
    assert config.ssl_context is None and config.users == {} and config.scheme == "http"


def test_min_version_is_tls12_by_default(pki):
    config = load_web_config(str(write_config(
        pki.dir, "default.yml",
        "tls_server_config: {cert_file: server.crt, key_file: server.key}")))
    assert config.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "cert-fifo"])
def test_a_web_config_that_is_not_a_small_regular_file_exits_2(pki, tmp_path, kind):
    """A FIFO hung start-up; /dev/zero reached 1.17 GiB RSS in a second."""
    import os
    config = tmp_path / "web.yml"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    elif kind == "huge":
        config.write_text("# padding\n" * 300_000)  # 3 MB of valid YAML
    else:
        os.mkfifo(tmp_path / "server.crt")
        (tmp_path / "server.key").write_bytes((pki.dir / "server.key").read_bytes())
        config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    r = subprocess.run([sys.executable, "-m", "exporter", "run",
                        "--web.listen-address", "127.0.0.1:1",
                        "--no-journal", *QUICK, "--web.config.file", str(config)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert ("not a regular file" if kind != "huge" else "more than") in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ TLS 1.2 cipher suites


def _tls12_suites_accepted(server_ctx: ssl.SSLContext) -> set[str]:
    """Every TLS 1.2 suite OpenSSL knows, offered alone by a client: those the server takes."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.set_ciphers("ALL:@SECLEVEL=0")
    names = {c["name"] for c in probe.get_ciphers() if c["protocol"] in ("TLSv1.2", "TLSv1.0",
                                                                           "SSLv3")}
    accepted = set()
    for name in sorted(names):
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
        client.minimum_version = client.maximum_version = ssl.TLSVersion.TLSv1_2
        client.set_ciphers(f"{name}:@SECLEVEL=0")
        a, b = socket.socketpair()

        def serve(server_side: socket.socket) -> None:
            try:
                with server_ctx.wrap_socket(server_side, server_side=True):
                    pass
            except OSError:
                pass

        t = threading.Thread(target=serve, args=(b,))
        t.start()
        try:
            with client.wrap_socket(a) as c:
                accepted.add(c.cipher()[0])
        except OSError:
            pass
        finally:
            a.close()
            t.join(10)
    assert len(names) > 20  # the probe really offered the legacy suites too
    return accepted


def test_tls12_offers_only_forward_secret_aead_suites_by_default(pki):
    """13 suites were accepted, 6 without forward secrecy, some CBC/SHA-1."""
    config = load_web_config(str(write_config(
        pki.dir, "default.yml",
        "tls_server_config: {cert_file: server.crt, key_file: server.key}")))
    accepted = _tls12_suites_accepted(config.ssl_context)
    # The server key is ECDSA: the ECDSA half of the default list.
    assert accepted == {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                        "ECDHE-ECDSA-CHACHA20-POLY1305"}
    assert all(n.startswith("TLS_ECDHE_") and "_CBC_" not in n for n in DEFAULT_TLS12_SUITES)


def test_cipher_suites_in_the_file_are_what_tls12_offers(pki):
    config = load_web_config(str(write_config(pki.dir, "ciphers.yml", """\
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                  TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
  curve_preferences: [CurveP384]
""")))
    assert _tls12_suites_accepted(config.ssl_context) == {"ECDHE-ECDSA-AES128-SHA",
                                                          "ECDHE-ECDSA-AES256-GCM-SHA384"}
    assert not config.ssl_context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_a_running_exporter_takes_cipher_suites_and_curves(pki):
    """These keys used to stop start-up with exit 2; node_exporter's files carry them."""
    config = write_config(pki.dir, "fleet.yml", """\
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  min_version: TLS12
  max_version: TLS12
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256]
  prefer_server_cipher_suites: true
  curve_preferences: [X25519, CurveP256]
""")
    with WebExporter(config, pki.client_context()) as exp:
        conn = http.client.HTTPSConnection("127.0.0.1", exp.port, context=pki.client_context(),
                                           timeout=10)
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            assert r.status == 200 and b"node_resize_kernel_cpus" in r.read()
            assert conn.sock.cipher()[0] == "ECDHE-ECDSA-CHACHA20-POLY1305"
        finally:
            conn.close()
        assert "curve_preferences" in exp.logs()  # the approximation is said, once, at start


# ------------------------------------------------------------------ the bcrypt cache


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_successful_checks_are_cached_briefly_failures_never():
    clock = _Clock()
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))
    auth = BasicAuth({"prometheus": hashed}, ttl=60.0, clock=clock)
    assert auth.check("prometheus", "secret") and auth.bcrypt_checks == 1
    assert auth.check("prometheus", "secret") and auth.bcrypt_checks == 1  # from the cache
    assert not auth.check("prometheus", "wrong") and auth.bcrypt_checks == 2
    assert not auth.check("prometheus", "wrong") and auth.bcrypt_checks == 3  # not cached
    assert not auth.check("ghost", "secret") and auth.bcrypt_checks == 4  # dummy hash, same cost
    clock.t += 61
    assert auth.check("prometheus", "secret") and auth.bcrypt_checks == 5  # expired
    # A changed hash (config reloaded with a new password) must not hit the old entry.
    auth.users["prometheus"] = bcrypt.hashpw(b"new", bcrypt.gensalt(rounds=4))
    assert not auth.check("prometheus", "secret")


def test_a_scraper_that_keeps_scraping_needs_bcrypt_once():
    """The cache slides on a hit: while guesses hold every bcrypt slot, a Prometheus scraping
    every 30 s must never need one again (it would get 429 once its entry expired)."""
    clock = _Clock()
    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))},
                     ttl=60.0, clock=clock)
    for _ in range(10):  # five minutes of scrapes
        assert auth.check("prometheus", "secret")
        clock.t += 30
    assert auth.bcrypt_checks == 1


def test_an_unknown_user_costs_a_check_of_the_same_cost():
    """The dummy hash had cost 4 (4 ms) against the users' 12 (240 ms)."""
    seen = []

    def checkpw(password: bytes, hashed: bytes) -> bool:
        seen.append(hashed[:7])
        return bcrypt.checkpw(password, hashed)

    users = {"prometheus": bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=6)),
             "grafana": bcrypt.hashpw(b"other", bcrypt.gensalt(rounds=5))}
    auth = BasicAuth(users, checkpw=checkpw)
    assert not auth.check("ghost", "secret")
    assert not auth.check("prometheus", "wrong")
    assert seen == [b"$2b$06$", b"$2b$06$"]  # the dummy: the highest cost of the real ones


def test_concurrent_bcrypt_checks_are_bounded():
    """16 password guessers ran 16 bcrypt checks at once (174% CPU)."""
    lock, running, peak = threading.Lock(), [0], [0]
    paired = threading.Event()  # two checks ran at once (however slowly threads start)

    def checkpw(password: bytes, hashed: bytes) -> bool:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == 2:
                paired.set()
        paired.wait(30)  # the first check holds its slot until a second one runs beside it
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return False

    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))},
                     checkpw=checkpw, concurrency=2, wait=0.3)
    outcomes = []

    def guess(i: int) -> None:
        try:
            outcomes.append(auth.check("prometheus", f"guess{i}"))
        except AuthBusy:
            outcomes.append("busy")

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak[0] == 2
    assert outcomes.count("busy") > 0 and outcomes.count(False) >= 2


def _version() -> str:
    from exporter import __version__
    return __version__


# ------------------------------------------------------------------ no shell anywhere


# Two fixed commands the package runs: the revision for build_info (git rev-parse, at start)
# and the short-lived BPF loader child (this Python, -m exporter.sources.kernel.bpf.loader). Their
# argv is a literal list starting with a constant: nothing from outside can become a program.
SUBPROCESS_ALLOWED = {
    "exporter/buildinfo.py": "git",
    "exporter/sources/kernel/bpf/loader.py": "sys.executable",
    # The self-signed certificate's maker (python -m exporter.web.selfsigned): a fixed argv,
    # the names and addresses go in on its stdin as JSON.
    "exporter/web/selfsigned.py": "sys.executable",
    # Each podresources poll (python -m exporter.sources.kubelet.podresources_child): a fixed
    # argv, the socket path and bounds go in on its stdin as JSON.
    "exporter/sources/kubelet/podresources.py": "sys.executable",
}


def test_no_shell_or_subprocess_in_the_package():
    """Nothing from the network, the API or the kernel can reach a shell: nothing starts one,
    and the fixed commands above are the only processes started."""
    import ast

    banned_modules = {"subprocess", "pty", "commands"}
    banned_calls = {
        "system",
        "popen",
        "spawnl",
        "spawnlp",
        "spawnv",
        "spawnvp",
        "execv",
        "execve",
        "execvp",
        "execl",
        "execlp",
        "posix_spawn",
        "posix_spawnp",
    }
    found, started = [], {}
    for path in sorted((REPO / "exporter").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [
                    (rel, a.name)
                    for a in node.names
                    if a.name in banned_modules and rel not in SUBPROCESS_ALLOWED
                ]
            elif isinstance(node, ast.ImportFrom) and node.module in banned_modules:
                found.append((rel, node.module))  # `from subprocess import ...` hides calls
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in banned_calls
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                found.append((rel, f"os.{node.attr}"))
            elif isinstance(node, ast.keyword) and node.arg == "shell":
                found.append((rel, "shell="))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("eval", "exec")
            ):
                found.append((rel, node.func.id))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "subprocess"
                and node.func.attr in ("run", "Popen", "call", "check_call", "check_output")
            ):
                argv = node.args[0] if node.args else None
                head = argv.elts[0] if isinstance(argv, ast.List) and argv.elts else None
                started[rel] = ast.unparse(head) if head is not None else "(not a literal list)"
    assert found == []
    assert {rel: head.strip("'\"") for rel, head in started.items()} == SUBPROCESS_ALLOWED
