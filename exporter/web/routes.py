"""What each path of the HTTP endpoint answers: the telemetry path (the shared rendering, on a
small thread pool), /healthz, the index page; basic auth with its cache checked on the event
loop and bcrypt on a bounded pool (AUTH_THREADS at once, AUTH_WAIT for a slot, then 429), or
Kubernetes bearer tokens (exporter/web/kubeauth.py) on the telemetry path.
exporter/web/server.py owns the connections; this module sees one parsed request at a time.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import html
import time
from typing import Callable

import h11

from exporter.web.auth import AUTH_CONCURRENCY, AUTH_WAIT, AuthBusy, BasicAuth
from exporter.web.exposition import Exposition
from exporter.web.kubeauth import REFUSALS, KubeAuth, Verdict, WebAuthStats
from exporter.web.kubeauth import _Bucket as Bucket

RENDER_THREADS = 2
AUTH_THREADS = AUTH_CONCURRENCY  # more threads would only wait for a slot
AUTH_QUEUE = 32  # requests waiting for a bcrypt slot (AUTH_WAIT at most); past it 429 at once
REALM = 'Basic realm="node-resize-exporter", charset="UTF-8"'
INDEX = """<html><head><title>node-resize-exporter</title></head><body>
<h1>node-resize-exporter</h1><p><a href="{path}">Metrics</a> <a href="/healthz">Health</a></p>
</body></html>"""

Response = tuple[int, str, bytes, dict[str, str]]  # status, content type, body, more headers
# GET /plan (exporter/sinks/plan_collector.py): its answer for a query string, computed off the
# loop.
PLAN_PATH = "/plan"
PLAN_RATE, PLAN_BURST = 2.0, 5  # plans per second, and at once; past it 429
Plan = Callable[[str], tuple[int, bytes]]


class Routes:
    def __init__(self, exposition: Exposition, auth: BasicAuth, healthy: Callable[[], bool],
                 telemetry_path: str, kube_auth: KubeAuth | None = None,
                 stats: WebAuthStats | None = None, plan: Plan | None = None,
                 plan_auth: KubeAuth | None = None):
        if not telemetry_path.startswith("/") or telemetry_path in ("/", "/healthz") \
                or any(c in telemetry_path for c in "?# \r\n\"<>"):
            raise ValueError(f"--web.telemetry-path {telemetry_path!r}: must be a path such as "
                             "/metrics (starting with /, not / or /healthz)")
        if plan is not None and telemetry_path == PLAN_PATH:
            raise ValueError(f"--web.telemetry-path {PLAN_PATH}: the plan's path; choose "
                             "another, such as /metrics")
        self.exposition = exposition
        self.auth = auth
        self.kube_auth = kube_auth
        self.stats = stats or WebAuthStats()
        self.healthy = healthy
        self.telemetry_path = telemetry_path
        self.index = INDEX.format(path=html.escape(telemetry_path, quote=True)).encode()
        self._auth_waiting = 0
        self.plan, self.plan_auth = plan, plan_auth
        self._plans = Bucket(PLAN_RATE, float(PLAN_BURST), time.monotonic)
        self._planning = False
        self._auth_slots = asyncio.Semaphore(AUTH_THREADS)
        self._render_pool = concurrent.futures.ThreadPoolExecutor(RENDER_THREADS, "http-render")
        self._bcrypt_pool = concurrent.futures.ThreadPoolExecutor(AUTH_THREADS, "http-auth")

    def close(self) -> None:
        self._render_pool.shutdown(wait=False, cancel_futures=True)
        self._bcrypt_pool.shutdown(wait=False, cancel_futures=True)

    async def respond(self, request: h11.Request, peer: str = "",
                      evictable: Callable[[bool], None] = lambda _: None) -> Response:
        """The answer to one request from `peer`. `evictable(True)` while it only waits on
        someone else's work (a token review): the server may close it to make room."""
        method = request.method.decode("ascii", "replace")
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n", {"Allow": "GET, HEAD"}
        if path == PLAN_PATH and self.plan is not None:
            return await self._plan(request, peer, evictable)
        if path == self.telemetry_path and self.kube_auth is not None:
            # Only the telemetry path is protected: /healthz is for probes, and the index
            # page and 404s are constant text.
            refused = await self._refused(request, peer, evictable, self.kube_auth)
            if refused is not None:
                return refused
        elif path != "/healthz" and self.auth.enabled:
            refused = await self._refused(request, peer, evictable, None,
                                          counted=path == self.telemetry_path)
            if refused is not None:
                return refused
        if path == self.telemetry_path:
            accept, encoding = _header(request, b"accept"), _header(request, b"accept-encoding")
            rendering = self.exposition.cached(accept, encoding)
            if rendering is None:  # render (or wait for the one under way) off the loop
                loop = asyncio.get_running_loop()
                rendering = await loop.run_in_executor(self._render_pool, self.exposition.get,
                                                       accept, encoding)
            extra = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} \
                if rendering.gzipped else {"Vary": "Accept-Encoding"}
            return 200, rendering.content_type, rendering.body, extra
        if path == "/healthz":
            ok = self.healthy()
            return (200, "text/plain", b"ok\n", {}) if ok else (503, "text/plain", b"down\n", {})
        if path == "/":
            return 200, "text/html; charset=utf-8", self.index, {}
        return 404, "text/plain", b"not found\n", {}

    async def _plan(self, request: h11.Request, peer: str,
                    evictable: Callable[[bool], None]) -> Response:
        """GET /plan: behind the telemetry path's authentication (a SubjectAccessReview on
        /plan with --web.auth=kubernetes, budgeted per client address as the telemetry path's
        is, its wait evictable), PLAN_RATE a second and one at a time (429 past it), computed
        on the render pool."""
        assert self.plan is not None
        if self.plan_auth is not None or self.auth.enabled:
            refused = await self._refused(request, peer, evictable, self.plan_auth)
            if refused is not None:
                return refused
        query = request.target.partition(b"?")[2].decode("latin-1")
        malformed = getattr(self.plan, "malformed", None)  # PlanSink.endpoint()
        bad = malformed(query) if malformed is not None else None
        if bad is not None:  # a malformed question: 400 with the fix, no plan budget spent
            return 400, "application/json", bad, {"Cache-Control": "no-store"}
        if self._planning or not self._plans.take():
            return 429, "application/json", b'{"error": "too many plans at once", ' \
                b'"fix": "ask again in a second"}\n', {"Retry-After": "1"}
        self._planning = True
        try:
            loop = asyncio.get_running_loop()
            code, body = await loop.run_in_executor(self._render_pool, self.plan, query)
        finally:
            self._planning = False
        return code, "application/json", body, {"Cache-Control": "no-store"}

    async def _refused(self, request: h11.Request, peer: str,
                       evictable: Callable[[bool], None], kube: KubeAuth | None, *,
                       counted: bool = False) -> Response | None:
        """The answer that refuses `request` (a bearer token's review with `kube`, else basic
        auth), or None when it may go on. `counted`: the basic-auth verdict goes into the
        telemetry path's statistics."""
        if kube is not None:
            decision = await self._kube_authorize(kube, request, peer, evictable)
            if decision is Verdict.ALLOWED:
                return None
            code, text, headers = REFUSALS[decision]
            return code, "text/plain", text, headers
        verdict = await self._authorized(request)
        if counted:
            self.stats.decided(Verdict.THROTTLED if verdict is None else
                               Verdict.ALLOWED if verdict else Verdict.UNAUTHENTICATED)
        if verdict is None:
            return 429, "text/plain", b"too many password checks at once\n", \
                {"Retry-After": "1"}
        if not verdict:
            return 401, "text/plain", b"Unauthorized\n", {"WWW-Authenticate": REALM}
        return None

    @staticmethod
    async def _kube_authorize(auth: KubeAuth, request: h11.Request, peer: str,
                              evictable: Callable[[bool], None]) -> Verdict:
        """A bearer token's verdict, the review budgeted per `peer`'s address; the request
        is evictable while it waits (on its own review or on someone else's)."""
        evictable(True)
        try:
            return await auth.authorize(_header(request, b"authorization"), peer)
        finally:
            evictable(False)

    async def _authorized(self, request: h11.Request) -> bool | None:
        """True/False, or None when bcrypt is saturated (the caller answers 429)."""
        scheme, _, encoded = _header(request, b"authorization").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.decode("utf-8", "surrogateescape").partition(":")
        if not sep:
            return False
        if self.auth.cached(user, password):  # the common case: no thread, no bcrypt
            return True
        if self._auth_waiting >= AUTH_QUEUE:
            return None
        self._auth_waiting += 1
        try:
            # Wait briefly for a bcrypt slot, then 429: a queue of guesses must not delay the
            # answer to a real scraper by seconds.
            await asyncio.wait_for(self._auth_slots.acquire(), AUTH_WAIT)
        except TimeoutError:
            return None
        finally:
            self._auth_waiting -= 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._bcrypt_pool, self.auth.check, user,
                                              password)
        except AuthBusy:
            return None
        finally:
            self._auth_slots.release()


def _header(request: h11.Request, name: bytes) -> str:
    return ", ".join(v.decode("latin-1") for k, v in request.headers if k == name)
