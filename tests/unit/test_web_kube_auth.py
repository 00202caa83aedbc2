"""exporter/web/kubeauth.py's bounds, with a clock and a scripted API: the decision cache holds
at most its size and forgets after its TTLs, no token is kept in clear, reviews of new tokens
are rate-bounded, a token allowed before is renewed outside that bound, and a review that never
answers times out as 503 (the real server and TLS: tests/e2e/test_web_kube_auth.py)."""
from __future__ import annotations

import asyncio

from exporter.web.kubeauth import (
    MAX_WAITERS,
    NEWCOMER_BURST,
    NEWCOMER_RATE,
    KubeAuth,
    Verdict,
)
from testkit.kubeauth import ScriptedReviews


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _auth(reviews: ScriptedReviews, clock: Clock, **kw) -> KubeAuth:
    return KubeAuth(lambda: reviews, "/metrics", clock=clock, **kw)


def _run(coro):
    return asyncio.run(coro)


def test_allowed_denied_unauthenticated():
    reviews = ScriptedReviews({"p": "prom", "o": "other"}, {"prom"})
    auth = _auth(reviews, Clock())

    async def go():
        return [await auth.authorize(h) for h in
                ("Bearer p", "Bearer o", "Bearer x", "", "Basic p", "bearer p")]
    assert _run(go()) == [Verdict.ALLOWED, Verdict.DENIED, Verdict.UNAUTHENTICATED,
                          Verdict.UNAUTHENTICATED, Verdict.UNAUTHENTICATED, Verdict.ALLOWED]
    assert auth.stats.snapshot()[0] == {"allowed": 2, "denied": 1, "unauthenticated": 3}


def test_the_cache_is_bounded_and_expires_with_separate_ttls():
    clock = Clock()
    reviews = ScriptedReviews({"p": "prom"}, {"prom"})
    auth = _auth(reviews, clock, cache_size=8, allowed_ttl=120, denied_ttl=30, rate=1000,
                 burst=1000)

    async def go():
        await auth.authorize("Bearer p")
        for i in range(100):
            await auth.authorize(f"Bearer junk{i}")
            await auth.authorize("Bearer p")  # a scraper stays in the cache (LRU)
        assert auth.cached_tokens == 8
        before = reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"]
        await auth.authorize("Bearer p")
        assert reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"] == before
        clock.now += 31  # refused ones expire, allowed ones not yet
        await auth.authorize("Bearer junk99")
        assert reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"] == before + 1
        await auth.authorize("Bearer p")
        assert reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"] == before + 1
        clock.now += 90
        await auth.authorize("Bearer p")
        assert reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"] == before + 2
    _run(go())


def test_no_token_is_kept_in_clear():
    reviews = ScriptedReviews({"secret-token-value": "prom"}, {"prom"})
    auth = _auth(reviews, Clock())
    _run(auth.authorize("Bearer secret-token-value"))
    assert all(b"secret-token-value" not in key for key in auth._cache)
    assert "secret-token-value" not in repr(vars(auth))


def test_reviews_of_new_tokens_are_rate_bounded_and_a_known_scraper_is_renewed():
    """Made-up tokens from many addresses (one each) meet the budget addresses with no token
    allowed share, and the newcomers' (each address's first review); the scraper's token is
    renewed outside every budget."""
    clock = Clock()
    reviews = ScriptedReviews({"p": "prom"}, {"prom"})
    auth = _auth(reviews, clock, rate=5, burst=10, allowed_ttl=120)

    async def go():
        assert await auth.authorize("Bearer p", "10.0.0.1") is Verdict.ALLOWED  # of the burst
        got = [await auth.authorize(f"Bearer junk{i}", f"10.0.1.{i}") for i in range(100)]
        assert got.count(Verdict.UNAUTHENTICATED) == 9 + NEWCOMER_BURST
        assert got.count(Verdict.THROTTLED) == 91 - NEWCOMER_BURST
        clock.now += 1.0  # five more, and the newcomers' rate
        got = [await auth.authorize(f"Bearer more{i}", f"10.0.2.{i}") for i in range(100)]
        assert got.count(Verdict.UNAUTHENTICATED) == 5 + NEWCOMER_RATE
        clock.now += 121  # the scraper's decision expired while the flood used the bound
        for i in range(10):
            await auth.authorize(f"Bearer again{i}", f"10.0.3.{i}")
        assert await auth.authorize("Bearer p", "10.0.0.1") is Verdict.ALLOWED
        # Its address is known: a rotated token from it is reviewed outside the shared budget,
        # within the address's own.
        reviews.users["p2"] = "prom"
        assert await auth.authorize("Bearer p2", "10.0.0.1") is Verdict.ALLOWED
        # ... and a made-up token from it is still refused by the API server.
        assert await auth.authorize("Bearer made-up", "10.0.0.1") is Verdict.UNAUTHENTICATED
    _run(go())


def test_a_review_that_never_answers_is_503_within_the_timeout():
    reviews = ScriptedReviews({}, set(), hang=True)
    auth = KubeAuth(lambda: reviews, "/metrics", timeout=0.05)

    async def go():
        return await asyncio.gather(*(auth.authorize("Bearer same") for _ in range(50)))
    got = _run(go())
    # 50 requests with one token: one review, MAX_WAITERS waited for it, the rest 429 at once.
    assert got == [Verdict.UNAVAILABLE] * (1 + MAX_WAITERS) + \
        [Verdict.THROTTLED] * (49 - MAX_WAITERS)
    assert reviews.posts == {"/apis/authentication.k8s.io/v1/tokenreviews": 1}
    assert auth.stats.snapshot()[1] == {("token", "timeout"): 1}


def test_a_token_for_other_audiences_is_refused():
    reviews = ScriptedReviews({"p": "prom"}, {"prom"})  # answers without status.audiences
    auth = KubeAuth(lambda: reviews, "/metrics", audiences=("nre",))
    assert _run(auth.authorize("Bearer p")) is Verdict.UNAUTHENTICATED


def test_a_known_scraper_stays_known_through_an_api_outage():
    clock = Clock()
    reviews = ScriptedReviews({"p": "prom"}, {"prom"})
    auth = _auth(reviews, clock, rate=5, burst=1, allowed_ttl=120)

    async def go():
        assert await auth.authorize("Bearer p", "10.0.0.1") is Verdict.ALLOWED  # the burst
        clock.now += 121
        # The address's first review (the newcomers' budget), the shared burst again, then
        # nothing left for strangers.
        assert await auth.authorize("Bearer stranger0", "10.0.0.2") is Verdict.UNAUTHENTICATED
        assert await auth.authorize("Bearer stranger1", "10.0.0.2") is Verdict.UNAUTHENTICATED
        reviews.hang = True
        auth.timeout = 0.01
        assert await auth.authorize("Bearer p", "10.0.0.1") is Verdict.UNAVAILABLE  # API hung
        reviews.hang = False
        # The bucket is empty (the clock did not move), but p is still known.
        assert await auth.authorize("Bearer p", "10.0.0.1") is Verdict.ALLOWED
        assert await auth.authorize("Bearer stranger", "10.0.0.2") is Verdict.THROTTLED
    _run(go())


def _answering(status: dict) -> ScriptedReviews:
    """A scripted API whose TokenReview status is `status`, whatever the token."""
    class Odd(ScriptedReviews):
        async def post(self, path: str, body: dict) -> dict:
            self.posts[path] = self.posts.get(path, 0) + 1
            if body["kind"] == "TokenReview":
                return {**body, "status": status}
            return {**body, "status": {"allowed": True}}
    return Odd({}, set())


def test_an_authenticator_that_failed_is_503_and_not_cached():
    """kube-apiserver says its authenticator failed (a webhook down) with authenticated false
    and status.error: not a refusal of the token; the next request asks again."""
    reviews = _answering({"authenticated": False, "user": {},
                          "error": "Post \"https://oidc.example/keys\": dial tcp: i/o timeout"})
    auth = KubeAuth(lambda: reviews, "/metrics")
    assert _run(auth.authorize("Bearer t", "10.0.0.1")) is Verdict.UNAVAILABLE
    assert _run(auth.authorize("Bearer t", "10.0.0.1")) is Verdict.UNAVAILABLE
    assert reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"] == 2
    assert auth.stats.snapshot()[0] == {"unavailable": 2}
    # An invalid token is a refusal, cached (kube-apiserver's words for one).
    refused = _answering({"authenticated": False, "user": {},
                          "error": "[invalid bearer token, square/go-jose: error in "
                                   "cryptographic primitive]"})
    auth = KubeAuth(lambda: refused, "/metrics")
    assert _run(auth.authorize("Bearer t")) is Verdict.UNAUTHENTICATED
    assert _run(auth.authorize("Bearer t")) is Verdict.UNAUTHENTICATED
    assert refused.posts["/apis/authentication.k8s.io/v1/tokenreviews"] == 1


def test_review_answers_of_any_shape_are_503_without_a_traceback(caplog):
    user = {"username": "prom"}
    for status in (
        {"authenticated": True, "user": user, "audiences": [{"unhashable": 1}]},
        {"authenticated": True, "user": user, "audiences": [["nre"]]},
        {"authenticated": True, "user": {"username": "prom", "extra": {1: ["x"]}}},
        {"authenticated": True, "user": {"username": "prom", "groups": "system:masters"}},
    ):
        auth = KubeAuth(lambda s=status: _answering(s), "/metrics", audiences=("nre",))
        got = _run(auth.authorize("Bearer t"))
        assert got in (Verdict.UNAVAILABLE, Verdict.UNAUTHENTICATED), (status, got)
    auth = KubeAuth(lambda: _answering("not a dict"), "/metrics")  # type: ignore[arg-type]
    assert _run(auth.authorize("Bearer t")) is Verdict.UNAVAILABLE
    assert "Traceback" not in caplog.text
