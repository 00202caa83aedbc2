"""/healthz on a listener of its own: plain HTTP, its own thread and event loop.

The main endpoint holds every connection on one event loop; a flood of kept-alive TLS clients
(600 on a hung API server) makes each turn of that loop long, and a probe on a new connection
needs several turns (accept, the TLS handshake, its request): seconds, not the kubelet's 1 s.
This listener shares nothing with it but the process: a probe is answered whatever floods the
main port. Meant for loopback (`--web.health-listen-address 127.0.0.1:9863`, the DaemonSet's,
on the host network: only processes in the node's network namespace reach it), it answers
"ok" or "down" and nothing else, without authentication, as node_exporter and kube-rbac-proxy
do for their health paths. Bounded like the main endpoint: one request per connection, its head
at most MAX_HEAD bytes within HEAD_TIMEOUT, MAX_CONNECTIONS at once.

Any local process can connect, so connections that send nothing, or a byte at a time, must not
keep a probe out (16 such, reopened as soon as they were cut, answered 0-3 probes of 30). A
new connection is always taken: past PER_ADDRESS from its address, that address's oldest open
connection is closed to make room, and past MAX_CONNECTIONS in all, the oldest of all. A probe
sends its request as it connects and is answered from a few fixed bytes in the same turn of
the loop, so it is gone long before MAX_CONNECTIONS newer connections could push it out; an
idle one is the oldest, and goes first.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Callable

from exporter.ratelog import RateLimitedLog
from exporter.web.stream import LoopServer, listen

log = logging.getLogger(__name__)

MAX_HEAD = 4096
HEAD_TIMEOUT = 1.0  # a probe sends its head as it connects; the kubelet waits 1 s for the answer
MAX_CONNECTIONS = 16
PER_ADDRESS = 8  # connections from one client address; past it its oldest is closed
BACKLOG = 128  # a probe every few seconds: the kernel's queue never fills


def _answer(code: int, reason: str, body: bytes, head_only: bool) -> bytes:
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() \
        + (b"" if head_only else body)


# Every answer, made once: (healthy, HEAD) -> bytes.
_HEALTH = {(ok, head): _answer(200, "OK", b"ok\n", head) if ok
           else _answer(503, "Service Unavailable", b"down\n", head)
           for ok in (True, False) for head in (True, False)}
_NOT_FOUND = {head: _answer(404, "Not Found", b"not found\n", head) for head in (True, False)}
_NOT_ALLOWED = _answer(405, "Method Not Allowed", b"method not allowed\n", False)


class HealthServer(LoopServer):
    """HealthServer(host, port, healthy): binds now (OSError such as EADDRINUSE), serves from
    its own thread after start(), stop() ends it."""

    def __init__(self, host: str, port: int, healthy: Callable[[], bool]):
        super().__init__(listen(host, port, BACKLOG), "http-health")
        self.healthy = healthy
        self.failures = RateLimitedLog(log)
        self.evicted = 0  # connections closed to make room for newer ones
        # Open connections, oldest first: id -> (client address, writer).
        self._open: OrderedDict[int, tuple[str, asyncio.StreamWriter]] = OrderedDict()
        self._serial = 0

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

    def _make_room(self, address: str) -> None:
        """Close the oldest connection from `address` when it has PER_ADDRESS open, else the
        oldest of all when MAX_CONNECTIONS are open."""
        mine = [key for key, (peer, _) in self._open.items() if peer == address]
        victim = mine[0] if len(mine) >= PER_ADDRESS else \
            next(iter(self._open)) if len(self._open) >= MAX_CONNECTIONS else None
        if victim is None:
            return
        _, writer = self._open.pop(victim)
        writer.transport.abort()
        self.evicted += 1
        self.failures.note("evict", "/healthz listener: %d connections open (%d from %s): "
                           "closing the oldest", len(self._open) + 1, len(mine), address,
                           level=logging.WARNING)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = str((writer.get_extra_info("peername") or ("",))[0])
        self._make_room(address)
        self._serial += 1
        key = self._serial
        self._open[key] = (address, writer)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            method, _, rest = head.partition(b" ")
            target = rest.partition(b" ")[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                answer = _NOT_ALLOWED
            elif target != b"/healthz":
                answer = _NOT_FOUND[method == b"HEAD"]
            else:
                answer = _HEALTH[(bool(self.healthy()), method == b"HEAD")]
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT)
        except (OSError, TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as e:
            self.failures.note(f"gone:{type(e).__name__}", "/healthz listener: a client "
                               "went away or sent no request in time: %s", type(e).__name__)
        finally:
            self._open.pop(key, None)
            writer.close()
