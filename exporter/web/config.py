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
      cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, ...]   # Go's names, TLS 1.2
      prefer_server_cipher_suites: true                              # the default
      curve_preferences: [CurveP256]                                 # Go's names
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2b$12$...         # bcrypt hash (htpasswd -nBC 12 '' | tr -d ':\\n')

An empty file, or one without cert_file and key_file, serves plain HTTP (basic auth still
applies), as exporter-toolkit does. Every problem is a ValueError naming the key and the fix:
the runner exits 2 with it. Without `cipher_suites`, TLS 1.2 offers exporter-toolkit's secure
default restricted to forward-secret AEAD suites (ECDHE with AES-GCM or ChaCha20-Poly1305);
TLS 1.3 suites are OpenSSL's (not configurable, as in Go). RequireAnyClientCert (a certificate
nobody verifies) is refused rather than honoured.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.untrusted import TooLarge, read_bytes
from exporter.web.auth import hash_problem

MAX_FILE_BYTES = 1 << 20  # a web config is a few hundred bytes; certificates a few KiB

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

# Go's names (crypto/tls CipherSuites(), the ones exporter-toolkit accepts) -> OpenSSL's.
_TLS12_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
TLS12_SUITES = _TLS12_SUITES  # for the generated certificate's context (web/selfsigned.py)
# Valid names that only concern TLS 1.3, whose suites neither Go nor OpenSSL lets one choose.
_TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                 "TLS_CHACHA20_POLY1305_SHA256"}
# Without cipher_suites: forward secrecy (ECDHE) and AEAD only, server's order.
DEFAULT_TLS12_SUITES = tuple(name for name in _TLS12_SUITES
                             if name.startswith("TLS_ECDHE_") and "_CBC_" not in name)
# Go's curve names -> OpenSSL's. Python's ssl can pin one NIST curve (set_ecdh_curve), not a
# list, and not X25519; OpenSSL's default groups (X25519, P-256, X448, P-521, P-384) hold
# every curve exporter-toolkit can name.
_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1",
           "X25519": None}


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
    notes: list[str] = field(default_factory=list)  # logged once at start (what was approximated)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"


def read_bounded(path: str | Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most `limit`; ValueError naming `what` otherwise (read
    through exporter/untrusted.py: a FIFO cannot hang start-up, /dev/zero cannot fill memory).
    """
    try:
        return read_bytes(path, limit, what=what, fix="give the path of a file")
    except TooLarge:
        raise ValueError(f"{what} {path}: more than {limit} bytes; is it the right file?"
                         ) from None
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot read it: {e.strerror or e}") from None


def load_web_config(path: str) -> WebConfig:
    """Read and validate the file; ValueError (naming the key) on anything wrong."""
    import yaml  # here: only --web.config.file needs it
    text = read_bounded(path, "--web.config.file")
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
    config.ssl_context, config.client_allowed_sans = _tls_context(path, base, tls, config.notes)
    http = _mapping(path, "http_server_config", raw.get("http_server_config"))
    _no_unknown(path, "http_server_config", http, _HTTP_KEYS)
    config.headers = _headers(path, http.get("headers"))
    config.users = _users(path, raw.get("basic_auth_users"))
    return config


def _mapping(path: str, key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(path, key, f"must be a mapping, got {type(value).__name__}")
    return value


def _no_unknown(path: str, where: str, mapping: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(str(k) for k in mapping if k not in known)
    if unknown:
        raise _err(path, where, f"unknown key {', '.join(unknown)}; known keys: "
                                f"{', '.join(sorted(known))}")


def _string(path: str, key: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _err(path, key, f"must be a string, got {type(value).__name__}")
    return value


def _strings(path: str, key: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _err(path, key, "must be a list of strings")
    return value


def _version(path: str, key: str, value: Any,
             default: ssl.TLSVersion | None) -> ssl.TLSVersion | None:
    name = _string(path, key, value)
    if not name:
        return default
    if name not in _VERSIONS:
        raise _err(path, key, f"{name!r} is not a TLS version; use TLS12 or TLS13")
    if _VERSIONS[name] is None:
        raise _err(path, key, f"{name} is refused: TLS below 1.2 is broken (RFC 8996); "
                              "use TLS12 or TLS13")
    return _VERSIONS[name]


def _pem_file(path: str, base: Path, key: str, name: str) -> Path:
    """A certificate or key path that is a regular file (a FIFO would hang OpenSSL's read)."""
    full = base / name
    read_bounded(full, f"--web.config.file {path}: {key}:")
    return full


def _ciphers(path: str, ctx: ssl.SSLContext, tls: dict[str, Any], notes: list[str]) -> None:
    names = _strings(path, "tls_server_config.cipher_suites", tls.get("cipher_suites"))
    unknown = [n for n in names if n not in _TLS12_SUITES and n not in _TLS13_SUITES]
    if unknown:
        raise _err(path, "tls_server_config.cipher_suites", f"unknown cipher {unknown[0]}; "
                   f"use Go's names: {', '.join(_TLS12_SUITES)}")
    tls12 = [_TLS12_SUITES[n] for n in names if n in _TLS12_SUITES] if names else \
        [_TLS12_SUITES[n] for n in DEFAULT_TLS12_SUITES]
    if not tls12 and ctx.minimum_version < ssl.TLSVersion.TLSv1_3:
        raise _err(path, "tls_server_config.cipher_suites", "names no TLS 1.2 suite (TLS 1.3 "
                   "suites are not configurable); add one, or set min_version: TLS13")
    if tls12:
        ctx.set_ciphers(":".join(tls12))
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise _err(path, "tls_server_config.prefer_server_cipher_suites", "must be true or false")
    if prefer:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = _strings(path, "tls_server_config.curve_preferences", tls.get("curve_preferences"))
    bad = [c for c in curves if c not in _CURVES]
    if bad:
        raise _err(path, "tls_server_config.curve_preferences",
                   f"unknown curve {bad[0]}; one of {', '.join(_CURVES)}")
    pinned = _CURVES[curves[0]] if len(curves) == 1 else None
    if pinned is not None:
        ctx.set_ecdh_curve(pinned)
    elif curves:
        notes.append(f"tls_server_config.curve_preferences {curves}: Python's ssl can pin one "
                     "NIST curve only; OpenSSL's default groups are offered (X25519, P-256, "
                     "X448, P-521, P-384), which include every curve listed")


def _tls_context(path: str, base: Path, tls: dict[str, Any],
                 notes: list[str]) -> tuple[ssl.SSLContext | None, tuple[Any, ...]]:
    """The server's TLS (certificate and key, versions, ciphers) and its client certificate
    rules; (None, ()) without TLS."""
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

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    minimum = _version(path, "tls_server_config.min_version", tls.get("min_version"),
                       ssl.TLSVersion.TLSv1_2)
    assert minimum is not None  # a default is given
    ctx.minimum_version = minimum
    maximum = _version(path, "tls_server_config.max_version", tls.get("max_version"), None)
    if maximum is not None:
        if maximum < ctx.minimum_version:
            raise _err(path, "tls_server_config.max_version", "is below min_version")
        ctx.maximum_version = maximum
    _ciphers(path, ctx, tls, notes)
    cert_path = _pem_file(path, base, "tls_server_config.cert_file", cert)
    key_path = _pem_file(path, base, "tls_server_config.key_file", key)
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as e:
        raise _err(path, "tls_server_config.cert_file/key_file",
                   f"cannot load {cert_path} with {key_path}: {e}") from None
    return ctx, _client_auth(path, base, tls, ctx)


def _client_auth(path: str, base: Path, tls: dict[str, Any],
                 ctx: ssl.SSLContext) -> tuple[Any, ...]:
    """Whether and how `ctx` verifies client certificates (client_auth_type, client_ca_file),
    and the SANs a client certificate must carry (client_allowed_sans)."""
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
        ca_path = _pem_file(path, base, "tls_server_config.client_ca_file", ca)
        try:
            ctx.load_verify_locations(cafile=ca_path)
        except (OSError, ssl.SSLError) as e:
            raise _err(path, "tls_server_config.client_ca_file",
                       f"cannot load {ca_path}: {e}") from None
    elif ctx.verify_mode != ssl.CERT_NONE:
        raise _err(path, "tls_server_config.client_ca_file", f"missing: client_auth_type "
                   f"{auth_name} verifies client certificates against it")

    sans = _strings(path, "tls_server_config.client_allowed_sans", tls.get("client_allowed_sans"))
    if sans and ctx.verify_mode == ssl.CERT_NONE:
        raise _err(path, "tls_server_config.client_allowed_sans",
                   "needs a client_auth_type that verifies client certificates")
    return tuple(sans)


def _headers(path: str, raw: Any) -> dict[str, str]:
    headers = _mapping(path, "http_server_config.headers", raw)
    for name, value in headers.items():
        if str(name).lower() not in _ALLOWED_HEADERS or not isinstance(value, str) \
                or "\n" in value or "\r" in value:
            raise _err(path, f"http_server_config.headers.{name}", "only one-line string "
                       f"values of {', '.join(sorted(_ALLOWED_HEADERS))} may be set")
    return {str(k): v for k, v in headers.items()}


def _users(path: str, raw: Any) -> dict[str, bytes]:
    users = _mapping(path, "basic_auth_users", raw)
    out: dict[str, bytes] = {}
    for name, hashed in users.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise _err(path, f"basic_auth_users.{name}", "a user name is a non-empty string "
                                                         "without ':'")
        problem = hash_problem(hashed) if isinstance(hashed, str) else \
            f"must be a bcrypt hash string, got {type(hashed).__name__}"
        if problem:
            raise _err(path, f"basic_auth_users.{name}", problem)
        out[name] = hashed.encode()
    return out


def peer_san_allowed(peercert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Is one of the verified client certificate's SANs (DNS, email, IP, URI) allowed?"""
    if not allowed:
        return True
    sans = {value for _kind, value in (peercert or {}).get("subjectAltName", ())}
    return bool(sans.intersection(allowed))
