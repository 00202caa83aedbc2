"""Attacks on the HTTP endpoint, shared by tests/e2e/test_web_attacks.py and
bench/web_attacks.py: slowloris, unfinished requests with huge headers, clients that vanish
mid-request, and a legitimate scraper that records what it got while they run.

Everything talks to 127.0.0.1 only.
"""
from __future__ import annotations

import http.client
import resource
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testkit.clients import ClientThreads


def raise_fd_limit(want: int) -> None:
    """The attacks hold thousands of sockets: lift this process's soft limit (not past hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def proc_status(pid: int) -> dict[str, int]:
    """RSS (bytes), threads and open file descriptors of a process."""
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            status["rss"] = int(value.split()[0]) * 1024
        elif key == "Threads":
            status["threads"] = int(value)
    status["fds"] = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return status


class Peak:
    """Samples proc_status(pid) every 50 ms in a thread; keeps the maximum of each field."""

    def __init__(self, pid: int):
        self.pid = pid
        self.max: dict[str, int] = proc_status(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                now = proc_status(self.pid)
            except OSError:
                return
            for k, v in now.items():
                self.max[k] = max(self.max.get(k, 0), v)

    def __enter__(self) -> "Peak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def _connect(port: int) -> socket.socket | None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return None
    s.setblocking(False)
    return s


class Slowloris:
    """`n` connections that each send a request head one header line at a time, one line every
    `interval` seconds, and never finish it. A connection the server closes is re-opened (the
    attacker keeps the pressure up); `closed_by_server` counts how often that happened."""

    def __init__(self, port: int, n: int, interval: float = 1.0):
        self.port, self.n, self.interval = port, n, interval
        self.socks: list[socket.socket] = []
        self.closed_by_server = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        s = _connect(self.port)
        if s is not None:
            try:
                s.send(b"GET /metrics HTTP/1.1\r\nHost: victim\r\n")
            except OSError:
                s.close()
                return None
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, s in enumerate(self.socks):
                try:
                    s.send(b"X-a: b\r\n")
                    if s.recv(4096) == b"":  # the server answered and closed, or just closed
                        raise ConnectionResetError
                except BlockingIOError:
                    continue  # nothing to read: the connection is still held open
                except OSError:
                    self.closed_by_server += 1
                    s.close()
                    self.socks[i] = self._open() or s
            self._stop.wait(self.interval)

    def __enter__(self) -> "Slowloris":
        for _ in range(self.n):
            s = self._open()
            if s is not None:
                self.socks.append(s)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            s.close()


class BigHeaders(ClientThreads):
    """`n` connections, each sending a request line and `headers` headers of `size` bytes, and
    then holding the request open unfinished (no blank line)."""

    def __init__(self, port: int, n: int = 100, headers: int = 99, size: int = 64 * 1024):
        self.port, self.n, self.headers, self.size = port, n, headers, size
        self.refused = 0  # connections the server cut (or answered 431) before we were done
        self.answers: list[bytes] = []
        super().__init__(n, lambda i: self._one())

    def _one(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError:
            return
        with s:
            try:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: victim\r\n")
                for i in range(self.headers):
                    s.sendall(b"X-Big-%d: " % i + b"a" * self.size + b"\r\n")
                self._stop.wait(30)  # hold it, unfinished
            except OSError:
                try:
                    answer = s.recv(200)
                except OSError:
                    answer = b""
                with self._lock:
                    self.refused += 1
                    self.answers.append(answer)


def vanish_mid_request(port: int, n: int, path: str = "/metrics") -> None:
    """`n` clients that send a whole request and reset the connection (RST, SO_LINGER 0)
    without reading the answer, plus `n` that reset half-way through the request line."""
    linger = struct.pack("ii", 1, 0)
    for i in range(2 * n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        try:
            if i % 2:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: v\r\n\r\n".encode())
                time.sleep(0.002)  # let the server start writing into a socket about to vanish
            else:
                s.sendall(b"GET /met")
        except OSError:
            pass
        s.close()


@dataclass
class Scraper:
    """A legitimate scraper: GET `path` every `interval` s, each on a new connection, with
    `timeout` as its client timeout (Prometheus' scrape_timeout). Records status and latency."""

    port: int
    path: str = "/metrics"
    interval: float = 0.1
    timeout: float = 5.0
    connection: type = http.client.HTTPConnection
    kwargs: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    results: list[tuple[int | str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def once(self) -> tuple[int | str, float]:
        start = time.monotonic()
        conn = self.connection("127.0.0.1", self.port, timeout=self.timeout, **self.kwargs)
        try:
            conn.request("GET", self.path, headers=self.headers)
            r = conn.getresponse()
            body = r.read()
            got: int | str = r.status if (r.status != 200 or b"# TYPE" in body) else "empty"
        except (OSError, http.client.HTTPException) as e:
            got = type(e).__name__
        finally:
            conn.close()
        return got, time.monotonic() - start

    def _run(self) -> None:
        while not self._stop.is_set():
            self.results.append(self.once())
            self._stop.wait(self.interval)

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    @property
    def failures(self) -> list[tuple[int | str, float]]:
        return [r for r in self.results if r[0] != 200]

    def quantile(self, q: float) -> float:
        times = sorted(t for _, t in self.results)
        return times[min(len(times) - 1, int(q * len(times)))] if times else float("nan")


class AcceptVariants(ClientThreads):
    """`n` clients scraping back to back on kept-alive connections, client i asking for
    OpenMetrics with its own `version=1.0.i` (valid, all meaning 1.0): before the rendering
    cache was keyed by the negotiated format, each was a rendering of its own. `answered`
    counts 200s."""

    join_timeout = 35.0

    def __init__(self, port: int, n: int, accept: str = "application/openmetrics-text; "
                 "version=1.0.{i}", connection: type = http.client.HTTPConnection,
                 kwargs: dict | None = None):
        self.port, self.n, self.accept = port, n, accept
        self.connection, self.kwargs = connection, kwargs or {}
        self.answered = 0
        super().__init__(n, self._one)

    def _one(self, i: int) -> None:
        headers = {"Accept": self.accept.format(i=i)}
        conn = None
        while not self._stop.is_set():
            if conn is None:
                conn = self.connection("127.0.0.1", self.port, timeout=30, **self.kwargs)
            try:
                conn.request("GET", "/metrics", headers=headers)
                r = conn.getresponse()
                r.read()
                if r.status == 200:
                    with self._lock:
                        self.answered += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = None
                self._stop.wait(0.1)
        if conn is not None:
            conn.close()


def half_client_hello(claimed: int = 131_000, sent: int = 1000) -> bytes:
    """The start of a TLS ClientHello that claims `claimed` bytes of handshake message and
    carries only `sent` of them: a TLS record header (handshake, TLS 1.0, a full record), the
    handshake header (ClientHello, its length), then filler."""
    record = min(claimed + 4, 16384)
    return (bytes([22, 3, 1]) + record.to_bytes(2, "big") + bytes([1])
            + claimed.to_bytes(3, "big") + bytes([3, 3]) + b"\x00" * (sent - 2))


class HalfHellos:
    """`n` connections that each send half a ClientHello and wait; a connection the server
    closes (its handshake timeout) is opened again at once, for as long as the attack lasts.
    `opened` counts connections made."""

    def __init__(self, port: int, n: int, hello: bytes | None = None):
        self.port, self.n = port, n
        self.hello = hello if hello is not None else half_client_hello()
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._socks: list[socket.socket | None] = [None] * n

    def _open(self) -> socket.socket | None:
        s = _connect(self.port)
        if s is None:
            return None
        try:
            s.setblocking(True)
            s.sendall(self.hello)
            s.setblocking(False)
        except OSError:
            s.close()
            return None
        self.opened += 1
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, s in enumerate(self._socks):
                if s is not None:
                    try:
                        if s.recv(4096) == b"":
                            raise ConnectionResetError
                        continue  # an alert: the server refused; read until it closes
                    except BlockingIOError:
                        continue  # still held open by the server
                    except OSError:
                        s.close()
                self._socks[i] = self._open()
            self._stop.wait(0.2)

    def __enter__(self) -> "HalfHellos":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self._socks:
            if s is not None:
                s.close()
