"""/healthz on a listener of its own: plain HTTP, its own thread and event loop.

The main endpoint holds every connection on one event loop; a flood of kept-alive TLS clients
(600 on a hung API server) makes each turn of that loop long, and a probe on a new connection
needs several turns (accept, the TLS handshake, its request): seconds, not the kubelet's 1 s.
This listener shares nothing with it but the process: a probe is answered whatever floods the
main port. Meant for loopback (`--web.health-listen-address 127.0.0.1:9863`, the DaemonSet's,
on the host network: only processes in the node's network namespace reach it), it answers
"ok" or "down" and nothing else, without authentication, as node_exporter and kube-rbac-proxy
do for their health paths. Bounded like the main endpoint: one request per connection, its head
at most MAX_HEAD bytes within HEAD_TIMEOUT, MAX_CONNECTIONS at once (past it closed at once).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from exporter.ratelog import RateLimitedLog
from exporter.web.stream import LoopServer, listen

log = logging.getLogger(__name__)

MAX_HEAD = 4096
HEAD_TIMEOUT = 2.0
MAX_CONNECTIONS = 16
BACKLOG = 128  # a probe every few seconds: the kernel's queue never fills


def _answer(code: int, reason: str, body: bytes, head_only: bool) -> bytes:
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() \
        + (b"" if head_only else body)


class HealthServer(LoopServer):
    """HealthServer(host, port, healthy): binds now (OSError such as EADDRINUSE), serves from
    its own thread after start(), stop() ends it."""

    def __init__(self, host: str, port: int, healthy: Callable[[], bool]):
        super().__init__(listen(host, port, BACKLOG), "http-health")
        self.healthy = healthy
        self.failures = RateLimitedLog(log)
        self._open = 0

    def start(self) -> None:
        self._start_loop()
        log.info("serving /healthz on http://%s:%d/healthz", *self.server_address[:2])

    def stop(self) -> None:
        self._stop_loop()

    async def _main(self) -> None:
        _, stopping = self._enter_loop()
        try:
            server = await asyncio.start_server(self._client, sock=self.sock, limit=MAX_HEAD)
        finally:
            self._started.set()
        async with server:
            await stopping.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            self.failures.note("cap", "/healthz listener: %d connections open: closing new "
                               "ones", self._open, level=logging.WARNING)
            writer.transport.abort()
            return
        self._open += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            method, _, rest = head.partition(b" ")
            target = rest.partition(b" ")[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                answer = _answer(405, "Method Not Allowed", b"method not allowed\n", False)
            elif target != b"/healthz":
                answer = _answer(404, "Not Found", b"not found\n", method == b"HEAD")
            elif self.healthy():
                answer = _answer(200, "OK", b"ok\n", method == b"HEAD")
            else:
                answer = _answer(503, "Service Unavailable", b"down\n", method == b"HEAD")
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT)
        except (OSError, TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as e:
            self.failures.note(f"gone:{type(e).__name__}", "/healthz listener: a client "
                               "went away or sent no request in time: %s", type(e).__name__)
        finally:
            self._open -= 1
            writer.close()
