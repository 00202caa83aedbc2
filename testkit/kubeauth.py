"""A real `run` with --web.auth=kubernetes against the fake API server, and HTTPS clients that
present bearer tokens: shared by tests/e2e/test_web_kube_auth.py and bench/web_attacks.py.

Everything talks to 127.0.0.1 only.
"""
from __future__ import annotations

import http.client
import ssl
import time

from testkit.clients import ClientThreads
from testkit.exporter_proc import RunningExporter

QUICK = ("--source", "uevent", "--kubernetes", "off")  # no BPF compile: these tests are HTTP
PROMETHEUS = "system:serviceaccount:monitoring:prometheus-k8s"


def insecure_context() -> ssl.SSLContext:
    """What the ServiceMonitor does with the generated certificate: TLS, no verification."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def bearer_get(port: int, path: str = "/metrics", token: str | None = None,
               timeout: float = 10.0, ctx: ssl.SSLContext | None = None,
               header: str | None = None, source: str | None = None):
    """(status, headers, body), or the exception the connection raised. `source`: the client
    address to connect from (127.0.0.2, 127.0.0.3 ... are loopback too on Linux), so that the
    server sees distinct clients."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx or insecure_context(),
                                       timeout=timeout,
                                       source_address=(source, 0) if source else None)
    headers = {}
    if header is not None:
        headers["Authorization"] = header
    elif token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    except (ssl.SSLError, OSError, http.client.HTTPException) as e:
        return e
    finally:
        conn.close()


def peer_certificate(port: int) -> bytes:
    """The DER certificate the server presents."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with insecure_context().wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


class KubeAuthExporter(RunningExporter):
    """`run --web.auth=kubernetes` against `kubeconfig`; ready when /healthz answers over TLS."""

    def __init__(self, kubeconfig: str, *args: str):
        super().__init__(*QUICK, "--web.auth", "kubernetes", "--kubeconfig", kubeconfig,
                         "--node-name", "auth-node", *args)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        got = bearer_get(self.port, "/healthz", timeout=1)
        return isinstance(got, tuple) and got[0] == 200


class BearerFlood(ClientThreads):
    """`connections` kept-alive HTTPS connections sending GET /metrics back to back, each with
    a bearer token from `tokens(i)` (i counts requests): statuses counted by code."""

    join_timeout = 15.0

    def __init__(self, port: int, tokens, connections: int = 8, rate: float | None = None,
                 sources: tuple[str, ...] = ("127.0.0.1",), path: str = "/metrics"):
        """`rate`: requests per second in all (paced by each connection), None for as fast as
        the server answers; connection i connects from sources[i % len(sources)]; `path`: what
        it GETs."""
        self.port, self.tokens, self.connections, self.path = port, tokens, connections, path
        self.rate, self.sources = rate, sources
        self.statuses: dict[int | str, int] = {}
        self.by_source: dict[str, set[int | str]] = {}  # the statuses each source address got
        self.sent = 0
        super().__init__(connections, self._run)

    def _run(self, n: int) -> None:
        conn = None
        source = self.sources[n % len(self.sources)]
        period = self.connections / self.rate if self.rate else 0.0
        next_at = time.monotonic()
        while not self._stop.is_set():
            if period:  # the pace of a client sending `rate` a second, not a wait for the server
                next_at += period
                if self._stop.wait(max(0.0, next_at - time.monotonic())):
                    break
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", self.port,
                                                   context=insecure_context(), timeout=10,
                                                   source_address=(source, 0))
            with self._lock:
                i = self.sent
                self.sent += 1
            try:
                conn.request("GET", self.path,
                             headers={"Authorization": f"Bearer {self.tokens(i)}"})
                r = conn.getresponse()
                r.read()
                got: int | str = r.status
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                got = type(e).__name__
                conn.close()
                conn = None
            with self._lock:
                self.statuses[got] = self.statuses.get(got, 0) + 1
                self.by_source.setdefault(source, set()).add(got)
        if conn is not None:
            conn.close()

    def __enter__(self) -> "BearerFlood":
        self.started = time.monotonic()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.elapsed = time.monotonic() - self.started


class ScriptedReviews:
    """A ReviewClient without a server, for exporter.web.kubeauth.KubeAuth in unit tests:
    `users` maps a token to its username (anything else is not authenticated), `granted` the
    usernames allowed; `posts` counts calls by path; `hang` makes every call wait forever."""

    def __init__(self, users: dict[str, str], granted: set[str], hang: bool = False):
        self.users, self.granted, self.hang = users, granted, hang
        self.posts: dict[str, int] = {}

    async def post(self, path: str, body: dict) -> dict:
        import asyncio
        self.posts[path] = self.posts.get(path, 0) + 1
        if self.hang:
            await asyncio.Event().wait()
        spec = body["spec"]
        if body["kind"] == "TokenReview":
            name = self.users.get(spec["token"])
            status = {"authenticated": True, "user": {"username": name, "groups": []}} \
                if name else {"user": {}, "error": "invalid bearer token"}
        else:
            status = {"allowed": spec["user"] in self.granted}
        return {**body, "status": status}

    async def aclose(self) -> None:
        pass


class FloodProcess:
    """A BearerFlood in a child process (`python -m testkit.kubeauth`), so that hundreds of
    client threads do not hold the GIL of the test that measures the server beside them. Its
    statuses so far come as one JSON line a few times a second; `statuses` is the last."""

    def __init__(self, port: int, token: str, connections: int):
        self.args = [str(port), token, str(connections)]
        self.statuses: dict[str, int] = {}

    def __enter__(self) -> "FloodProcess":
        import subprocess
        import sys
        import threading

        from testkit.exporter_proc import REPO

        self.proc = subprocess.Popen([sys.executable, "-m", "testkit.kubeauth", *self.args],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        import json
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.statuses = json.loads(line)

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the child stops its flood at EOF
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)


class WrkFlood:
    """Debian's wrk against https://127.0.0.1:`port`/metrics: `connections` kept-alive TLS
    connections on `threads` threads, each request with a new made-up bearer token
    (testkit/wrk_flood.lua), as fast as the exporter answers; from 127.0.0.1 (the kernel's
    source address for loopback). `answers` and `throttled` (429s) so far, from the script's
    progress lines; after the block, `rate` (wrk's "Requests/sec"), `statuses` by code and
    `report` (wrk's output)."""

    def __init__(self, port: int, connections: int = 8, threads: int = 2,
                 seconds: int = 300):
        self.argv = ["wrk", "--latency", "-t", str(threads), "-c", str(connections),
                     "-d", f"{seconds}s", "-s", "testkit/wrk_flood.lua",
                     f"https://127.0.0.1:{port}/metrics"]
        self.progress: dict[int, tuple[int, int]] = {}  # thread -> (answers, 429s)
        self.statuses: dict[int, int] = {}
        self.rate = 0.0
        self.lines: list[str] = []

    @property
    def answers(self) -> int:
        return sum(a for a, _ in self.progress.values())

    @property
    def throttled(self) -> int:
        return sum(t for _, t in self.progress.values())

    @property
    def report(self) -> str:
        return "\n".join(line for line in self.lines if not line.startswith("progress "))

    def __enter__(self) -> "WrkFlood":
        import subprocess
        import threading

        from testkit.exporter_proc import REPO

        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            words = line.split()
            if words[:1] == ["progress"] and len(words) == 4:
                self.progress[int(words[1])] = (int(words[2]), int(words[3]))
            elif words[:1] == ["status"] and len(words) == 3:
                self.statuses[int(words[1])] = int(words[2])
            elif words[:1] == ["Requests/sec:"]:
                self.rate = float(words[1])

    def __exit__(self, *exc: object) -> None:
        import signal
        import subprocess
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # wrk stops and prints its report
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)


def _flood_main(port: str, token: str, connections: str) -> None:
    import json
    import sys
    import threading

    from testkit.web_attacks import raise_fd_limit

    raise_fd_limit(4 * int(connections) + 64)
    eof = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), eof.set()), daemon=True).start()
    with BearerFlood(int(port), lambda i: token, int(connections)) as flood:
        while not eof.wait(0.3):
            print(json.dumps({str(k): v for k, v in flood.statuses.items()}), flush=True)
    print(json.dumps({str(k): v for k, v in flood.statuses.items()}), flush=True)


if __name__ == "__main__":
    import sys
    _flood_main(*sys.argv[1:4])
