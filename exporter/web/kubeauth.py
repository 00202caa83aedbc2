"""`--web.auth=kubernetes`: scrapers present a Kubernetes bearer token; the API server says who
it is (TokenReview, authentication.k8s.io/v1) and whether it may `get` the telemetry path
(SubjectAccessReview, authorization.k8s.io/v1, nonResourceAttributes). The kubelet's webhook
authentication and authorization, kube-rbac-proxy and controller-runtime's secure metrics
serving all do the same; Prometheus sends its service account token.

Anyone who can reach the port can send a token, so what a request may cost is bounded before
any API call:
- the request head is bounded by the HTTP server (16 KiB: a 1 MB token is 431 before it gets
  here), a token longer than MAX_TOKEN_BYTES or with characters no token has is refused here;
- decisions are cached per token, under an HMAC of it with a per-process random key (no token
  is kept in clear), at most CACHE_SIZE entries, allowed ones for ALLOWED_TTL, refused ones
  (unauthenticated or denied) for DENIED_TTL: the kubelet's and kube-rbac-proxy's defaults;
- concurrent requests with the same token wait for one review (no review per request), at
  most MAX_WAITERS of them; past that the answer is 429 at once;
- reviews of tokens not in the cache are budgeted per client address (PER_ADDRESS_RATE per
  second, PER_ADDRESS_BURST at once, PER_ADDRESS_IN_FLIGHT at a time; IPv6 addresses by /64),
  so a flood of made-up tokens spends its own address's budget and no one else's. Addresses
  that had no token allowed in the last hour also share one budget (REVIEW_RATE per second,
  REVIEW_BURST at once, MAX_IN_FLIGHT at a time), which bounds the reviews a flood from many
  addresses can cause; an address that had a token allowed in the last hour (KNOWN_GOOD_SIZE
  of them) is reviewed outside that shared budget, and a token allowed in the last hour is
  re-reviewed outside every budget. An address's first review (a scraper never seen before)
  may also come from a budget of its own (NEWCOMER_RATE per second, NEWCOMER_BURST at once),
  which a flood from addresses already reviewed cannot spend: only one from addresses never
  seen before can. Past a budget the answer is 429 at once. The API server
  decides every token this process has not decided itself: nothing is allowed without a
  review, and nothing survives a restart (docs/security.md has the guarantee and its limits);
- a review that takes more than REVIEW_TIMEOUT fails the scrape (503), never the exporter: it
  runs on the web server's event loop (asyncio, no thread per request), and API failures are
  not cached, so the next scrape tries again. A token allowed in the last ALLOWED_TTL keeps
  scraping while the API server is down.
Every decision and every review is counted (WebAuthStats, node_resize_exporter_web_auth_*) and
API failures are logged at most once a minute per kind.
"""
from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from exporter.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

ALLOWED_TTL = 120.0  # the kubelet's authentication webhook cache (2 min): a revoked token stops
DENIED_TTL = 30.0  # the kubelet's and kube-rbac-proxy's unauthorized cache
CACHE_SIZE = 1024  # tokens remembered (a few scrapers, plus whatever an attacker sends)
REVIEW_TIMEOUT = 3.0  # seconds for TokenReview + SubjectAccessReview; a scrape times out at 10
MAX_IN_FLIGHT = 4  # reviews at once for addresses not known good
MAX_REVIEWS = 8  # reviews at once in all; also the API client's connection pool
MAX_WAITERS = 32  # requests waiting on one token's review; past it 429 at once
REVIEW_RATE = 5.0  # reviews per second for addresses not known good, together ...
REVIEW_BURST = 20  # ... and at once (Prometheus pairs restarting, new scrapers)
PER_ADDRESS_RATE = 1.0  # reviews of new tokens per second from one client address ...
PER_ADDRESS_BURST = 8  # ... and at once (Prometheus replicas behind one address, a few times)
PER_ADDRESS_IN_FLIGHT = 2  # ... and at a time
NEWCOMER_RATE = 2.0  # first reviews of addresses never reviewed before, per second ...
NEWCOMER_BURST = 16  # ... and at once, outside the shared budget
ADDRESSES = 4096  # client addresses whose budget is remembered (least recently used forgotten)
KNOWN_GOOD_SIZE = 64  # tokens, and client addresses, allowed before: reviewed outside the
KNOWN_GOOD_FOR = 3600.0  # shared budget for an hour after they were last allowed
MAX_TOKEN_BYTES = 8192  # a service account JWT is ~1 KiB; kube-apiserver refuses far less
MAX_ANSWER_BYTES = 64 * 1024  # a review's answer is a few hundred bytes
# RFC 6750 b64token: what a bearer token can hold. Anything else is refused without a review.
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]+")

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
REALM = 'Bearer realm="node-resize-exporter"'


class Verdict(enum.Enum):
    """What a request gets: the `result` label of node_resize_exporter_web_auth_total."""

    ALLOWED = "allowed"  # served
    UNAUTHENTICATED = "unauthenticated"  # 401: no token, a malformed one, or one the API refused
    DENIED = "denied"  # 403: a valid token whose user may not get the path
    UNAVAILABLE = "unavailable"  # 503: the API server failed or was too slow to decide
    THROTTLED = "throttled"  # 429: too many reviews of new tokens right now


# status, body, extra headers per refusal
REFUSALS: dict[Verdict, tuple[int, bytes, dict[str, str]]] = {
    Verdict.UNAUTHENTICATED: (401, b"Unauthorized\n", {"WWW-Authenticate": REALM}),
    Verdict.DENIED: (403, b"Forbidden\n", {}),
    Verdict.UNAVAILABLE: (503, b"cannot check the token now\n", {"Retry-After": "1"}),
    Verdict.THROTTLED: (429, b"too many new tokens at once\n", {"Retry-After": "1"}),
}


class ReviewFailed(Exception):
    """The API server did not answer a review usably (down, 5xx, 403 for our own account,
    an answer that is not a review). `kind` is a short fixed word for the log and metrics."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class WebAuthStats:
    """Counters of decisions and API reviews, read by the collector in web/authmetrics.py.
    Bounded: the keys are the Verdict values and (review, result) pairs below."""

    REVIEW_RESULTS = ("answered", "failed", "timeout")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # written on the event loop, read by the render thread
        self.decisions: dict[str, int] = {}
        self.reviews: dict[tuple[str, str], int] = {}

    def decided(self, verdict: Verdict) -> None:
        with self._lock:
            self.decisions[verdict.value] = self.decisions.get(verdict.value, 0) + 1

    def reviewed(self, review: str, result: str) -> None:
        with self._lock:
            self.reviews[(review, result)] = self.reviews.get((review, result), 0) + 1

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self.decisions), dict(self.reviews)


class ReviewClient(Protocol):
    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@dataclass
class _Entry:
    verdict: Verdict
    expires: float


@dataclass
class _Bucket:
    """A token bucket: `rate` per second, at most `burst` saved up."""

    rate: float
    burst: float
    clock: Callable[[], float]
    tokens: float = field(default=0.0)
    at: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.tokens, self.at = self.burst, self.clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class _Address:
    """One client address's review budget."""

    bucket: _Bucket
    in_flight: int = 0
    reviewed: bool = False  # a review of its tokens was let through before


@dataclass
class _Review:
    """A review under way: its answer, and how many requests wait on it."""

    future: asyncio.Future[Verdict]
    waiters: int = 0


def _remember_good(table: OrderedDict[Any, float], key: object, now: float) -> None:
    """`key` allowed at `now`, the table kept to its KNOWN_GOOD_SIZE most recent."""
    table[key] = now
    table.move_to_end(key)
    while len(table) > KNOWN_GOOD_SIZE:
        table.popitem(last=False)


def client_address(peer: str) -> str:
    """The unit a review budget is kept per: the IPv4 address, or the IPv6 /64 (one host
    usually holds a whole /64; an IPv4-mapped address is its IPv4 address)."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return peer  # a unix socket or nothing: one budget for all of them
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class KubeAuth:
    """Bearer tokens checked by the API server, decisions cached. Used from one event loop
    (the web server's): no locks, and no thread per request.

        verdict = await auth.authorize(authorization_header, peer_address)
    """

    def __init__(self, client_factory: Callable[[], ReviewClient], path: str,
                 audiences: tuple[str, ...] = (), *, stats: WebAuthStats | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 allowed_ttl: float = ALLOWED_TTL, denied_ttl: float = DENIED_TTL,
                 cache_size: int = CACHE_SIZE, timeout: float = REVIEW_TIMEOUT,
                 max_in_flight: int = MAX_IN_FLIGHT, rate: float = REVIEW_RATE,
                 burst: int = REVIEW_BURST, max_waiters: int = MAX_WAITERS,
                 address_rate: float = PER_ADDRESS_RATE,
                 address_burst: int = PER_ADDRESS_BURST) -> None:
        self._factory = client_factory
        self._client: ReviewClient | None = None
        self.path = path
        self.audiences = audiences
        self.stats = stats or WebAuthStats()
        self.clock = clock
        self.allowed_ttl, self.denied_ttl = allowed_ttl, denied_ttl
        self.cache_size = cache_size
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.max_waiters = max_waiters
        self.address_rate, self.address_burst = address_rate, float(address_burst)
        self._bucket = _Bucket(rate, float(burst), clock)
        self._newcomers = _Bucket(NEWCOMER_RATE, float(NEWCOMER_BURST), clock)
        self._key = secrets.token_bytes(32)  # the cache key is an HMAC: no token in clear
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._in_flight: dict[bytes, _Review] = {}
        self._strangers_in_flight = 0  # reviews for addresses not known good
        self._known_good: OrderedDict[bytes, float] = OrderedDict()  # key -> last allowed at
        self._addresses: OrderedDict[str, _Address] = OrderedDict()
        self._good_addresses: OrderedDict[str, float] = OrderedDict()  # -> last allowed at
        self.failures = RateLimitedLog(log)

    @property
    def cached_tokens(self) -> int:
        return len(self._cache)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def authorize(self, authorization: str, peer: str = "") -> Verdict:
        verdict = await self._decide(authorization, client_address(peer))
        self.stats.decided(verdict)
        return verdict

    async def _decide(self, authorization: str, address: str) -> Verdict:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_BYTES \
                or not _TOKEN.fullmatch(token):
            return Verdict.UNAUTHENTICATED
        key = hmac.new(self._key, token.encode("ascii"), hashlib.sha256).digest()
        entry = self._cache.get(key)
        if entry is not None:
            if entry.expires > self.clock():
                self._cache.move_to_end(key)
                return entry.verdict
            del self._cache[key]
        review = self._in_flight.get(key)
        if review is not None:  # the same token is being reviewed: share the answer
            if review.waiters >= self.max_waiters:
                self.failures.note("waiters", "more than %d requests waiting on one token's "
                                   "review: answering 429", self.max_waiters,
                                   level=logging.WARNING)
                return Verdict.THROTTLED
            review.waiters += 1
            try:
                return await asyncio.shield(review.future)
            finally:
                review.waiters -= 1
        stranger = self._admit(key, address)
        if stranger is None:
            return Verdict.THROTTLED
        budget = self._addresses.get(address)
        if budget is not None:
            budget.in_flight += 1
        self._strangers_in_flight += stranger
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = _Review(future)
        try:
            verdict = await self._review(token)
            future.set_result(verdict)
        except BaseException:
            future.set_result(Verdict.UNAVAILABLE)
            raise
        finally:
            del self._in_flight[key]
            self._strangers_in_flight -= stranger
            if budget is not None:
                budget.in_flight -= 1
        self._remember(key, address, verdict)
        return verdict

    def _admit(self, key: bytes, address: str) -> int | None:
        """May a review of this token start now? None: no (429); else 1 when it counts against
        the budget shared by addresses not known good, 0 when it does not."""
        now = self.clock()
        if len(self._in_flight) >= MAX_REVIEWS:
            self._throttled("%d reviews at once", MAX_REVIEWS)
            return None
        # A token allowed before (whose decision expired) is reviewed again outside every
        # budget: a flood of new tokens must not lock out the scraper it already knows.
        known = self._known_good.get(key)
        if known is not None and now - known < KNOWN_GOOD_FOR:
            return 0
        budget = self._addresses.get(address)
        if budget is None:
            budget = self._addresses[address] = _Address(
                _Bucket(self.address_rate, self.address_burst, self.clock))
            while len(self._addresses) > ADDRESSES:
                self._addresses.popitem(last=False)
        self._addresses.move_to_end(address)
        if budget.in_flight >= PER_ADDRESS_IN_FLIGHT or not budget.bucket.take():
            self._throttled("more new bearer tokens from %s than %.0f/s (burst %d, %d at "
                            "once)", address, self.address_rate, int(self.address_burst),
                            PER_ADDRESS_IN_FLIGHT)
            return None
        good = self._good_addresses.get(address)
        if good is not None and now - good < KNOWN_GOOD_FOR:
            return 0
        if not budget.reviewed and self._newcomers.take():  # its first: a budget of its own
            budget.reviewed = True
            return 0
        if self._strangers_in_flight >= self.max_in_flight or not self._bucket.take():
            self._throttled("more new bearer tokens from addresses with no token allowed in "
                            "the last hour than %.0f/s (burst %d, %d at once)",
                            self._bucket.rate, int(self._bucket.burst), self.max_in_flight)
            return None
        budget.reviewed = True
        return 1

    def _throttled(self, message: str, *args: object) -> None:
        self.failures.note("throttled", message + ": answering 429", *args,
                           level=logging.WARNING)

    def _remember(self, key: bytes, address: str, verdict: Verdict) -> None:
        if verdict is Verdict.ALLOWED:
            _remember_good(self._known_good, key, self.clock())
            _remember_good(self._good_addresses, address, self.clock())
        elif verdict is not Verdict.UNAVAILABLE:  # refused now: no longer known good
            self._known_good.pop(key, None)
        if verdict is not Verdict.UNAVAILABLE:  # failures are not remembered: retried next time
            ttl = self.allowed_ttl if verdict is Verdict.ALLOWED else self.denied_ttl
            self._cache[key] = _Entry(verdict, self.clock() + ttl)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    async def _review(self, token: str) -> Verdict:
        """TokenReview, then SubjectAccessReview, within `timeout` in all."""
        deadline = self.clock() + self.timeout
        try:
            status = await self._call("token", TOKEN_REVIEWS, token_review(token, self.audiences),
                                      deadline)
            try:
                user = authenticated_user(status, self.audiences)
                if user is None:
                    if transient_error(status):
                        raise ReviewFailed("authenticator", "the API server could not check "
                                           f"the token: {_quoted(status.get('error'))}")
                    return Verdict.UNAUTHENTICATED
                request = access_review(user, self.path)
            except (TypeError, ValueError, AttributeError) as e:  # a review of an odd shape
                raise ReviewFailed("malformed", f"a TokenReview status of an unexpected "
                                   f"shape ({type(e).__name__})") from None
            status = await self._call("access", ACCESS_REVIEWS, request, deadline)
            return Verdict.ALLOWED if status.get("allowed") is True \
                and status.get("denied") is not True else Verdict.DENIED
        except ReviewFailed as e:
            self.failures.note(f"api:{e.kind}", "cannot check a bearer token with the API "
                               "server (%s): scrapes get 503 until it answers", e,
                               level=logging.WARNING)
            return Verdict.UNAVAILABLE

    async def _call(self, review: str, path: str, body: dict[str, Any],
                    deadline: float) -> dict[str, Any]:
        remaining = deadline - self.clock()
        try:
            if remaining <= 0:
                raise TimeoutError
            if self._client is None:
                self._client = self._factory()
            answer = await asyncio.wait_for(self._client.post(path, body), remaining)
        except TimeoutError:
            self.stats.reviewed(review, "timeout")
            raise ReviewFailed("timeout", f"no answer to a {body['kind']} within "
                               f"{self.timeout:.0f} s") from None
        except ReviewFailed:
            self.stats.reviewed(review, "failed")
            raise
        except Exception as e:  # noqa: BLE001 - connection refused, TLS, a bad config: all "failed"
            self.stats.reviewed(review, "failed")
            raise ReviewFailed(type(e).__name__, str(e) or type(e).__name__) from None
        status = answer.get("status") if isinstance(answer, dict) else None
        if not isinstance(status, dict) or answer.get("kind") != body["kind"]:
            self.stats.reviewed(review, "failed")
            raise ReviewFailed("malformed", f"the answer to a {body['kind']} is not one")
        self.stats.reviewed(review, "answered")
        return status


def token_review(token: str, audiences: tuple[str, ...]) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def authenticated_user(status: dict[str, Any],
                       audiences: tuple[str, ...]) -> dict[str, Any] | None:
    """The user a TokenReview status authenticated, or None. With audiences asked for, the
    token must be valid for one of them (the API server says which in status.audiences), as
    kube-rbac-proxy checks."""
    user = status.get("user")
    if status.get("authenticated") is not True or not isinstance(user, dict) \
            or not isinstance(user.get("username"), str) or not user["username"]:
        return None
    if audiences:
        granted = status.get("audiences")
        if not isinstance(granted, list) \
                or not set(audiences) & {a for a in granted if isinstance(a, str)}:
            return None
    return user


# What kube-apiserver's authenticators say about a token that is not valid (a made-up, expired,
# revoked or wrong-audience one): a refusal, cached. Any other `status.error` with
# `authenticated: false` is an authenticator that failed (a webhook or OIDC provider down, a
# timeout): not a decision about the token, so not cached and answered 503.
_REFUSAL_WORDS = ("invalid bearer token", "token has expired", "token audiences",
                  "not found", "has been invalidated", "is invalid", "invalid token")


def transient_error(status: dict[str, Any]) -> bool:
    """`authenticated: false` with a `status.error` that does not say the token is invalid."""
    error = status.get("error")
    if status.get("authenticated") is True or not error:
        return False
    text = str(error).lower()
    return not any(word in text for word in _REFUSAL_WORDS)


def _quoted(value: object) -> str:
    """An API server's text for a log line: bounded and quoted (no terminal escapes, no
    forged lines)."""
    return repr(str(value)[:200])


def access_review(user: dict[str, Any], path: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"user": user["username"],
                            "nonResourceAttributes": {"path": path, "verb": "get"}}
    if isinstance(user.get("uid"), str) and user["uid"]:
        spec["uid"] = user["uid"]
    if isinstance(user.get("groups"), list):
        spec["groups"] = [g for g in user["groups"] if isinstance(g, str)]
    if isinstance(user.get("extra"), dict):
        spec["extra"] = {k: [x for x in v if isinstance(x, str)]
                         for k, v in user["extra"].items()
                         if isinstance(k, str) and isinstance(v, list)}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}


class HttpReviewClient:
    """POSTs reviews to the API server with the exporter's own credentials (--kubeconfig or
    the in-cluster service account, re-read when rotated), answers bounded in size."""

    def __init__(self, kubeconfig: str | None, timeout: float = REVIEW_TIMEOUT,
                 max_connections: int = MAX_REVIEWS) -> None:
        import httpx2 as httpx
        from lightkube.config.client_adapter import user_auth, verify_cluster
        from lightkube.config.models import User

        from exporter.kube.client import load_config

        config = load_config(kubeconfig)
        user = config.user or User()
        self._httpx = httpx
        self._client = httpx.AsyncClient(
            base_url=config.cluster.server, auth=user_auth(user), trust_env=False,
            verify=verify_cluster(config.cluster, user, config.abs_file, trust_env=False),
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self._client.stream("POST", path, json=body,
                                       headers={"Accept": "application/json"}) as response:
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    raise ReviewFailed("too_large", f"answer to {path} over "
                                       f"{MAX_ANSWER_BYTES} bytes")
            if response.status_code not in (200, 201):
                message = ""
                try:
                    message = str(json.loads(data).get("message", ""))[:200]
                except (ValueError, AttributeError):
                    pass
                raise ReviewFailed(f"http_{response.status_code}",
                                   f"{path}: HTTP {response.status_code} {message}".strip())
        try:
            answer = json.loads(data)
        except ValueError:
            raise ReviewFailed("malformed", f"answer to {path} is not JSON") from None
        if not isinstance(answer, dict):
            raise ReviewFailed("malformed", f"answer to {path} is not an object")
        return answer

    async def aclose(self) -> None:
        await self._client.aclose()


def review_client_factory(kubeconfig: str | None) -> Callable[[], ReviewClient]:
    """The client, made now: reading the configuration and loading the CA bundle take a while
    and must not stall the event loop at the first scrape (an httpx AsyncClient binds to the
    loop that first uses it, not to the thread that makes it)."""
    client = HttpReviewClient(kubeconfig)
    return lambda: client


def check_config(kubeconfig: str | None) -> None:
    """At start-up: the API configuration the reviews will use exists (ValueError naming the
    fix otherwise; the runner exits 2)."""
    from exporter.kube.client import KubeUnavailable, load_config
    try:
        load_config(kubeconfig)
    except KubeUnavailable as e:
        raise ValueError(f"--web.auth=kubernetes: {e}") from None

