"""Issue 16: hostile and broken inputs, each against a real running exporter (`run` as a child
process) where the issue found it that way; the API server is tests/fake_apiserver.py speaking
the real list/watch protocol on loopback."""
from __future__ import annotations

import pytest

from testkit.exporter_proc import RunningExporter, free_port
from tests.fake_apiserver import FakeApiServer

NODE = "hostile-test-node"


@pytest.fixture
def api():
    server = FakeApiServer(port=free_port())
    server.set_node(NODE, cpu="2", memory="8Gi")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _exporter(api, *extra: str) -> RunningExporter:
    return RunningExporter("--kubeconfig", api.kubeconfig_path, "--node-name", NODE,
                           "--source", "sysfs", "--podresources-socket",
                           "/nonexistent/kubelet.sock", *extra)


def test_silent_api_server_from_start_up_is_source_up_0_then_1(api):
    """Item 1: an API server that accepts connections and never answers. Every source has its
    source_up series from the first scrape, and the Kubernetes ones stay 0 (never 1) until the
    server speaks; then they come up without a restart."""
    api.set_silent(True)
    with _exporter(api) as exp:
        first = exp.scrape()
        sources = {dict(k)["source"] for k in first.series("node_resize_exporter_source_up")}
        assert {"sysfs", "kube_node", "kube_pods", "podresources"} <= sources
        assert first.value("node_resize_exporter_source_up", source="kube_node") == 0
        # The list is not answered within its 10 s request timeout: down, said once, with why.
        exp.wait_for(lambda s: "did not answer the nodes list within 10 s" in exp.logs(),
                     timeout=40)
        s = exp.scrape()
        assert s.value("node_resize_exporter_source_up", source="kube_node") == 0
        assert s.value("node_resize_exporter_source_up", source="kube_pods") == 0
        api.set_silent(False)
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="kube_node") == 1
                         and s.value("node_capacity_kubelet", resource="cpu",
                                     unit="core") == 2, timeout=60)
        assert s.value("node_resize_exporter_source_up", source="kube_pods") == 1
