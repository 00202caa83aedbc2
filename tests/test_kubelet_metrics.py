"""The kubelet /metrics scrape: feature gates and native resize metrics, over real HTTP."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from exporter.clock import MonotonicWallClock
from exporter.events import KubeletFeatures, MalformedInput, SourceStatus
from exporter.sources.kubelet_metrics import KubeletMetricsSource, parse_features
from tests.event_log import EventLog


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
