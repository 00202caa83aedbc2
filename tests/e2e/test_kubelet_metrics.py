"""The kubelet /metrics scrape: feature gates and native resize metrics, over real HTTP."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from exporter.clock import MonotonicWallClock
from exporter.events import KubeletFeatures, MalformedInput, SourceStatus
from exporter.sources.kubelet.kubelet_metrics import KubeletMetricsSource, parse_features
from testkit.event_log import EventLog
from testkit.fakes.kubelet_metrics import Hostile


def kubelet_exposition(native: bool) -> bytes:
    """What a kubelet's /metrics looks like, rendered by the real client library."""
    registry = CollectorRegistry()
    gates = Gauge("kubernetes_feature_enabled", "feature gates", ["name", "stage"],
                  registry=registry)
    gates.labels("InPlaceNodeResourceResize", "ALPHA").set(1)
    gates.labels("NodeResourceHotUnPlug", "ALPHA").set(0)
    gates.labels("InPlacePodVerticalScaling", "BETA").set(1)
    Counter("kubelet_running_pods_dummy", "unrelated", registry=registry).inc()
    if native:
        Counter("kubelet_node_resize_requests_total", "resize requests",
                ["resource", "direction"], registry=registry).labels("cpu", "increase").inc()
        Histogram("node_resize_resync_duration_seconds", "resync",
                  registry=registry).observe(0.5)
    return generate_latest(registry)


class Kubelet:
    def __init__(self) -> None:
        self.body = kubelet_exposition(native=False)
        self.status = 200
        self.auth_headers: list[str | None] = []
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                kubelet.auth_headers.append(self.headers.get("Authorization"))
                self.send_response(kubelet.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(kubelet.body)))
                self.end_headers()
                self.wfile.write(kubelet.body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def kubelet():
    k = Kubelet()
    yield k
    k.stop()


def test_gates_and_native_metrics(kubelet, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    log = EventLog()
    source = KubeletMetricsSource(MonotonicWallClock(), url=kubelet.url, token_file=str(token))
    source.poll(log.emit)
    features = log.of(KubeletFeatures)[-1]
    assert features.gates == {"InPlaceNodeResourceResize": True, "NodeResourceHotUnPlug": False}
    assert features.native_metrics == frozenset()
    assert log.of(SourceStatus)[-1].up
    assert kubelet.auth_headers[-1] == "Bearer s3cret"

    source.poll(log.emit)  # unchanged: no new event
    assert len(log.of(KubeletFeatures)) == 1
    kubelet.body = kubelet_exposition(native=True)
    source.poll(log.emit)
    assert log.of(KubeletFeatures)[-1].native_metrics == {
        "kubelet_node_resize_requests_total", "node_resize_resync_duration_seconds"}


def test_garbage_is_malformed_and_errors_are_down(kubelet):
    log = EventLog()
    source = KubeletMetricsSource(MonotonicWallClock(), url=kubelet.url, token_file="")
    kubelet.body = b"<html><body>login required</body></html>\n"
    source.poll(log.emit)
    assert len(log.of(MalformedInput)) == 1 and log.of(KubeletFeatures) == []
    kubelet.status = 403
    source.poll(log.emit)
    down = log.of(SourceStatus)[-1]
    assert not down.up and "403" in down.reason and "RBAC" in down.reason
    assert kubelet.auth_headers[-1] is None


def test_unreachable_is_down():
    log = EventLog()
    KubeletMetricsSource(MonotonicWallClock(), url="http://127.0.0.1:1/metrics",
                         token_file="").poll(log.emit)
    down = log.of(SourceStatus)[-1]
    assert not down.up and "unreachable" in down.reason


def test_parse_features_text_without_type_lines():
    text = ('kubernetes_feature_enabled{name="BalloonPod",stage="ALPHA"} 1\n'
            'kubelet_node_resize_errors_total{subsystem="cpumanager"} 3\n')
    features = parse_features(text, 1.0)
    assert features.gates == {"BalloonPod": True}
    assert features.native_metrics == {"kubelet_node_resize_errors_total"}


# ------------------------------------------------------------ Hostile URLs




def _token(tmp_path) -> str:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return str(token)


def test_a_redirect_is_not_followed_and_the_token_stays(tmp_path):
    """A 302 to another host took the service account token along."""
    elsewhere = Hostile(lambda h: (h.send_response(200), h.send_header("Content-Length", "0"),
                                   h.end_headers()), host="127.0.0.2")

    def redirect(h):
        h.send_response(302)
        h.send_header("Location", elsewhere.url)
        h.send_header("Content-Length", "0")
        h.end_headers()

    first = Hostile(redirect)
    try:
        log = EventLog()
        KubeletMetricsSource(MonotonicWallClock(), url=first.url,
                             token_file=_token(tmp_path)).poll(log.emit)
        down = log.of(SourceStatus)[-1]
        assert not down.up and "redirected (302)" in down.reason and "not followed" in down.reason
        assert elsewhere.auth_headers == []  # never asked, so never given the token
        assert log.of(KubeletFeatures) == []
    finally:
        first.stop()
        elsewhere.stop()


def test_a_trickling_answer_is_dropped_within_its_time_bound():
    """One byte at a time wedged the source for good, with no source_up."""
    stop = threading.Event()

    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        while not stop.is_set():
            h.wfile.write(b"#")
            h.wfile.flush()
            stop.wait(0.1)

    server = Hostile(trickle)
    try:
        log = EventLog()
        source = KubeletMetricsSource(MonotonicWallClock(), url=server.url, timeout=1.0,
                                      token_file="")
        source.poll(log.emit)  # returns: that it does at all is the fix
        down = log.of(SourceStatus)[-1]
        assert not down.up and "answer not complete after 1 s" in down.reason
    finally:
        stop.set()
        server.stop()


def test_an_answer_past_the_size_bound_is_refused(monkeypatch):
    from exporter.sources.kubelet import kubelet_metrics
    monkeypatch.setattr(kubelet_metrics, "MAX_BYTES", 2**20)
    body = b"# " + b"x" * (2 * 2**20) + b"\n"

    def big(h):
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    server = Hostile(big)
    try:
        log = EventLog()
        KubeletMetricsSource(MonotonicWallClock(), url=server.url, token_file="").poll(log.emit)
        down = log.of(SourceStatus)[-1]
        assert not down.up and f"answer larger than {2**20} bytes" in down.reason
    finally:
        server.stop()


@pytest.mark.parametrize("url", ["file:///etc/shadow", "http://10.1.2.3:10255/metrics",
                                 "https://admin:pw@127.0.0.1/metrics", "gopher://x/"])
def test_a_url_the_token_must_not_go_to_is_refused(url, tmp_path):
    """At start-up (exit 2 naming the flag), and by the source itself: a file URL is never
    read (its first line was logged)."""
    import subprocess
    import sys

    from testkit.exporter_proc import REPO, free_port
    done = subprocess.run([sys.executable, "-m", "exporter", "run", "--web.listen-address",
                           f"127.0.0.1:{free_port()}", "--no-journal", "--kubernetes", "off",
                           "--kubelet-metrics-url", url], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "--kubelet-metrics-url" in done.stderr and "https://NODE:10250/metrics" in \
        done.stderr or "credentials in the URL" in done.stderr
    assert "pw" not in done.stderr
    log = EventLog()
    KubeletMetricsSource(MonotonicWallClock(), url=url, token_file=_token(tmp_path)).poll(
        log.emit)
    down = log.of(SourceStatus)[-1]
    assert not down.up and "root:" not in down.reason
    assert log.of(KubeletFeatures) == [] and log.of(MalformedInput) == []
