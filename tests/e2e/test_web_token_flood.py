"""A flood of made-up bearer tokens locks no scraper out (--web.auth=kubernetes, a real `run`,
the fake API server, real TLS clients on loopback).

Reviews of new tokens are budgeted per client address, so a flooder spends only its own
address's budget. The flooder connects from 127.0.0.1, the scrapers from 127.0.0.2 and up
(all loopback on Linux; the client socket is bound to them). Under a flood at 100 made-up
tokens a second from one connection, and as fast as the exporter answers from 8 connections:
a scraper whose token was rotated, a scraper never seen before, and a scraper of an exporter
that was restarted during the flood each get their first 200 within 2 scrapes; every new
token is still reviewed by the API server (a made-up token from a scraper's address is 401);
the reviews the flood causes stay within the budgets. The same under Debian's wrk at 3,000 made-up
tokens a second or more from 16 kept-alive TLS connections (a new token in every request); with
wrk on the scraper's own address, what docs/security.md promises there. A connection waiting
on a review can be closed to make room, at most MAX_WAITERS requests wait on one review, and
the liveness probe's /healthz (a plain-HTTP listener of its own) answers within its 1 s timeout
with 600 connections on a hung API server.
"""
from __future__ import annotations

import http.client
import secrets
import time

import pytest

from exporter.web.kubeauth import (
    MAX_REVIEWS,
    MAX_WAITERS,
    PER_ADDRESS_BURST,
    PER_ADDRESS_RATE,
    REVIEW_BURST,
    REVIEW_RATE,
)
from testkit.deploy import container_of, load_manifest
from testkit.exporter_proc import free_port, poll_until
from testkit.fakes.apiserver import FakeApiServer
from testkit.kubeauth import (
    PROMETHEUS,
    BearerFlood,
    FloodProcess,
    KubeAuthExporter,
    WrkFlood,
    bearer_get,
)

FLOODER = "127.0.0.1"  # wrk's connections come from here too (the kernel's loopback source)
SCRAPE_INTERVAL = 1.0  # between a scraper's two scrapes (30 s in a cluster: shorter is harder)
# The DaemonSet's probes. Liveness: the plain-HTTP /healthz listener of its own, within the
# kubelet's default 1 s timeout under any flood; failureThreshold failures in a row restart
# the pod. Readiness: /healthz through the flooded TLS port, with a timeout of seconds.
_CONTAINER = container_of(load_manifest("daemonset.yaml"))
PROBE_TIMEOUT = float(_CONTAINER["livenessProbe"].get("timeoutSeconds", 1))
PROBE_FAILURES = int(_CONTAINER["livenessProbe"].get("failureThreshold", 3))
READY_TIMEOUT = float(_CONTAINER["readinessProbe"].get("timeoutSeconds", 1))
READY_FAILURES = int(_CONTAINER["readinessProbe"].get("failureThreshold", 3))
# Made-up tokens a second the wrk flood must reach (wrk's Requests/sec) for the test to speak of
# a flood: wrk reaches 3,228-4,235/s on an idle 2-CPU machine here (docs/security.md), but it
# shares the CPUs with the exporter it floods, so a loaded CI machine gets less; the guarantee
# does not depend on the rate (the budgets are per address, not per second).
WRK_RATE = 1500.0
WRK_CONNECTIONS = 16

FLOODS = {
    # name: (connections, requests per second, None: as fast as the exporter answers)
    "one-connection-100-per-s": (1, 100.0),
    "8-connections-flat-out": (8, None),
}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = FakeApiServer(port=free_port())
    server.start()
    server.kubeconfig = server.write_kubeconfig(
        str(tmp_path_factory.mktemp("flood") / "kubeconfig"))
    server.allow_path(f"user:{PROMETHEUS}")
    try:
        yield server
    finally:
        server.stop()


def _status(got) -> int | str:
    return got[0] if isinstance(got, tuple) else type(got).__name__


def _token(api: FakeApiServer, name: str) -> str:
    token = f"{name}-{secrets.token_urlsafe(16)}"
    api.add_token(token, PROMETHEUS)
    return token


def _scrapes_to_first_200(port: int, token: str, source: str, most: int = 2) -> list:
    """A scraper's statuses up to its first 200, `most` scrapes at most."""
    got: list = []
    for i in range(most):
        if i:
            time.sleep(SCRAPE_INTERVAL)  # the scrape interval, not a wait for a condition
        got.append(_status(bearer_get(port, token=token, source=source)))
        if got[-1] == 200:
            break
    return got


def _made_up(i: int) -> str:
    return f"made-up-{i}-{secrets.token_hex(8)}"


def _newcomers_during_a_flood(api: FakeApiServer, port: int, name: str) -> tuple[list, list,
                                                                                int | str]:
    """While a flood runs: a rotated token from the known scraper's address (the kubelet
    rotated its projected token) and a new Prometheus replica's from another, each scraped to
    its first 200; then a made-up token from the known address (the address is no credential:
    the API server decides every new token). Their statuses."""
    rotated = _scrapes_to_first_200(port, _token(api, f"{name}-rotated"), "127.0.0.2")
    new = _scrapes_to_first_200(port, _token(api, f"{name}-new"), "127.0.0.3")
    made_up = _status(bearer_get(port, token=_made_up(-1), source="127.0.0.2"))
    return rotated, new, made_up


def _flood_at_its_budget(flood: BearerFlood) -> None:
    """The flood has spent its address's budget (its tokens are being refused 429) and run
    for at least 300 requests (3 s at 100 a second): the scrapers meet it in its steady state."""
    poll_until(lambda: dict(flood.statuses),
               lambda s: s.get(429, 0) >= 20 and sum(s.values()) >= 300, 120, 0.05,
               lambda s: AssertionError(f"the flood never reached its budget: {s}"))


def _review_bound(elapsed: float, addresses: int) -> float:
    """Reviews a flood from `addresses` addresses can cause in `elapsed` seconds, at most: the
    shared budget, and each address's first review besides."""
    per_address = PER_ADDRESS_BURST + PER_ADDRESS_RATE * elapsed
    shared = REVIEW_BURST + REVIEW_RATE * elapsed
    return min(per_address * addresses, shared + addresses) + MAX_REVIEWS


@pytest.mark.parametrize("flood_kind", FLOODS)
def test_a_rotated_and_a_new_scraper_token_get_in_during_a_flood(api, flood_kind):
    connections, rate = FLOODS[flood_kind]
    with KubeAuthExporter(api.kubeconfig) as exp:
        known = _token(api, "prom-a")
        assert poll_until(lambda: _status(bearer_get(exp.port, token=known,
                                                     source="127.0.0.2")),
                          lambda s: s == 200, 30, 0.2,
                          lambda s: AssertionError(f"never allowed: {s}")) == 200
        reviews = api.token_reviews
        with BearerFlood(exp.port, _made_up, connections=connections, rate=rate,
                         sources=(FLOODER,)) as flood:
            _flood_at_its_budget(flood)
            got_rotated, got_new, got_made_up = _newcomers_during_a_flood(api, exp.port, "prom-a")
        elapsed, statuses, sent = flood.elapsed, dict(flood.statuses), flood.sent
    print(f"{flood_kind}: {sent} made-up tokens in {elapsed:.1f} s ({sent / elapsed:.0f}/s), "
          f"{statuses}; reviews {api.token_reviews - reviews}; rotated {got_rotated}, "
          f"new {got_new}")
    assert got_rotated[-1] == 200, got_rotated
    assert got_new[-1] == 200, got_new
    assert got_made_up == 401
    assert set(statuses) <= {401, 429, 503}, statuses
    # The flood's reviews: its address's budget; plus the three scrapers' tokens.
    assert api.token_reviews - reviews <= _review_bound(elapsed, 1) + 3


def _on_port(api: FakeApiServer, port: int) -> KubeAuthExporter:
    """An exporter on `port`: the same address before and after a restart."""
    exp = KubeAuthExporter(api.kubeconfig)
    exp.port = port
    return exp


@pytest.mark.parametrize("flood_kind", FLOODS)
def test_a_scraper_gets_in_after_a_restart_during_a_flood(api, flood_kind):
    """An exporter (re)started while the flood runs knows no token and no address."""
    connections, rate = FLOODS[flood_kind]
    port = free_port()
    with _on_port(api, port):
        token = _token(api, "prom-restart")
        poll_until(lambda: _status(bearer_get(port, token=token, source="127.0.0.4")),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(s))
    reviews = api.token_reviews
    with BearerFlood(port, _made_up, connections=connections, rate=rate,
                     sources=(FLOODER,)) as flood:
        with _on_port(api, port) as exp:
            _flood_at_its_budget(flood)
            got = _scrapes_to_first_200(exp.port, token, "127.0.0.4")
            elapsed = time.monotonic() - flood.started
    print(f"{flood_kind} after a restart: {flood.sent} made-up tokens, {dict(flood.statuses)}, "
          f"scraper {got}")
    assert got[-1] == 200, got
    assert api.token_reviews - reviews <= _review_bound(elapsed, 1) + 1


def test_a_known_scraper_address_gets_a_rotated_token_in_during_a_flood_from_many(api):
    """Made-up tokens from 24 addresses spend the budget addresses with no allowed token
    share; an address allowed in the last hour is reviewed outside it."""
    flooders = tuple(f"127.0.0.{n}" for n in range(10, 34))
    with KubeAuthExporter(api.kubeconfig) as exp:
        known = _token(api, "prom-c")
        poll_until(lambda: _status(bearer_get(exp.port, token=known, source="127.0.0.5")),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(s))
        reviews = api.token_reviews
        with BearerFlood(exp.port, _made_up, connections=len(flooders),
                         sources=flooders) as flood:
            _flood_at_its_budget(flood)
            rotated = _token(api, "prom-c-rotated")
            got = _scrapes_to_first_200(exp.port, rotated, "127.0.0.5")
        elapsed = flood.elapsed
    print(f"24 addresses: {flood.sent} made-up tokens in {elapsed:.1f} s, "
          f"{dict(flood.statuses)}; reviews {api.token_reviews - reviews}; rotated {got}")
    assert got[-1] == 200, got
    assert api.token_reviews - reviews <= _review_bound(elapsed, len(flooders)) + 1


def _wrk_at_its_budget(flood: WrkFlood) -> None:
    """wrk's flood is being refused 429 (its address's budget spent) and has had 3,000
    answers: the scrapers meet it in its steady state."""
    poll_until(lambda: (flood.answers, flood.throttled), lambda s: s[1] >= 20 and s[0] >= 3000,
               120, 0.05, lambda s: AssertionError(f"wrk never reached its budget: {s}\n"
                                                   f"{flood.report}"))


def _wrk_rate(flood: WrkFlood) -> float:
    """wrk's rate, printed: the flood's test is its budget spent (_wrk_at_its_budget), not a
    rate, which a loaded machine lowers (WRK_RATE is what an idle one reaches at least)."""
    return flood.rate


def test_3000_made_up_tokens_a_second_lock_no_rotated_or_new_scraper_out(api):
    """Debian's wrk, 16 kept-alive TLS connections from 127.0.0.1, a new made-up token in every
    request, at 3,000 a second or more; scrapers from other addresses."""
    with KubeAuthExporter(api.kubeconfig) as exp:
        known = _token(api, "prom-w")
        poll_until(lambda: _status(bearer_get(exp.port, token=known, source="127.0.0.2")),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(f"never allowed: {s}"))
        reviews = api.token_reviews
        started = time.monotonic()
        with WrkFlood(exp.port, connections=WRK_CONNECTIONS) as flood:
            _wrk_at_its_budget(flood)
            got_rotated, got_new, got_made_up = _newcomers_during_a_flood(api, exp.port, "prom-w")
        elapsed = time.monotonic() - started
    rate = _wrk_rate(flood)
    print(f"wrk: {flood.report}\n{rate:.0f} made-up tokens/s, {flood.statuses}; reviews "
          f"{api.token_reviews - reviews} in {elapsed:.1f} s; rotated {got_rotated}, "
          f"new {got_new}")
    assert got_rotated[-1] == 200, got_rotated
    assert got_new[-1] == 200, got_new
    assert got_made_up == 401
    assert set(flood.statuses) <= {401, 429, 503}, flood.statuses
    assert sum(flood.statuses.values()) >= 3000
    assert api.token_reviews - reviews <= _review_bound(elapsed, 1) + 3


def test_3000_made_up_tokens_a_second_lock_no_scraper_out_after_a_restart(api):
    """wrk floods on through an exporter restart: the new process knows no token and no
    address, and the scraper's first 200 still comes within 2 scrapes."""
    port = free_port()
    token = _token(api, "prom-w-restart")
    first = _on_port(api, port).start()
    try:
        poll_until(lambda: _status(bearer_get(port, token=token, source="127.0.0.4")),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(s))
        with WrkFlood(port, connections=WRK_CONNECTIONS) as flood:
            _wrk_at_its_budget(flood)
            first.stop()  # wrk reconnects on while the exporter is gone
            reviews = api.token_reviews
            with _on_port(api, port) as exp:
                before, started = flood.answers, time.monotonic()
                throttled = flood.throttled
                # The flood at its budget in the new process (3,000 answers, 20 of them 429)
                # before the scraper comes: what the test needs of the flood, not a rate (wrk
                # shares the CPUs with the exporter; 1,082/s after a restart beside a CPU hog).
                poll_until(lambda: (flood.answers, flood.throttled),
                           lambda s: s[0] >= before + 3000 and s[1] >= throttled + 20, 120, 0.05,
                           lambda s: AssertionError(f"wrk not at its budget after the restart: "
                                                    f"{s}, was {before}, {throttled}"))
                got = _scrapes_to_first_200(exp.port, token, "127.0.0.4")
                after = (flood.answers - before) / (time.monotonic() - started)
                elapsed = time.monotonic() - started
    finally:
        first.stop()
    print(f"wrk through a restart: {flood.report}\n{flood.rate:.0f}/s in all (the restart's "
          f"gap included), {after:.0f}/s after it; {flood.statuses}; scraper {got}")
    assert got[-1] == 200, got
    assert api.token_reviews - reviews <= _review_bound(elapsed + 10, 1) + 1


def test_3000_made_up_tokens_a_second_from_the_scrapers_own_address(api):
    """The flood shares the scraper's address (127.0.0.1: the same pod, the same NAT). What
    docs/security.md promises there: a token allowed in the last hour keeps being answered
    (re-reviewed outside every budget); a new token from that address waits for the address's
    budget, which the flood spends (measured and printed, not promised)."""
    with KubeAuthExporter(api.kubeconfig) as exp:
        known = _token(api, "prom-shared")
        poll_until(lambda: _status(bearer_get(exp.port, token=known, source=FLOODER)),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(s))
        with WrkFlood(exp.port, connections=WRK_CONNECTIONS) as flood:
            _wrk_at_its_budget(flood)
            got_known = [_status(bearer_get(exp.port, token=known, source=FLOODER))
                         for _ in range(3)]
            rotated = _token(api, "prom-shared-rotated")
            got_rotated = _scrapes_to_first_200(exp.port, rotated, FLOODER)
    rate = _wrk_rate(flood)
    print(f"wrk from the scraper's address: {rate:.0f}/s, {flood.statuses}; known "
          f"{got_known}; rotated {got_rotated} (not promised)")
    assert got_known == [200] * 3, got_known


def _plain_healthz(port: int, timeout: float) -> tuple[int | str, float]:
    """GET /healthz on the health listener as the kubelet's probe does: (status, seconds)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        status: int | str = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        status = type(e).__name__
    finally:
        conn.close()
    return status, time.monotonic() - started


def test_waiters_on_one_review_are_bounded_and_healthz_answers_a_probe(api):
    """600 kept-alive connections send one made-up token while the API server hangs: at most
    MAX_WAITERS wait on its review (the others get 429 at once); the liveness probe's /healthz
    (its own plain-HTTP listener) answers within the probe's timeout every time, /healthz on
    the flooded TLS port within the readiness probe's, and an allowed scraper on a new
    connection is answered."""
    token = "same-made-up-" + secrets.token_hex(8)
    health = free_port()
    with KubeAuthExporter(api.kubeconfig, "--web.health-listen-address",
                          f"127.0.0.1:{health}") as exp:
        scraper = _token(api, "prom-d")
        poll_until(lambda: _status(bearer_get(exp.port, token=scraper, source="127.0.0.6")),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(s))
        api.set_review_delay(600)  # hung: longer than anything here waits
        try:
            # The 600 clients in a process of their own: 600 threads in this one would hold
            # the GIL the probe below needs, and time the test, not the exporter.
            with FloodProcess(exp.port, token, 600) as flood:
                poll_until(lambda: flood.statuses, lambda s: s.get("429", 0) >= 20, 120, 0.1,
                           lambda s: AssertionError(f"no 429 from the waiters' bound: {s}"))
                live: list[tuple[int | str, float]] = []
                probes: list[int | str] = []
                scrapes: list[int | str] = []
                for _ in range(6):
                    live.append(_plain_healthz(health, PROBE_TIMEOUT))
                    started = time.monotonic()
                    probes.append(_status(bearer_get(exp.port, "/healthz",
                                                     timeout=READY_TIMEOUT)))
                    print(f"liveness /healthz {live[-1][0]} in {live[-1][1]:.3f} s; TLS port "
                          f"/healthz {probes[-1]} in {time.monotonic() - started:.2f} s")
                    scrapes.append(_status(bearer_get(exp.port, token=scraper,
                                                      source="127.0.0.6", timeout=10)))
                statuses = dict(flood.statuses)
        finally:
            api.set_review_delay(0)
    print(f"600 connections, hung API server: {statuses}; liveness {live}; TLS port {probes}; "
          f"scrapes {scrapes}")
    assert statuses.get("429", 0) > 0
    # Every liveness probe answered, within its timeout (the old /healthz behind the flooded
    # loop took 3.4-16.8 s).
    assert [status for status, _ in live] == [200] * 6, live
    assert max(seconds for _, seconds in live) < PROBE_TIMEOUT, live
    longest = max((len(run) for run in "".join("x" if p != 200 else "." for p in probes)
                   .split(".")), default=0)
    assert longest < READY_FAILURES, probes
    # The scraper's allowed decision is cached for ALLOWED_TTL; past it (this test can take
    # minutes on a loaded machine) its renewal meets the hung API server: 503. On the flooded
    # TLS port a new connection can take longer than Prometheus's 10 s scrape timeout when the
    # machine is loaded besides (2 of 6 seen here and in CI, docs/security.md): the first is
    # answered, and no more than half time out.
    assert scrapes[0] == 200 and scrapes.count("TimeoutError") <= 3, scrapes
    assert set(scrapes) <= {200, 503, "TimeoutError"}, scrapes


def test_the_health_listener_says_down_when_the_main_loop_is_wedged():
    """The liveness probe's listener does not outlive the scrape port: it answers 503 when the
    main listener's loop stops turning, 200 while it turns."""
    from prometheus_client import CollectorRegistry

    from exporter.web.server import MetricsServer, WebSettings
    server = MetricsServer(WebSettings("127.0.0.1", 0, auth="none",
                                       health_address=("127.0.0.1", 0)), CollectorRegistry())
    assert server.health is not None
    server.start()
    try:
        assert _plain_healthz(server.health.port, 10)[0] == 200
        assert _plain_healthz(server.health.port, 10)[0] == 200
        assert server._loop is not None
        # Wedge the main loop: a callback that blocks it until released.
        import threading
        wedged, release = threading.Event(), threading.Event()
        server._loop.call_soon_threadsafe(lambda: (wedged.set(), release.wait(120)))
        assert wedged.wait(30)
        server._last_turn -= 60  # as if it had not turned for a minute
        try:
            assert _plain_healthz(server.health.port, 10)[0] == 503
        finally:
            release.set()
        poll_until(lambda: _plain_healthz(server.health.port, 10)[0], lambda s: s == 200,
                   30, 0.2, lambda s: AssertionError(f"not healthy again: {s}"))
    finally:
        server.stop()


def test_requests_past_max_waiters_get_429_at_once():
    """KubeAuth alone: one review hung, MAX_WAITERS requests wait on it, the next is 429."""
    import asyncio

    from exporter.web.kubeauth import KubeAuth, Verdict
    from testkit.kubeauth import ScriptedReviews

    async def run() -> tuple[list[Verdict], int]:
        reviews = ScriptedReviews({}, set(), hang=True)
        auth = KubeAuth(lambda: reviews, "/metrics", timeout=600)
        waiting = [asyncio.ensure_future(auth.authorize("Bearer same", "127.0.0.9"))
                   for _ in range(MAX_WAITERS + 1)]
        await asyncio.sleep(0)  # let them all reach the review (an event loop turn)
        late = await asyncio.wait_for(auth.authorize("Bearer same", "127.0.0.9"), 5)
        for w in waiting:
            w.cancel()
        return [late], sum(reviews.posts.values())

    (late,), posts = asyncio.run(run())
    assert late is Verdict.THROTTLED
    assert posts == 1


def test_a_flooding_address_spends_only_its_own_budget():
    """KubeAuth alone, with a clock that does not move: one address's made-up tokens are
    reviewed PER_ADDRESS_BURST times, then 429, while another address's token is reviewed."""
    import asyncio

    from exporter.web.kubeauth import KubeAuth, Verdict
    from testkit.kubeauth import ScriptedReviews

    async def run() -> tuple[list[Verdict], Verdict, int]:
        reviews = ScriptedReviews({"good": "prom"}, {"prom"})
        auth = KubeAuth(lambda: reviews, "/metrics", clock=lambda: 1000.0)
        flood = [await auth.authorize(f"Bearer made-up-{i}", "10.0.0.1") for i in range(50)]
        good = await auth.authorize("Bearer good", "10.0.0.2")
        return flood, good, reviews.posts.get("/apis/authentication.k8s.io/v1/tokenreviews", 0)

    flood, good, token_reviews = asyncio.run(run())
    assert flood.count(Verdict.UNAUTHENTICATED) == PER_ADDRESS_BURST
    assert flood.count(Verdict.THROTTLED) == 50 - PER_ADDRESS_BURST
    assert good is Verdict.ALLOWED
    assert token_reviews == PER_ADDRESS_BURST + 1


def test_ipv6_clients_are_budgeted_by_their_64():
    from exporter.web.kubeauth import client_address
    assert client_address("2001:db8:1:2:aaaa::1") == client_address("2001:db8:1:2:bbbb::9")
    assert client_address("2001:db8:1:3::1") != client_address("2001:db8:1:2::1")
    assert client_address("::ffff:10.0.0.7") == "10.0.0.7"
    assert client_address("10.0.0.7") == "10.0.0.7"
    assert client_address("") == ""



def test_connections_waiting_on_a_review_do_not_keep_a_scraper_out(api):
    """At the connection cap (here 32: the exporter runs with 64 descriptors), with every
    connection waiting on one hung review, a scraper's new connection is answered: a waiting
    connection is closed to make room like an idle one. Before, a request waiting on a review
    counted as being answered, so nobody could be evicted and new connections were closed."""
    token = "waiting-" + secrets.token_hex(8)
    exp = KubeAuthExporter(api.kubeconfig)
    exp.wrapper = ("prlimit", "--nofile=64:64")
    with exp:
        scraper = _token(api, "prom-e")
        poll_until(lambda: _status(bearer_get(exp.port, token=scraper, source="127.0.0.9")),
                   lambda s: s == 200, 30, 0.2, lambda s: AssertionError(s))
        api.set_review_delay(600)  # hung
        try:
            with BearerFlood(exp.port, lambda i: token, connections=40) as flood:
                poll_until(lambda: dict(flood.statuses),
                           lambda s: sum(s.values()) >= 40, 60, 0.1,
                           lambda s: AssertionError(f"the flood never got going: {s}"))
                got = [_status(bearer_get(exp.port, token=scraper, source="127.0.0.9"))
                       for _ in range(3)]
        finally:
            api.set_review_delay(0)
        logs = exp.logs()
    assert got == [200] * 3, (got, flood.statuses)
    assert "all busy: closing new ones" not in logs


PLANNER = "system:serviceaccount:kubevirt:planner"


def test_a_flood_of_made_up_tokens_on_plan_locks_no_orchestrator_out(api):
    """H2 (issue 36): /plan's token reviews are budgeted per client address like /metrics'.
    Made-up tokens from 127.0.0.2 on 4 TLS connections, as fast as the exporter answers; an
    orchestrator's allowed token from 127.0.0.3 gets 200 at once, and so does its rotated
    token. Before, /plan reviewed every token without the client's address, so the flood
    spent the one budget every /plan client shared: 429 on 40 of 40 tries."""
    api.allow_path(f"user:{PLANNER}", "/plan")
    plan = "/plan?memory=-128Mi"  # valid whatever other tests do to cpu1 meanwhile
    with KubeAuthExporter(api.kubeconfig) as exp:
        with BearerFlood(exp.port, _made_up, connections=4, sources=("127.0.0.2",),
                         path=plan) as flood:
            _flood_at_its_budget(flood)
            got = []
            for name in ("planner", "planner-rotated"):
                token = f"{name}-{secrets.token_urlsafe(16)}"
                api.add_token(token, PLANNER)
                got.append(_status(bearer_get(exp.port, plan, token=token,
                                              source="127.0.0.3")))
        statuses = dict(flood.statuses)
    print(f"/plan flood: {flood.sent} made-up tokens, {statuses}; orchestrator {got}")
    assert got == [200, 200], got
    assert set(statuses) <= {401, 429, 503}, statuses


def _holders(port: int, stop, slow: bool, opened: list[int]) -> None:
    """One connection to the health listener that sends nothing (or, `slow`, a byte of a
    request every 0.5 s), opened again as soon as it is cut: what any local process can do.
    `opened[0]` counts the connections made."""
    import socket
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                opened[0] += 1
                while not stop.wait(0.5):
                    if slow:
                        s.sendall(b"G")
                    elif s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                        break  # cut
        except BlockingIOError:
            continue
        except OSError:
            stop.wait(0.01)


def test_idle_and_slow_connections_do_not_hold_the_liveness_listener():
    """M4 (issue 36): 16 connections that send nothing and 16 that send a byte every 0.5 s,
    each reopened as soon as it is cut, from the probe's own address: probed once a second,
    every probe is answered 200 within the probe's timeout. Before, they held its 16
    connections and new ones were closed at once: 0-3 of 30 probes answered."""
    import threading

    from prometheus_client import CollectorRegistry

    from exporter.web.server import MetricsServer, WebSettings
    server = MetricsServer(WebSettings("127.0.0.1", 0, auth="none",
                                       health_address=("127.0.0.1", 0)), CollectorRegistry())
    assert server.health is not None
    server.start()
    stop, opened = threading.Event(), [0]
    holders = [threading.Thread(target=_holders, args=(server.health.port, stop, i % 2 == 1,
                                                       opened), daemon=True)
               for i in range(32)]
    try:
        for t in holders:
            t.start()
        poll_until(lambda: opened[0], lambda n: n >= 64, 30, 0.05,
                   lambda n: AssertionError(f"the holders never got going: {n}"))
        probes = []
        for _ in range(10):
            time.sleep(1.0)  # the probe's period, not a wait for a condition
            probes.append(_plain_healthz(server.health.port, PROBE_TIMEOUT))
        evicted = getattr(server.health, "evicted", 0)
    finally:
        stop.set()
        for t in holders:
            t.join(10)
        server.stop()
    print(f"32 idle/slow connections, {opened[0]} opened: probes {probes}; {evicted} closed "
          "for room")
    assert [status for status, _ in probes] == [200] * 10, probes
    assert max(seconds for _, seconds in probes) < PROBE_TIMEOUT, probes
    assert evicted > 0


def test_a_flood_from_60_addresses_leaves_a_new_scrapers_first_review_its_own_budget():
    """M5 (issue 36), KubeAuth alone with a clock it is told: made-up tokens from 60 addresses,
    2 a second each on average (at random moments, a fixed seed), for a minute; then a scraper
    from an address never seen before, at a 30 s scrape interval, is allowed at its first
    scrape, and twice more. Before, the 60 addresses spent the budget every address with no
    allowed token shares (5 a second), and the new scraper got its first 200 at scrape 12, 6
    minutes in."""
    import asyncio
    import random

    from exporter.web.kubeauth import KubeAuth, Verdict
    from testkit.kubeauth import ScriptedReviews

    now, rng = [1000.0], random.Random(36)
    flooders = [f"127.0.1.{n}" for n in range(60)]

    async def flood(seconds: float) -> None:
        for i in range(int(seconds * 2 * len(flooders))):
            now[0] += rng.expovariate(2 * len(flooders))
            await auth.authorize(f"Bearer made-up-{i}-{now[0]}", rng.choice(flooders))

    async def run() -> list[Verdict]:
        got = []
        await flood(60)
        for n in range(3):  # a new scraper (its own token each time: nothing cached)
            got.append(await auth.authorize(f"Bearer good-{n}", "127.0.2.1"))
            await flood(30)
        return got

    reviews = ScriptedReviews({f"good-{n}": "prom" for n in range(3)}, {"prom"})
    auth = KubeAuth(lambda: reviews, "/metrics", clock=lambda: now[0])
    got = asyncio.run(run())
    token_reviews = reviews.posts["/apis/authentication.k8s.io/v1/tokenreviews"]
    print(f"60 flooding addresses for 2.5 min: the new scraper {got}; {token_reviews} reviews")
    assert got == [Verdict.ALLOWED] * 3, got
    # The flood's reviews: the shared budget, and one first review per address at most more.
    assert token_reviews <= REVIEW_BURST + REVIEW_RATE * 150 + len(flooders) + 3


def test_a_flood_from_60_loopback_addresses_lets_a_new_scraper_in_within_2_scrapes(api):
    """M5 (issue 36), a real `run`: made-up tokens from 60 loopback addresses (127.0.1.x), as
    fast as the exporter answers, past the moment each address had its first review (5-6
    a second: the shared budget and the newcomers'); a
    Prometheus from an address never seen before gets its first 200 within 2 scrapes. Before,
    the shared budget went to the 60 addresses and its first 200 came at scrape 12."""
    flooders = tuple(f"127.0.1.{n}" for n in range(1, 61))
    with KubeAuthExporter(api.kubeconfig) as exp:
        with BearerFlood(exp.port, _made_up, connections=len(flooders),
                         sources=flooders) as flood:
            # Each address has had its first review (401, or 503 where the API server failed)
            started = time.monotonic()
            poll_until(lambda: {a for a, got in dict(flood.by_source).items()
                                if got & {401, 503}},
                       lambda reviewed: len(reviewed) == len(flooders), 120, 0.1,
                       lambda r: AssertionError(f"{len(r)} flooding addresses reviewed"))
            warm = time.monotonic() - started
            _flood_at_its_budget(flood)
            got = _scrapes_to_first_200(exp.port, _token(api, "prom-m5"), "127.0.2.1")
        statuses = dict(flood.statuses)
    print(f"60 addresses: {flood.sent} made-up tokens in {flood.elapsed:.1f} s (each reviewed "
          f"once after {warm:.1f} s), {statuses}; new scraper {got}")
    assert got[-1] == 200, got
