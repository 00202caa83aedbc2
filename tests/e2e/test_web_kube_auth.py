"""--web.auth=kubernetes on a real `run`, against the fake API server answering TokenReview and
SubjectAccessReview as kube-apiserver does, with real TLS clients on loopback.

Who gets what: a token of a user granted get on /metrics gets 200, one not granted 403, no
token, a garbage, expired or wrong-audience token 401 (each after one TokenReview at most), a
1 MB token 431 before any review. The API server down or hanging makes scrapes fail (503)
within the review timeout while the exporter, /healthz and already-allowed scrapers carry on.
Decisions are cached (no second TokenReview for a token within its TTL), and a flood of new
tokens costs at most the rate bound's reviews.
"""
from __future__ import annotations

import concurrent.futures
import secrets

import pytest
from cryptography import x509

from exporter.web.kubeauth import MAX_IN_FLIGHT, REVIEW_BURST, REVIEW_RATE
from exporter.web.server import MAX_HEADER_BYTES
from testkit.exporter_proc import RunningExporter, Scrape, free_port, poll_until
from testkit.fakes.apiserver import FakeApiServer
from testkit.kubeauth import PROMETHEUS, BearerFlood, KubeAuthExporter, bearer_get, peer_certificate
from testkit.web_attacks import proc_status

THREADS_BOUND = 12  # the server's own threads (event loop, render workers), with room


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    # A fixed port, so that stop() then start() is an API server going down and coming back.
    server = FakeApiServer(port=free_port())
    server.start()
    server.kubeconfig = server.write_kubeconfig(
        str(tmp_path_factory.mktemp("kubeauth") / "kubeconfig"))
    server.allow_path(f"user:{PROMETHEUS}")
    try:
        yield server
    finally:
        server.stop()


def _answered(port: int, token: str, path: str = "/metrics"):
    """The first answer to a token that is not 503 or 429: on a loaded machine a review (a
    new connection to the API server) may take longer than the review timeout, and this
    module sends more new tokens from one address than its review budget holds at once
    (429, Retry-After: 1): the bounds working, not what these tests are about."""
    return poll_until(lambda: bearer_get(port, path, token=token),
                      lambda got: _status(got) not in (503, 429), 30, 0.5,
                      lambda got: AssertionError(f"503 or 429 for 30 s: {got}"))


@pytest.fixture(scope="module")
def exporter(api):
    with KubeAuthExporter(api.kubeconfig) as exp:
        _answered(exp.port, "warm-up")  # the connection to the API server is made
        yield exp


@pytest.fixture
def fresh(api):
    """A new token of Prometheus's service account (no decision cached for it yet)."""
    api.set_review_delay(0)
    api.set_review_error(None)
    token = "prom-" + secrets.token_urlsafe(24)
    api.add_token(token, PROMETHEUS, groups=("system:serviceaccounts",
                                             "system:serviceaccounts:monitoring"))
    yield token
    api.set_review_delay(0)
    api.set_review_error(None)


def _status(got) -> int | str:
    return got[0] if isinstance(got, tuple) else type(got).__name__


def test_a_granted_token_gets_metrics_over_tls_with_a_generated_certificate(exporter, fresh):
    status, _, body = _answered(exporter.port, fresh)
    assert status == 200
    scrape = Scrape(body.decode())
    assert scrape.total("node_resize_exporter_web_auth_total", result="allowed") >= 1
    assert scrape.value("node_resize_exporter_web_auth_reviews_total", review="token",
                        result="answered") >= 1
    # The certificate made at start names the node, localhost and loopback, and nothing of
    # the host's other networks (anyone who connects reads it).
    cert = x509.load_der_x509_certificate(peer_certificate(exporter.port))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["auth-node", "localhost"]
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert "self-signed certificate made at start" in exporter.logs()


def test_a_token_whose_user_may_not_get_the_path_gets_403(api, exporter):
    api.add_token("someone-else", "system:serviceaccount:default:default")
    assert _status(_answered(exporter.port, "someone-else")) == 403


@pytest.mark.parametrize("header", [
    None, "Bearer", "Bearer garbage-token-nobody-issued", "Bearer a b c", "Bearer \u00e9t\u00e9",
    "Basic cHJvbWV0aGV1czpzZWNyZXQ=", "Bearer " + "x" * 9000,
], ids=["none", "empty", "unknown", "spaces", "latin-1", "basic", "9000-bytes"])
def test_no_or_a_bad_token_gets_401(exporter, header):
    got = bearer_get(exporter.port, header=header)
    assert _status(got) == 401
    assert got[1]["WWW-Authenticate"].startswith("Bearer")


def test_an_expired_token_gets_401(api, exporter, fresh):
    api.expire_token(fresh)
    assert _status(_answered(exporter.port, fresh)) == 401


def test_a_token_for_another_audience_gets_401(api, exporter):
    api.add_token("vault-token", PROMETHEUS, audiences=("vault",))
    assert _status(_answered(exporter.port, "vault-token")) == 401


def test_a_1mb_token_is_refused_before_any_review(api, exporter):
    before = api.token_reviews
    got = bearer_get(exporter.port, token="y" * 2**20)
    # 431 from the head bound, or the connection cut while the client was still sending.
    assert _status(got) in (431, "ConnectionResetError", "BrokenPipeError", "SSLEOFError"), got
    assert MAX_HEADER_BYTES < 2**20
    assert api.token_reviews == before


def test_a_decision_is_cached_no_second_token_review(api, exporter, fresh):
    before = api.token_reviews, api.access_reviews
    assert _status(_answered(exporter.port, fresh)) == 200
    reviewed = api.token_reviews, api.access_reviews
    assert reviewed[0] > before[0] and reviewed[1] > before[1]
    for _ in range(5):
        assert _status(bearer_get(exporter.port, token=fresh)) == 200
    assert (api.token_reviews, api.access_reviews) == reviewed


def test_refusals_are_cached_too(api, exporter):
    assert _status(_answered(exporter.port, "never-issued-token")) == 401
    before = api.token_reviews
    for _ in range(5):
        assert _status(bearer_get(exporter.port, token="never-issued-token")) == 401
    assert api.token_reviews == before


def test_healthz_needs_no_token(exporter):
    assert _status(bearer_get(exporter.port, "/healthz")) == 200


def test_api_errors_fail_the_scrape_not_the_exporter(api, exporter, fresh):
    api.set_review_error(500)
    # From an address of its own: this module's earlier new tokens spent 127.0.0.1's review
    # budget (PER_ADDRESS_BURST), and a 429 would be answered before any review could fail.
    got = bearer_get(exporter.port, token=fresh, source="127.0.0.10")
    assert _status(got) == 503 and got[1]["Retry-After"] == "1"
    # Not cached: once the API answers again, so does the exporter.
    api.set_review_error(None)
    assert _status(_answered(exporter.port, fresh)) == 200

    def failures(scrape: Scrape) -> float:
        # "failed" (the 500), or "timeout" when a loaded machine made the review slower
        return sum(scrape.value("node_resize_exporter_web_auth_reviews_total", 0.0,
                                review="token", result=r) for r in ("failed", "timeout"))

    # A rendering is shared for up to a second (web/exposition.py max_age): read until the
    # counters of the refused scrape are on the page.
    scrape = poll_until(lambda: Scrape(bearer_get(exporter.port, token=fresh)[2].decode()),
                        lambda s: failures(s) >= 1, 10, 0.2,
                        lambda s: AssertionError("the failed review was never counted"))
    assert scrape.total("node_resize_exporter_web_auth_total", result="unavailable") >= 1


def test_api_down_fails_new_scrapes_and_keeps_allowed_ones(api, exporter, fresh):
    assert _status(_answered(exporter.port, fresh)) == 200  # allowed and cached
    newcomer = "prom-new-" + secrets.token_urlsafe(8)
    api.add_token(newcomer, PROMETHEUS)
    api.stop()  # connection refused from now on
    try:
        # From an address of its own: this module's earlier tokens spent 127.0.0.1's budget.
        assert _status(bearer_get(exporter.port, token=newcomer, source="127.0.0.7")) == 503
        assert _status(bearer_get(exporter.port, token=fresh)) == 200  # from the cache
        assert _status(bearer_get(exporter.port, "/healthz")) == 200
        assert exporter.proc.poll() is None
    finally:
        api.start()
    poll_until(lambda: _status(bearer_get(exporter.port, token=newcomer)), lambda s: s == 200,
               10, 0.2, lambda s: AssertionError(f"after the API came back: {s}"))
    log = exporter.logs()
    # Logged, not once per scrape.
    assert log.count("cannot check a bearer token") <= 3, log[-3000:]


def test_a_hanging_api_server_fails_scrapes_in_bounded_time_without_piling_up(api, exporter):
    base = proc_status(exporter.proc.pid)
    api.set_review_delay(120)  # hung: longer than any client here waits
    reviews = api.token_reviews
    tokens = [f"hang-{i}-{secrets.token_urlsafe(8)}" for i in range(40)]
    try:
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            # Each of the 40 is answered, 503 (its review timed out) or 429 (beyond the
            # bounds), long before the API server would answer: the client's 30 s is a bound
            # for a loaded 2-vCPU machine (3 s + a handshake when idle; 40 TLS clients in this
            # process share its GIL).
            got = list(pool.map(lambda t: _status(bearer_get(exporter.port, token=t,
                                                             timeout=30)), tokens))
        after = proc_status(exporter.proc.pid)
    finally:
        api.set_review_delay(0)
    assert set(got) <= {503, 429}, got
    assert got.count(503) <= MAX_IN_FLIGHT + REVIEW_BURST, got
    # No thread per waiting request: the reviews wait on the event loop.
    assert after["threads"] <= base["threads"] + THREADS_BOUND, (base, after)
    assert api.token_reviews - reviews <= MAX_IN_FLIGHT + REVIEW_BURST
    assert _status(bearer_get(exporter.port, "/healthz")) == 200


def test_a_flood_of_tokens_costs_at_most_the_rate_bound_of_reviews(api, exporter, fresh):
    assert _status(_answered(exporter.port, fresh)) == 200  # a scraper, known
    base = proc_status(exporter.proc.pid)
    reviews = api.token_reviews
    with BearerFlood(exporter.port, lambda i: f"flood-{i}-{secrets.token_hex(8)}") as flood:
        scraped = []
        for _ in range(10):  # the known scraper, during the flood
            scraped.append(_status(bearer_get(exporter.port, token=fresh)))
        poll_until(lambda: flood.sent, lambda n: n >= 2000, 60, 0.1,
                   lambda n: AssertionError(f"only {n} flood requests"))
    after = proc_status(exporter.proc.pid)
    assert scraped == [200] * 10
    made = api.token_reviews - reviews
    # Every made-up token is one review at most, and reviews come at REVIEW_RATE per second
    # after a burst: thousands of requests, a few dozen reviews.
    assert made <= REVIEW_BURST + REVIEW_RATE * flood.elapsed + MAX_IN_FLIGHT, (made, flood)
    assert flood.statuses.get(429, 0) > flood.sent / 2, flood.statuses
    assert set(flood.statuses) <= {401, 429, 503}, flood.statuses  # 503: a review timed out
    assert after["rss"] - base["rss"] < 32 * 2**20, (base, after)


def test_the_same_garbage_token_10000_times_costs_one_review(api, exporter):
    reviews = api.token_reviews
    token = "same-garbage-" + secrets.token_hex(8)
    # From an address of its own, whose review budget earlier tests did not spend (a 429
    # besides the 401 on a loaded machine, where this module's tokens come close together).
    with BearerFlood(exporter.port, lambda i: token, sources=("127.0.0.8",)) as flood:
        poll_until(lambda: flood.sent, lambda n: n >= 3000, 120, 0.1,
                   lambda n: AssertionError(f"only {n} flood requests"))
    assert flood.statuses.get(401, 0) > 0 and set(flood.statuses) <= {401, 503}, flood.statuses
    # One review; another only after one timed out (503, not cached) on a loaded machine.
    assert api.token_reviews - reviews <= 1 + min(flood.statuses.get(503, 0), 2)


def test_the_deployment_as_written_lets_its_prometheus_scrape(api, tmp_path):
    """deploy/ as a whole: the DaemonSet's arguments, the scrape ClusterRole bound to its
    subjects (granted in the fake as RBAC would), the ServiceMonitor's scheme and path and
    Prometheus's service account token: 200; any other service account: 403."""
    from testkit.deploy import container_of, load_manifest

    args = [a for a in container_of(load_manifest("daemonset.yaml"))["args"][1:]
            if not a.startswith(("--web.listen-address", "--journal",
                                 "--web.health-listen-address"))]
    role = load_manifest("scrape-clusterrole.yaml")
    binding = load_manifest("scrape-clusterrolebinding.yaml")
    for subject in binding["subjects"]:
        user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
        for rule in role["rules"]:
            for url in rule["nonResourceURLs"]:
                for verb in rule["verbs"]:
                    api.allow_path(f"user:{user}", url, verb)
        api.add_token(f"token-of-{subject['name']}", user)
    api.add_token("token-of-default", "system:serviceaccount:default:default")
    (endpoint,) = load_manifest("servicemonitor.yaml")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}

    class AsDeployed(KubeAuthExporter):
        def __init__(self) -> None:
            RunningExporter.__init__(self, "--source", "uevent", "--kubernetes", "off",
                                     "--kubeconfig", api.kubeconfig, *args)

    with AsDeployed() as exp:
        for subject in binding["subjects"]:
            assert _status(_answered(exp.port, f"token-of-{subject['name']}",
                                     endpoint["path"])) == 200
        assert _status(bearer_get(exp.port, endpoint["path"], token="token-of-default")) == 403


@pytest.mark.parametrize("case", ["no-api-configuration", "basic-auth-users-too",
                                  "none-with-basic-auth-users"])
def test_a_web_auth_that_cannot_work_exits_2_with_the_fix(tmp_path, case):
    import os
    import subprocess
    import sys

    from testkit.exporter_proc import REPO

    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: "
                   "$2b$04$8t7GLVBoMAyB35WTQ8.SrOqa3M9JSxCAqdZQ3i5bltGd4UtBNFzXS\n")
    args = {"no-api-configuration": ["--web.auth", "kubernetes"],
            "basic-auth-users-too": ["--web.auth", "kubernetes", "--web.config.file", str(web)],
            "none-with-basic-auth-users": ["--web.auth", "none", "--web.config.file", str(web)],
            }[case]
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    r = subprocess.run([sys.executable, "-m", "exporter", "run", "--source", "uevent",
                        "--kubernetes", "off", "--no-journal", "--web.listen-address",
                        f"127.0.0.1:{free_port()}", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert {"no-api-configuration": "--kubeconfig",
            "basic-auth-users-too": "remove them, or use --web.auth=config",
            "none-with-basic-auth-users": "basic_auth_users"}[case] in r.stderr, r.stderr


def test_a_certificate_from_a_mounted_secret_is_served_instead(api, tmp_path, fresh):
    """The documented cert-manager / Secret path: --web.config.file with only a
    tls_server_config; the exporter serves that certificate and still checks tokens."""
    from cryptography.hazmat.primitives import serialization

    from exporter.web.selfsigned import certificate

    cert_pem, key_pem = certificate(["node-resize-exporter.node-resize-exporter.svc"], [])
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(key_pem)
    web = tmp_path / "web-config.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp_path}/tls.crt\n"
                   f"  key_file: {tmp_path}/tls.key\n")
    with KubeAuthExporter(api.kubeconfig, "--web.config.file", str(web)) as exp:
        served = x509.load_der_x509_certificate(peer_certificate(exp.port))
        assert served == x509.load_pem_x509_certificate(cert_pem)
        assert served.public_bytes(serialization.Encoding.PEM) == cert_pem
        assert _status(_answered(exp.port, fresh)) == 200
        assert _status(_answered(exp.port, "nope")) == 401
        assert "self-signed certificate made at start" not in exp.logs()


def test_extra_sans_are_added_to_the_generated_certificate(api):
    with KubeAuthExporter(api.kubeconfig, "--web.tls.extra-san", "Node-A.example.com",
                          "--web.tls.extra-san", "10.1.2.3") as exp:
        cert = x509.load_der_x509_certificate(peer_certificate(exp.port))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["auth-node", "localhost",
                                                       "node-a.example.com"]
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == \
        {"127.0.0.1", "::1", "10.1.2.3"}


def test_a_bad_extra_san_exits_2_naming_it(api):
    import subprocess
    import sys

    from testkit.exporter_proc import REPO

    r = subprocess.run([sys.executable, "-m", "exporter", "run", "--source", "uevent",
                        "--kubernetes", "off", "--no-journal", "--web.listen-address",
                        f"127.0.0.1:{free_port()}", "--web.auth", "kubernetes",
                        "--kubeconfig", api.kubeconfig, "--web.tls.extra-san", "not a name!"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--web.tls.extra-san 'not a name!'" in r.stderr and "Traceback" not in r.stderr
