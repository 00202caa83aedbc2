"""exporter/web/kubeauth.py's bounds, with a clock and a scripted API: the decision cache holds
at most its size and forgets after its TTLs, no token is kept in clear, reviews of new tokens
are rate-bounded, a token allowed before is renewed outside that bound, and a review that never
answers times out as 503 (the real server and TLS: tests/e2e/test_web_kube_auth.py)."""
from __future__ import annotations

import asyncio

from exporter.web.kubeauth import KubeAuth, Verdict
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
    clock = Clock()
    reviews = ScriptedReviews({"p": "prom"}, {"prom"})
    auth = _auth(reviews, clock, rate=5, burst=10, allowed_ttl=120)

    async def go():
        assert await auth.authorize("Bearer p") is Verdict.ALLOWED  # one of the burst
        got = [await auth.authorize(f"Bearer junk{i}") for i in range(100)]
        assert got.count(Verdict.UNAUTHENTICATED) == 9
        assert got.count(Verdict.THROTTLED) == 91
        clock.now += 1.0  # five more
        got = [await auth.authorize(f"Bearer more{i}") for i in range(100)]
        assert got.count(Verdict.UNAUTHENTICATED) == 5
        clock.now += 121  # the scraper's decision expired while the flood used the bound
        for i in range(10):
            await auth.authorize(f"Bearer again{i}")
        assert await auth.authorize("Bearer p") is Verdict.ALLOWED
    _run(go())


def test_a_review_that_never_answers_is_503_within_the_timeout():
    reviews = ScriptedReviews({}, set(), hang=True)
    auth = KubeAuth(lambda: reviews, "/metrics", timeout=0.05)

    async def go():
        return await asyncio.gather(*(auth.authorize("Bearer same") for _ in range(50)))
    got = _run(go())
    assert got == [Verdict.UNAVAILABLE] * 50
    # 50 requests with one token waited for one review.
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
        assert await auth.authorize("Bearer p") is Verdict.ALLOWED  # the whole burst
        clock.now += 121
        assert await auth.authorize("Bearer stranger0") is Verdict.UNAUTHENTICATED  # the burst
        reviews.hang = True
        auth.timeout = 0.01
        assert await auth.authorize("Bearer p") is Verdict.UNAVAILABLE  # renewal, API hung
        reviews.hang = False
        # The bucket is empty (the clock did not move), but p is still known.
        assert await auth.authorize("Bearer p") is Verdict.ALLOWED
        assert await auth.authorize("Bearer stranger") is Verdict.THROTTLED
    _run(go())
