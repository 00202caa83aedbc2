"""Issue 34: one room for the one-shot reads `check` and `plan` share (exporter/readnow): the
kernel now, the checkpoints, one scan of the running containers, one bounded list of this
node's Node and pods. The sinks judge what it read; they import no source and no API client."""
from __future__ import annotations

import pytest

from exporter.config.options import Options
from exporter.readnow import Reads
from exporter.sinks import collectors
from testkit.fakes.apiserver import FakeApiServer
from tests.unit.test_import_graph import import_graph


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def test_one_check_lists_this_nodes_pods_once_and_bounded(api, tmp_path):
    """Before: the running-containers line listed the pods unbounded and the forecast's line
    listed them again, bounded: two lists, two ways."""
    api.set_node("n1", cpu="64", allocatable_cpu="63")
    for i in range(3):
        api.put_pod(f"p{i}", node="n1", requests={"cpu": "100m"})
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    cgroup = tmp_path / "cgroup" / "kubepods.slice"  # cgroup v2, no container yet
    cgroup.mkdir(parents=True)
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpuset cpu memory\n")
    options = Options().replace(kubeconfig=kubeconfig, node_name="n1", kubelet_root_dir="",
                                cgroup_root=str(tmp_path / "cgroup"))
    reads = Reads(options)
    lines = collectors.checks(reads, kubernetes=False) + \
        collectors.checks(reads, kubernetes=True)
    by_name = {line.name: line for line in lines}
    assert "cgroup v2" in by_name["running containers"].detail, by_name["running containers"]
    assert "3 pods" in by_name["readmission forecast"].detail, by_name["readmission forecast"]
    listed = api.requests_for("pods", watch=False)
    assert len(listed) == 1, listed
    assert listed[0].get("limit") == "500"  # paged; at most LIST_MAX_OBJECTS read


def test_the_sinks_import_no_source_and_no_api_client():
    graph = import_graph()
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items()
                   if m.startswith("exporter.sinks.") and m != "exporter.sinks.kube_events"
                   for t in targets
                   if t.startswith("exporter.sources") or t == "exporter.kube.client")
    # kube_events posts Events: the API client is its transport, not a read.
    assert wrong == []
