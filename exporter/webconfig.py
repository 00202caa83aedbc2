"""`--web.config.file`: TLS and basic auth for /metrics, in the Prometheus exporter-toolkit format.

The same YAML node_exporter and every exporter-toolkit user reads, so one file (and one
Prometheus scrape config) serves the whole fleet:

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file's folder
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default), RequestClientCert,
                                                     # VerifyClientCertIfGiven
      client_ca_file: ca.crt
      client_allowed_sans: [scraper.example]        # optional: client cert SAN allow-list
      min_version: TLS12             # TLS12 (default) or TLS13; below 1.2 is refused
      max_version: TLS13
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2b$12$...         # bcrypt hash (htpasswd -nBC 12 '' | tr -d ':\\n')

An empty file, or one without cert_file and key_file, serves plain HTTP (basic auth still
applies), as exporter-toolkit does. Every problem is a ValueError naming the key and the fix:
the runner exits 2 with it. Keys this implementation cannot honour (cipher_suites,
curve_preferences, RequireAnyClientCert) are refused rather than silently ignored, because a
security setting that is quietly dropped is worse than a start-up error.
"""
from __future__ import annotations

import hashlib
import re
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import yaml

_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans",
             "min_version", "max_version", "cipher_suites", "curve_preferences",
             "prefer_server_cipher_suites"}
_HTTP_KEYS = {"http2", "headers"}
# exporter-toolkit accepts only these response headers (it refuses the rest as unsafe to set).
_ALLOWED_HEADERS = {"strict-transport-security", "x-frame-options", "x-content-type-options",
                    "x-xss-protection", "content-security-policy"}

_VERSIONS = {"TLS10": None, "TLS11": None,  # named so the error can say why they are refused
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE,
                # We never look at an unverified certificate, so asking for one changes nothing.
                "RequestClientCert": ssl.CERT_NONE,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")

AUTH_CACHE_SECONDS = 60.0  # bcrypt costs ~0.1-0.3 s a check; Prometheus scrapes every 15-60 s
AUTH_CACHE_SIZE = 100


def _err(path: str, key: str, problem: str) -> ValueError:
    return ValueError(f"--web.config.file {path}: {key}: {problem}")


@dataclass
class WebConfig:
    """The parsed file. `ssl_context` is None for plain HTTP."""

    path: str
    ssl_context: ssl.SSLContext | None = None
    client_allowed_sans: tuple[str, ...] = ()
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"


def load_web_config(path: str) -> WebConfig:
    """Read and validate the file; ValueError (naming the key) on anything wrong."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"--web.config.file {path}: cannot read it: {e.strerror or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"--web.config.file {path}: not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _err(path, "(top level)", "must be a mapping with tls_server_config, "
                                        "http_server_config or basic_auth_users")
    _no_unknown(path, "(top level)", raw, _TOP_KEYS)
    base = Path(path).resolve().parent
    config = WebConfig(path=path)
    tls = _mapping(path, "tls_server_config", raw.get("tls_server_config"))
    _no_unknown(path, "tls_server_config", tls, _TLS_KEYS)
    config.ssl_context, config.client_allowed_sans = _tls_context(path, base, tls)
    http = _mapping(path, "http_server_config", raw.get("http_server_config"))
    _no_unknown(path, "http_server_config", http, _HTTP_KEYS)
    config.headers = _headers(path, http.get("headers"))
    config.users = _users(path, raw.get("basic_auth_users"))
    return config


def _mapping(path: str, key: str, value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(path, key, f"must be a mapping, got {type(value).__name__}")
    return value


def _no_unknown(path: str, where: str, mapping: dict, known: set[str]) -> None:
    unknown = sorted(str(k) for k in mapping if k not in known)
    if unknown:
        raise _err(path, where, f"unknown key {', '.join(unknown)}; known keys: "
                                f"{', '.join(sorted(known))}")


def _string(path: str, key: str, value) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _err(path, key, f"must be a string, got {type(value).__name__}")
    return value


def _version(path: str, key: str, value, default: ssl.TLSVersion | None):
    name = _string(path, key, value)
    if not name:
        return default
    if name not in _VERSIONS:
        raise _err(path, key, f"{name!r} is not a TLS version; use TLS12 or TLS13")
    if _VERSIONS[name] is None:
        raise _err(path, key, f"{name} is refused: TLS below 1.2 is broken (RFC 8996); "
                              "use TLS12 or TLS13")
    return _VERSIONS[name]


def _tls_context(path: str, base: Path, tls: dict) -> tuple[ssl.SSLContext | None, tuple]:
    cert = _string(path, "tls_server_config.cert_file", tls.get("cert_file"))
    key = _string(path, "tls_server_config.key_file", tls.get("key_file"))
    if not cert and not key:
        if any(tls.get(k) for k in ("client_ca_file", "client_auth_type")):
            raise _err(path, "tls_server_config", "client certificate settings need cert_file "
                                                  "and key_file (TLS) as well")
        return None, ()
    if not cert or not key:
        missing = "cert_file" if not cert else "key_file"
        raise _err(path, f"tls_server_config.{missing}", "missing: TLS needs both cert_file "
                                                         "and key_file")
    for unsupported in ("cipher_suites", "curve_preferences"):
        if tls.get(unsupported):
            raise _err(path, f"tls_server_config.{unsupported}", "not supported by this "
                       "exporter (OpenSSL's defaults for TLS 1.2+ apply); remove the key")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _version(path, "tls_server_config.min_version", tls.get("min_version"),
                                   ssl.TLSVersion.TLSv1_2)
    maximum = _version(path, "tls_server_config.max_version", tls.get("max_version"), None)
    if maximum is not None:
        if maximum < ctx.minimum_version:
            raise _err(path, "tls_server_config.max_version", "is below min_version")
        ctx.maximum_version = maximum
    cert_path, key_path = base / cert, base / key
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as e:
        raise _err(path, "tls_server_config.cert_file/key_file",
                   f"cannot load {cert_path} with {key_path}: {e}") from None

    auth_name = _string(path, "tls_server_config.client_auth_type",
                        tls.get("client_auth_type")) or "NoClientCert"
    if auth_name == "RequireAnyClientCert":
        raise _err(path, "tls_server_config.client_auth_type", "RequireAnyClientCert (a "
                   "certificate nobody verifies) is not supported; use "
                   "RequireAndVerifyClientCert with client_ca_file")
    if auth_name not in _CLIENT_AUTH:
        raise _err(path, "tls_server_config.client_auth_type",
                   f"{auth_name!r} is not one of {', '.join(_CLIENT_AUTH)}")
    ctx.verify_mode = _CLIENT_AUTH[auth_name]
    ca = _string(path, "tls_server_config.client_ca_file", tls.get("client_ca_file"))
    if ca:
        if ctx.verify_mode == ssl.CERT_NONE:
            raise _err(path, "tls_server_config.client_ca_file", f"given but client_auth_type "
                       f"is {auth_name}: set client_auth_type to RequireAndVerifyClientCert")
        try:
            ctx.load_verify_locations(cafile=base / ca)
        except (OSError, ssl.SSLError) as e:
            raise _err(path, "tls_server_config.client_ca_file",
                       f"cannot load {base / ca}: {e}") from None
    elif ctx.verify_mode != ssl.CERT_NONE:
        raise _err(path, "tls_server_config.client_ca_file", f"missing: client_auth_type "
                   f"{auth_name} verifies client certificates against it")

    sans = tls.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        raise _err(path, "tls_server_config.client_allowed_sans", "must be a list of strings")
    if sans and ctx.verify_mode == ssl.CERT_NONE:
        raise _err(path, "tls_server_config.client_allowed_sans",
                   "needs a client_auth_type that verifies client certificates")
    return ctx, tuple(sans)


def _headers(path: str, raw) -> dict[str, str]:
    headers = _mapping(path, "http_server_config.headers", raw)
    for name, value in headers.items():
        if str(name).lower() not in _ALLOWED_HEADERS or not isinstance(value, str) \
                or "\n" in value or "\r" in value:
            raise _err(path, f"http_server_config.headers.{name}", "only one-line string "
                       f"values of {', '.join(sorted(_ALLOWED_HEADERS))} may be set")
    return {str(k): v for k, v in headers.items()}


def _users(path: str, raw) -> dict[str, bytes]:
    users = _mapping(path, "basic_auth_users", raw)
    out: dict[str, bytes] = {}
    for name, hashed in users.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise _err(path, f"basic_auth_users.{name}", "a user name is a non-empty string "
                                                         "without ':'")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            raise _err(path, f"basic_auth_users.{name}", "must be a bcrypt hash ($2b$...), "
                       "for example from: htpasswd -nBC 12 '' | tr -d ':\\n'")
        out[name] = hashed.encode()
    return out


def peer_san_allowed(peercert: dict | None, allowed: tuple[str, ...]) -> bool:
    """Is one of the verified client certificate's SANs (DNS, email, IP, URI) allowed?"""
    if not allowed:
        return True
    sans = {value for _kind, value in (peercert or {}).get("subjectAltName", ())}
    return bool(sans.intersection(allowed))


class BasicAuth:
    """bcrypt checks with a short cache of successes, as exporter-toolkit does.

    The cache key is a SHA-256 over user, stored hash and password, so the cache holds no
    password and a changed hash misses. An unknown user still costs one bcrypt check, against a
    fixed dummy hash, so response time does not tell which user names exist.
    """

    def __init__(self, users: dict[str, bytes], ttl: float = AUTH_CACHE_SECONDS,
                 size: int = AUTH_CACHE_SIZE, clock=time.monotonic) -> None:
        self.users = users
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()
        self._dummy = bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=4)) \
            if users else b""
        self.bcrypt_checks = 0  # counted so tests can see the cache work

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, user: str, password: str) -> bool:
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join([user.encode("utf-8", "surrogateescape"),
                                         hashed or b"", password.encode("utf-8",
                                                                        "surrogateescape")])
                             ).digest()
        now = self.clock()
        with self._lock:
            expiry = self._cache.get(key)
            if expiry is not None and expiry > now:
                return True
        secret = password.encode("utf-8", "surrogateescape")
        if len(secret) > 72:  # bcrypt's limit; the library refuses rather than truncates
            return False
        self.bcrypt_checks += 1
        ok = bcrypt.checkpw(secret, hashed or self._dummy) and hashed is not None
        if ok:
            with self._lock:
                self._cache[key] = now + self.ttl
                self._cache.move_to_end(key)
                while len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        return ok
