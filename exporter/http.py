"""The HTTP endpoint: /metrics (the Collector's rendering) and /healthz."""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("exporter.http")

INDEX = b"""<html><head><title>node-resize-exporter</title></head><body>
<h1>node-resize-exporter</h1><p><a href="/metrics">Metrics</a> <a href="/healthz">Health</a></p>
</body></html>"""


class MetricsServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, healthy=lambda: True,
                 web_config: str | None = None):
        if web_config is not None:
            raise OSError(0, "--web.config.file is not supported yet (TLS and basic auth "
                             "arrive with the hardening work); serve behind a proxy meanwhile")
        registry_ = registry

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (http.server's naming)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry_))
                elif path == "/healthz":
                    ok = healthy()
                    self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"down\n")
                elif path == "/":
                    self._send(200, "text/html", INDEX)
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args):  # scrapes every few seconds: debug, not info
                log.debug("%s %s", self.address_string(), fmt % args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
