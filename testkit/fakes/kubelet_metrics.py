"""A kubelet /metrics endpoint that answers with hostile bodies."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Hostile:
    """A loopback HTTP server answering each GET with `answer(handler)`; records the
    Authorization header of every request it gets."""

    def __init__(self, answer, host: str = "127.0.0.1") -> None:
        self.auth_headers: list[str | None] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                hostile.auth_headers.append(self.headers.get("Authorization"))
                try:
                    answer(self)
                except OSError:
                    pass  # the client gave up on us: that is the point

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self.httpd.server_address[1]}/metrics"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
