"""The HTTP endpoint: the telemetry path (/metrics by default), /healthz and an index page.

Plain HTTP by default; `--web.config.file` (exporter/web/config.py) adds TLS, client
certificates and basic auth. `--web.auth=kubernetes` (the DaemonSet's) checks bearer tokens with
the API server instead (exporter/web/kubeauth.py), over TLS with the file's certificate or one
made at start (exporter/web/selfsigned.py). /healthz answers without authentication (a kubelet
probe carries no credentials and learns only "ok"); it is still behind TLS and client
certificates when those are configured. `health_address` adds a plain-HTTP listener with its
own thread and loop for /healthz alone (exporter/web/health.py): a flood of this port makes
each turn of its loop long, and a probe here needs several turns.

Built to stay up when anyone who can reach the port misbehaves: one asyncio event
loop holds every connection (tens of KiB each at most, not a thread), HTTP is parsed by h11
with the request head bounded in size (MAX_HEADER_BYTES) and count (MAX_HEADERS) and in time
(HEADER_TIMEOUT from the first byte; HANDSHAKE_TIMEOUT for TLS), connections are capped at
MAX_CONNECTIONS (past it the oldest connection not computing an answer is closed to make room,
so neither a slowloris nor a flood of clients can lock a new scraper out), and the work a
request causes runs on two small thread pools (exporter/web/routes.py): rendering (shared, see
exporter/web/exposition.py) and bcrypt (bounded, see exporter/web/auth.py). Failures caused by
clients are logged once per kind per minute (exporter/ratelog.py).
"""
from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable

import h11
from prometheus_client import CollectorRegistry

from exporter.ratelog import RateLimitedLog
from exporter.web.auth import BasicAuth
from exporter.web.authmetrics import WebAuthCollector
from exporter.web.config import WebConfig, load_web_config, peer_san_allowed
from exporter.web.exposition import Exposition
from exporter.web.health import HealthServer
from exporter.web.kubeauth import (
    KubeAuth,
    ReviewClient,
    WebAuthStats,
    check_config,
    review_client_factory,
)
from exporter.web.memory import Trimmer
from exporter.web.routes import PLAN_PATH, Routes
from exporter.web.stream import LoopServer, Plain, Tls, listen

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0  # seconds a client gets to finish the TLS handshake
HEADER_TIMEOUT = 10.0  # seconds from a request's first byte (or the connection) to its last header
IDLE_TIMEOUT = 120.0  # a kept-alive connection idle this long is closed
WRITE_TIMEOUT = 30.0  # a client that does not read its answer for this long is dropped
MAX_HEADER_BYTES = 16 * 1024  # request line and headers; a Prometheus scrape sends ~300 bytes
MAX_HEADERS = 64
MAX_CONNECTIONS = 512  # also kept under half the descriptor limit (see _connection_cap)
# How many connections asyncio accepts in one go: the descriptors held peak at MAX_CONNECTIONS
# plus a few such bursts while a flood is cut down to the cap.
LISTEN_BACKLOG = 128
# The kernel's queue of connections not yet accepted (kernel memory, no descriptor): when it
# overflows, SYNs are dropped and a scraper waits out a retransmit (1 s, then 3 s). Seen with
# socketserver's 5 and 50 scrapers, and with 128 under a slowloris that reconnects at once.
KERNEL_BACKLOG = 4096
# The health listener reports down when the main loop has not turned for this long (seconds).
LOOP_STALL = 30.0


def _connection_cap() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(MAX_CONNECTIONS, soft // 2))


# Go's net/http answer to a plain-HTTP request on a TLS port, word for word.
PLAIN_HTTP_TO_TLS = (b"HTTP/1.0 400 Bad Request\r\n\r\n"
                     b"Client sent an HTTP request to an HTTPS server.\n")

class _Conn:
    """One client connection, as the cap and the eviction see it."""

    def __init__(self, stream: Plain, peer: str):
        self.stream = stream
        self.writer = stream.writer
        self.peer = peer
        # Not computing an answer right now (reading, or waiting on a token review someone
        # else's request started): may be closed to make room.
        self.waiting = True

    def abort(self) -> None:
        self.writer.transport.abort()  # RST, no lingering: cheap under attack


@dataclass(frozen=True)
class WebSettings:
    """Where and how the endpoint serves: the --web.* options and what they need."""

    host: str
    port: int
    web_config: str | None = None  # --web.config.file
    telemetry_path: str = "/metrics"
    auth: str = "config"  # --web.auth: config, none, kubernetes
    node_name: str = ""  # the self-signed certificate's name (auth kubernetes)
    kubeconfig: str | None = None  # for the token reviews (auth kubernetes)
    token_audiences: tuple[str, ...] = ()
    extra_sans: tuple[str, ...] = ()
    health_address: tuple[str, int] | None = None  # /healthz on a listener of its own


class MetricsServer(LoopServer):
    """The endpoint. Constructing it binds the socket (OSError such as EADDRINUSE) and reads
    the web config (ValueError naming the key); start() serves from a thread, stop() ends it.

        MetricsServer(WebSettings(host, port, ...), registry, healthy=..., version=...,
                      plan=...)

    `settings` (WebSettings): where and how it serves, as the options say (exporter/app.py
    open_server builds it from them); the rest is what it serves.

    `auth`: "config" (the web config file decides: basic auth or none), "none" (no
    authentication; basic_auth_users in the file are an error), "kubernetes" (bearer tokens,
    TokenReview + SubjectAccessReview, always TLS: the file's certificate or a self-signed one
    for `node_name`, localhost, loopback and `extra_sans`; `review_client` replaces the HTTP
    client to the API server in tests).
    """

    def __init__(self, settings: WebSettings, registry: CollectorRegistry, *,
                 healthy: Callable[[], bool] = lambda: True,
                 version: Callable[[], object] = lambda: None,
                 plan: Callable[[str], tuple[int, bytes]] | None = None,
                 review_client: Callable[[], ReviewClient] | None = None):
        self.settings = settings
        host, port, web_config, telemetry_path, auth = (
            settings.host, settings.port, settings.web_config, settings.telemetry_path,
            settings.auth)
        node_name, kubeconfig, token_audiences, extra_sans, health_address = (
            settings.node_name, settings.kubeconfig, settings.token_audiences,
            settings.extra_sans, settings.health_address)
        self.web = load_web_config(web_config) if web_config else WebConfig(path="")
        self.auth_mode = auth
        self.generated_certificate: bytes | None = None  # PEM, when made at start
        self.kube_auth: KubeAuth | None = None
        self.auth_stats = WebAuthStats()
        if auth in ("kubernetes", "none") and self.web.users:
            raise ValueError(f"--web.auth={auth}: --web.config.file {self.web.path} has "
                             "basic_auth_users; remove them, or use --web.auth=config")
        if auth == "kubernetes":
            if review_client is None:
                check_config(kubeconfig)  # ValueError naming the fix
                review_client = review_client_factory(kubeconfig)
            if self.web.ssl_context is None:
                from exporter.web.selfsigned import self_signed_context
                self.web.ssl_context, self.generated_certificate = self_signed_context(
                    node_name or socket.gethostname(), extra_sans)
            self.kube_auth = KubeAuth(review_client, telemetry_path, token_audiences,
                                      stats=self.auth_stats)
        elif auth not in ("config", "none"):
            raise ValueError(f"--web.auth {auth!r}: one of kubernetes, config, none")
        self.auth = BasicAuth(self.web.users)
        self.exposition = Exposition(registry, version)
        # ValueError on a bad path, before the socket is bound.
        # GET /plan (exporter/sinks/plan_collector.py): the same tokens, reviewed for the path
        # /plan.
        plan_auth = None if self.kube_auth is None or plan is None else KubeAuth(
            review_client, PLAN_PATH, token_audiences, stats=self.auth_stats)  # type: ignore[arg-type]
        self.routes = Routes(self.exposition, self.auth, healthy, telemetry_path,
                             kube_auth=self.kube_auth, stats=self.auth_stats, plan=plan,
                             plan_auth=plan_auth)
        registry.register(WebAuthCollector(self.auth_stats))
        self.telemetry_path = telemetry_path
        self.extra_headers = dict(self.web.headers)
        self.failures = RateLimitedLog(log)
        self.max_connections = _connection_cap()
        self.evicted = 0
        self.trimmer = Trimmer()
        self.sock = listen(host, port, KERNEL_BACKLOG)
        # /healthz also on a plain-HTTP listener of its own (exporter/web/health.py): answered
        # within a probe's timeout whatever floods this one.
        self.health: HealthServer | None = None
        if health_address is not None:
            try:
                self.health = HealthServer(*health_address,
                                           lambda: self.serving() and healthy())
            except OSError as e:
                self.sock.close()
                raise ValueError(f"--web.health-listen-address {health_address[0]}:"
                                 f"{health_address[1]}: cannot listen: {e.strerror or e}. "
                                 "Fix: choose another port") from None
        super().__init__(self.sock, "http")
        self._conns: OrderedDict[_Conn, None] = OrderedDict()  # open ones, oldest first
        self._last_turn = time.monotonic()

    @property
    def scheme(self) -> str:
        return self.web.scheme

    def start(self) -> None:
        self._start_loop()
        if self.health is not None:
            self.health.start()
        host, port = self.server_address[:2]
        if ":" in host:  # IPv6, written as in a URL
            host = f"[{host}]"
        log.info("serving %s://%s:%d%s%s%s%s", self.scheme, host, port, self.telemetry_path,
                 " (client certificates required)" if self.web.ssl_context is not None
                 and self.web.ssl_context.verify_mode == ssl.CERT_REQUIRED else "",
                 " (basic auth)" if self.auth.enabled else "",
                 " (Kubernetes bearer tokens: TokenReview, SubjectAccessReview)"
                 if self.kube_auth is not None else "")
        if self.generated_certificate is not None:
            log.info("TLS with a self-signed certificate made at start (no "
                     "tls_server_config given)")
        for note in self.web.notes:
            log.warning("--web.config.file %s: %s", self.web.path, note)

    def stop(self) -> None:
        if self.health is not None:
            self.health.stop()
        self._stop_loop()
        self.routes.close()

    def serving(self) -> bool:
        """The main listener's loop runs: its thread is alive and it turned in the last
        LOOP_STALL seconds (a flood makes each turn longer, never this long). What the health
        listener adds to `healthy`, so that a wedged main loop still fails the probe."""
        return self._thread.is_alive() and time.monotonic() - self._last_turn < LOOP_STALL

    # ------------------------------------------------------------------ the loop

    async def _main(self) -> None:
        loop, stopping = self._enter_loop()
        loop.set_exception_handler(self._loop_error)
        try:
            server = await asyncio.start_server(self._client, sock=self.sock,
                                                limit=MAX_HEADER_BYTES, backlog=LISTEN_BACKLOG)
            self.sock.listen(KERNEL_BACKLOG)  # asyncio re-listened with its accept burst
        finally:
            self._started.set()
        ticking = asyncio.ensure_future(self._tick())
        async with server:
            await stopping.wait()
            ticking.cancel()
            server.close()
            for conn in list(self._conns):
                conn.abort()
            if self.kube_auth is not None:
                try:
                    await asyncio.wait_for(self.kube_auth.aclose(), 2)
                except Exception:  # noqa: BLE001 - stopping: the API client's close is best effort
                    pass

    async def _tick(self) -> None:
        while True:
            self._last_turn = time.monotonic()
            await asyncio.sleep(1)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio's own reports (accept() out of descriptors, a transport error): rate-limited.
        exc = context.get("exception")
        self.failures.note(f"loop:{type(exc).__name__}", "HTTP event loop: %s: %s",
                           context.get("message"), exc, level=logging.WARNING)

    def _admit(self, conn: _Conn) -> bool:
        """Count a new connection in; at the cap, make room by closing the oldest connection
        not being answered right now. A new scraper is the newest and sends its request at
        once, so whatever holds the other connections (a slowloris, a flood of kept-alive
        clients), it is answered; a kept-alive Prometheus connection closed this way is simply
        made again at its next scrape."""
        if len(self._conns) >= self.max_connections:
            victim = next((c for c in self._conns if c.waiting), None)
            if victim is None:  # every connection is being answered: this one waits its turn
                self.failures.note("cap", "%d connections open, all busy: closing new ones",
                                   len(self._conns), level=logging.WARNING)
                return False
            self.evicted += 1
            self.failures.note("evict", "%d connections open (the cap): closing the oldest one "
                               "not being answered to make room", len(self._conns),
                               level=logging.WARNING)
            victim.abort()
            self._conns.pop(victim, None)
        self._conns[conn] = None
        return True

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = (writer.get_extra_info("peername") or ("?",))[0]
        _no_delay(writer)
        ctx = self.web.ssl_context
        conn = _Conn(Plain(reader, writer) if ctx is None else Tls(reader, writer, ctx), peer)
        if not self._admit(conn):
            conn.abort()
            return
        try:
            if isinstance(conn.stream, Tls) and not await self._handshake(conn, conn.stream):
                return
            await self._serve(conn, conn.stream)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            self.failures.note(f"gone:{type(e).__name__}", "client %s went away mid-request: "
                               "%s", peer, type(e).__name__)
        except Exception:  # noqa: BLE001 (a bug: logged, once a minute, with its traceback)
            self.failures.note("bug", "answering %s failed", peer, level=logging.ERROR,
                               exc_info=True)
        finally:
            await self._close(conn)

    async def _close(self, conn: _Conn) -> None:
        """Flush what is still buffered, then close; a client that does not take it within
        WRITE_TIMEOUT is cut. Counted against the cap (and evictable) until it is gone."""
        conn.waiting = True
        try:
            conn.stream.goodbye()
            conn.writer.close()
            await asyncio.wait_for(conn.writer.wait_closed(), WRITE_TIMEOUT)
        except Exception:  # noqa: BLE001 (reset, TLS close_notify refused, timeout: all "gone")
            conn.abort()
        finally:
            self._conns.pop(conn, None)
            conn.stream.release()
            delay = self.trimmer.closed()
            if delay is not None:  # a burst of connections: give the freed heap back after it
                asyncio.get_running_loop().call_later(delay, self.trimmer.trim)

    async def _handshake(self, conn: _Conn, stream: Tls) -> bool:
        try:
            await asyncio.wait_for(stream.handshake(), HANDSHAKE_TIMEOUT)
        except (ssl.SSLError, OSError, TimeoutError) as e:
            # Wrong version, no or bad client certificate, a port scanner: the client's problem.
            reason = getattr(e, "verify_message", None) or getattr(e, "reason", None) \
                or type(e).__name__
            if getattr(e, "reason", None) == "HTTP_REQUEST":
                # Plain HTTP to the TLS port: answer it in HTTP, as Go's servers do, so curl
                # and a misconfigured scraper say what is wrong instead of "empty reply".
                conn.writer.write(PLAIN_HTTP_TO_TLS)
            self.failures.note(f"tls:{reason}", "TLS handshake with %s failed: %s",
                               conn.peer, e)
            return False
        if not peer_san_allowed(stream.getpeercert(), self.web.client_allowed_sans):
            self.failures.note("san", "client certificate of %s: no SAN in "
                               "client_allowed_sans", conn.peer)
            return False
        return True

    # ------------------------------------------------------------------ one connection

    async def _serve(self, conn: _Conn, stream: Plain) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        first = True
        while True:
            conn.waiting = True
            try:
                request = await self._read_head(h, stream, first)
            except h11.RemoteProtocolError as e:
                status = 431 if e.error_status_hint == 431 else 400
                self.failures.note(f"bad:{status}", "bad request from %s: %s", conn.peer, e)
                await self._send_raw(stream, status)
                return
            if request is None:
                return
            conn.waiting = False
            first = False
            if len(request.headers) > MAX_HEADERS or _head_size(request) > MAX_HEADER_BYTES:
                # h11 bounds a head still arriving; this bounds one that arrived whole.
                self.failures.note("bad:431", "request from %s: %d headers, %d bytes (bounds: "
                                   "%d, %d)", conn.peer, len(request.headers),
                                   _head_size(request), MAX_HEADERS, MAX_HEADER_BYTES)
                await self._send_raw(stream, 431)
                return
            # A request with a body (a GET has none) is answered, then the connection closed:
            # reading a body nobody asked for is work an attacker would choose.
            has_body = h.their_state is h11.SEND_BODY \
                and not isinstance(h.next_event(), h11.EndOfMessage)
            code, ctype, body, headers = await self.routes.respond(
                request, conn.peer, lambda evictable: setattr(conn, "waiting", evictable))
            # Evictable again while its answer drains: a client slow to read it (or one that
            # never does) must not keep a newer scraper out.
            conn.waiting = True
            await self._send(h, stream, request, code, ctype, body, headers, close=has_body)
            self._access(conn.peer, request, code, len(body))
            if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                return
            h.start_next_cycle()

    async def _read_head(self, h: h11.Connection, stream: Plain,
                         first: bool) -> h11.Request | None:
        """The next request's head, None when the client closed or ran out of time. A new
        connection has HEADER_TIMEOUT for its first request; a kept-alive one may stay idle for
        IDLE_TIMEOUT, then has HEADER_TIMEOUT from the first byte of the next request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (HEADER_TIMEOUT if first else IDLE_TIMEOUT)
        started = first
        while True:
            event = h.next_event()
            if isinstance(event, h11.Request):
                return event
            if event is not h11.NEED_DATA:  # ConnectionClosed, or a pause we never cause
                return None
            remaining = deadline - loop.time()
            if remaining <= 0:
                if started:
                    self.failures.note("timeout", "request head not finished in %.0f s: "
                                       "closing", HEADER_TIMEOUT)
                return None
            try:
                data = await asyncio.wait_for(stream.read(), remaining)
            except TimeoutError:
                continue
            if data and not started:
                started, deadline = True, loop.time() + HEADER_TIMEOUT
            h.receive_data(data)  # b"" is the end of the stream

    # ------------------------------------------------------------------ writing

    async def _send(self, h: h11.Connection, stream: Plain,
                    request: h11.Request, code: int, ctype: str, body: bytes,
                    headers: dict[str, str], close: bool) -> None:
        fields = [("Content-Type", ctype), ("Content-Length", str(len(body))),
                  *self.extra_headers.items(), *headers.items()]
        if close:
            fields.append(("Connection", "close"))
        stream.write(h.send(h11.Response(status_code=code, headers=fields,
                                         reason=HTTPStatus(code).phrase.encode())))
        if request.method != b"HEAD":  # the shared rendering, not a copy (sent as far as it goes)
            stream.write(h.send(h11.Data(data=body)))
        stream.write(h.send(h11.EndOfMessage()))
        await asyncio.wait_for(stream.drain(), WRITE_TIMEOUT)

    async def _send_raw(self, stream: Plain, code: int) -> None:
        """An error answer outside h11's state machine (after h11 gave up on the request)."""
        reason = {400: "Bad Request", 408: "Request Timeout",
                  431: "Request Header Fields Too Large"}[code]
        body = f"{reason}\n".encode()
        stream.write(f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        try:
            await asyncio.wait_for(stream.drain(), WRITE_TIMEOUT)
        except (OSError, TimeoutError):
            pass

    def _access(self, peer: str, request: h11.Request, code: int, size: int) -> None:
        if log.isEnabledFor(logging.DEBUG):  # scrapes every few seconds: debug, not info
            log.debug('%s "%s %s HTTP/%s" %d %d', peer, request.method.decode("ascii", "replace"),
                      request.target[:200].decode("latin-1"),
                      request.http_version.decode("ascii", "replace"), code, size)


def _head_size(request: h11.Request) -> int:
    """The request head's size on the wire, near enough (": " and CRLF counted per header)."""
    return len(request.method) + len(request.target) + 12 + sum(
        len(k) + len(v) + 4 for k, v in request.headers) + 2


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """An answer goes out in several writes (head, the shared body, the end): with Nagle on, a
    kept-alive scraper waits for its own delayed ACK, 40 ms a scrape. asyncio sets TCP_NODELAY
    only on sockets whose proto says IPPROTO_TCP, which a socket made with proto 0 (ours, and
    so every accepted one) does not."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
