"""/metrics through prometheus_client's exposition: OpenMetrics on request,
gzip, HEAD, process_* and python_*, the telemetry path; one rendering per state version and
format shared by concurrent scrapes. A real MetricsServer on loopback, real HTTP clients."""
from __future__ import annotations

import gzip
import http.client
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from exporter.web.server import MetricsServer, WebSettings


@pytest.fixture
def server():
    registry = CollectorRegistry()
    Gauge("node_resize_kernel_cpus", "CPUs by state", ["state"], registry=registry) \
        .labels("online").set(2)
    Counter("node_resize_kernel_transitions", "transitions", registry=registry).inc()
    srv = MetricsServer(WebSettings("127.0.0.1", 0), registry, version=lambda: 1)
    srv.start()
    yield srv
    srv.stop()


def get(port: int, path: str, method: str = "GET", **headers: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_plain_text_by_default(server):
    status, headers, body = get(server.port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"node_resize_kernel_cpus", "node_resize_kernel_transitions"} <= names


def test_openmetrics_when_asked(server):
    status, headers, body = get(server.port, "/metrics",
                                Accept="application/openmetrics-text; version=1.0.0; "
                                       "charset=utf-8,text/plain;version=0.0.4;q=0.5")
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    families = {f.name: f for f in om_families(body.decode())}  # the strict parser
    assert families["node_resize_kernel_transitions"].type == "counter"


def test_gzip_when_accepted(server):
    _, _, plain = get(server.port, "/metrics")
    status, headers, body = get(server.port, "/metrics", Accept_Encoding="gzip, deflate")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert len(body) < len(plain)
    assert b"node_resize_kernel_cpus" in gzip.decompress(body)


def test_head_is_answered_without_a_body(server):
    _, _, body = get(server.port, "/metrics")
    status, headers, head_body = get(server.port, "/metrics", method="HEAD")
    assert status == 200 and head_body == b""
    assert int(headers["content-length"]) == len(body)


def test_process_metrics_and_only_those_read(server):
    """The five process_* families of the series budget (docs/metrics.md), not python_*."""
    _, _, body = get(server.port, "/metrics")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {n for n in names if n.startswith(("process_", "python_"))} == {
        "process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
        "process_max_fds", "process_start_time_seconds"}


def test_a_client_version_prometheus_client_cannot_compare_still_gets_text(server):
    # choose_encoder compares ("1", "a") with (1, 0, 0): a TypeError inside prometheus_client.
    status, headers, body = get(server.port, "/metrics",
                                Accept="application/openmetrics-text; version=1.a")
    assert status == 200 and headers["content-type"].startswith("text/plain")


def test_other_methods_get_405(server):
    status, headers, _ = get(server.port, "/metrics", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_concurrent_scrapes_share_one_rendering_per_format(server):
    server.exposition.max_age = 60.0  # the state version (constant here) decides alone
    before = server.exposition.renderings
    results, barrier = [], threading.Barrier(20)

    def scrape(i: int) -> None:
        barrier.wait()
        accept = "application/openmetrics-text; version=1.0.0" if i % 2 else "*/*"
        results.append(get(server.port, "/metrics", Accept=accept)[0])

    threads = [threading.Thread(target=scrape, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [200] * 20
    assert server.exposition.renderings - before == 2  # text and OpenMetrics, once each


def test_telemetry_path_is_a_parameter_and_the_index_links_it():
    registry = CollectorRegistry()
    Gauge("node_resize_kernel_cpus", "CPUs", registry=registry).set(1)
    srv = MetricsServer(WebSettings("127.0.0.1", 0, telemetry_path="/custom/metrics"), registry)
    srv.start()
    try:
        assert get(srv.port, "/custom/metrics")[0] == 200
        assert get(srv.port, "/metrics")[0] == 404
        status, _, index = get(srv.port, "/")
        assert status == 200 and b'href="/custom/metrics"' in index
    finally:
        srv.stop()


@pytest.mark.parametrize("path", ["metrics", "/", "/healthz", "/a b"])
def test_a_bad_telemetry_path_is_refused(path):
    with pytest.raises(ValueError, match="--web.telemetry-path"):
        MetricsServer(WebSettings("127.0.0.1", 0, telemetry_path=path), CollectorRegistry())


def test_kept_alive_connections_have_nagle_off():
    """A kept-alive scraper must not wait out its delayed ACK (40 ms) on every scrape: the
    server's accepted sockets get TCP_NODELAY, which asyncio leaves off for a listening socket
    made with proto 0, as ours is."""
    import asyncio
    import socket

    from exporter.web.server import _no_delay

    async def main() -> tuple[int, int]:
        seen: list[tuple[int, int]] = []
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # proto 0, as the server
        listener.bind(("127.0.0.1", 0))

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            before = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            _no_delay(writer)
            seen.append((before, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
            writer.close()

        server = await asyncio.start_server(handle, sock=listener)
        _, w = await asyncio.open_connection(*listener.getsockname())
        while not seen:
            await asyncio.sleep(0.01)
        w.close()
        server.close()
        return seen[0]

    before, after = asyncio.run(main())
    assert before == 0  # the premise: asyncio did not set it
    assert after != 0
