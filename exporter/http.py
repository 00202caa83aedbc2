"""The HTTP endpoint: /metrics (the Collector's rendering) and /healthz.

Plain HTTP by default; `--web.config.file` (exporter/webconfig.py) adds TLS, client
certificates and basic auth. The TLS handshake runs in the connection's own thread, with a
timeout, so a client that connects and stalls cannot hold up the accept loop. /healthz answers
without basic auth (a kubelet probe carries no password and learns only "ok"); it is still behind
TLS and client certificates when those are configured.
"""
from __future__ import annotations

import base64
import binascii
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from exporter.webconfig import BasicAuth, WebConfig, load_web_config, peer_san_allowed

log = logging.getLogger("exporter.http")

INDEX = b"""<html><head><title>node-resize-exporter</title></head><body>
<h1>node-resize-exporter</h1><p><a href="/metrics">Metrics</a> <a href="/healthz">Health</a></p>
</body></html>"""

HANDSHAKE_TIMEOUT = 10.0  # seconds a client gets to finish the TLS handshake
IDLE_TIMEOUT = 120.0  # a kept-alive connection idle this long is closed (frees its thread)
REALM = 'Basic realm="node-resize-exporter", charset="UTF-8"'


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog is 5: with dozens of scrapers connecting at once the
    # kernel drops SYNs and a client waits out retransmits (1, 3, 7, 15 s...). Seen in
    # tests/test_load.py as a scrape timing out after 30 s.
    request_queue_size = 128
    web: WebConfig

    def finish_request(self, request, client_address):
        ctx = self.web.ssl_context
        if ctx is None:
            return super().finish_request(request, client_address)
        try:
            request.settimeout(HANDSHAKE_TIMEOUT)
            tls = ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            # Wrong version, no or bad client certificate, a port scanner: the client's problem.
            log.debug("TLS handshake with %s failed: %s", client_address[0], e)
            return
        try:
            if not peer_san_allowed(tls.getpeercert(), self.web.client_allowed_sans):
                log.debug("client certificate of %s: no SAN in client_allowed_sans",
                          client_address[0])
                return
            super().finish_request(tls, client_address)
        finally:
            try:
                tls.close()
            except OSError:
                pass


class Exposition:
    """The rendered /metrics, shared by concurrent scrapes.

    Rendered again only when the agent's state changed (`version`) or the last rendering is
    older than `max_age` (gauges such as drift_seconds move with time alone). Fifty scrapers
    arriving together cost one rendering, not fifty: the lock makes the rest wait for it.
    """

    def __init__(self, registry: CollectorRegistry, version=lambda: None, max_age: float = 1.0):
        self.registry = registry
        self.version = version
        self.max_age = max_age
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._rendered_version = None
        self._rendered_at = 0.0

    def get(self) -> bytes:
        with self._lock:
            version, now = self.version(), time.monotonic()
            if (self._body is None or version != self._rendered_version
                    or now - self._rendered_at >= self.max_age):
                self._body = generate_latest(self.registry)
                self._rendered_version, self._rendered_at = version, now
            return self._body


class MetricsServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, healthy=lambda: True,
                 web_config: str | None = None, version=lambda: None):
        # ValueError (naming the key) on a bad file: the runner exits 2 with it.
        self.web = load_web_config(web_config) if web_config else WebConfig(path="")
        auth = BasicAuth(self.web.users)
        self.auth = auth
        extra_headers = dict(self.web.headers)
        exposition = Exposition(registry, version)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = IDLE_TIMEOUT
            # Headers and body go out in two writes; with Nagle on, a kept-alive connection
            # (Prometheus keeps them) waits ~40 ms for the client's delayed ACK every scrape.
            disable_nagle_algorithm = True

            def do_GET(self):  # noqa: N802 (http.server's naming)
                path = self.path.split("?", 1)[0]
                if path != "/healthz" and auth.enabled and not self._authorized():
                    self._send(401, "text/plain", b"Unauthorized\n",
                               {"WWW-Authenticate": REALM})
                elif path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, exposition.get())
                elif path == "/healthz":
                    ok = healthy()
                    self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"down\n")
                elif path == "/":
                    self._send(200, "text/html", INDEX)
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _authorized(self) -> bool:
                scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
                if scheme.lower() != "basic":
                    return False
                try:
                    decoded = base64.b64decode(encoded.strip(), validate=True)
                except (binascii.Error, ValueError):
                    return False
                user, sep, password = decoded.decode("utf-8", "surrogateescape").partition(":")
                return bool(sep) and auth.check(user, password)

            def _send(self, code: int, ctype: str, body: bytes,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for name, value in {**extra_headers, **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args):  # scrapes every few seconds: debug, not info
                log.debug("%s %s", self.address_string(), fmt % args)

        server_class = _Server
        if ":" in host:  # an IPv6 literal such as "::"
            server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self.httpd = server_class((host, port), Handler)
        self.httpd.web = self.web  # read per connection, after serve_forever starts
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http",
                                        daemon=True)

    @property
    def scheme(self) -> str:
        return self.web.scheme

    def start(self) -> None:
        self._thread.start()
        host, port = self.httpd.server_address[:2]
        log.info("serving %s://%s:%d/metrics%s%s", self.scheme, host, port,
                 " (client certificates required)" if self.web.ssl_context is not None
                 and self.web.ssl_context.verify_mode == ssl.CERT_REQUIRED else "",
                 " (basic auth)" if self.auth.enabled else "")

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
