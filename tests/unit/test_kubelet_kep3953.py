"""Feature gates the kubelet reports, and KEP-3953's proposed Node API (CapacityConfigured,
spec.configuredCapacity) with Node objects shaped as the KEP describes them."""
from __future__ import annotations

import copy

import pytest

from exporter.correlate.kubelet_view import KubeletView
from exporter.events import KubeletFeatures, Resource
from exporter.kube.capacity_configured import CapacityConfiguredFilter, capacity_configured
from exporter.sources.kubelet.kubelet_metrics import parse_features

NODE = {
    "kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"},
    "spec": {"configuredCapacity": {"cpu": "2", "memory": "8Gi"}},
    "status": {
        "capacity": {"cpu": "2", "memory": "8Gi"},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "CapacityConfigured", "status": "True", "reason": "Accepted",
             "message": "capacity configured: cpu 2, memory 8Gi",
             "lastTransitionTime": "2026-11-23T10:00:00Z"}]},
}


def with_condition(status: str, reason: str) -> dict:
    node = copy.deepcopy(NODE)
    node["status"]["conditions"][1].update(status=status, reason=reason)
    return node


def test_feature_gates_from_the_kubelets_metrics_text():
    text = ('# TYPE kubernetes_feature_enabled gauge\n'
            'kubernetes_feature_enabled{name="InPlaceNodeResourceResize",stage="ALPHA"} 1\n'
            'kubernetes_feature_enabled{name="NodeResourceHotPlug",stage="ALPHA"} 0\n'
            'kubernetes_feature_enabled{name="SomethingElse",stage="BETA"} 1\n')
    view = KubeletView()
    view.handle(parse_features(text, 1.0))
    assert view.features() == {"InPlaceNodeResourceResize": 1, "NodeResourceHotPlug": 0}


def test_gates_outside_the_four_are_not_labels():
    view = KubeletView()
    view.handle(KubeletFeatures(1.0, {"BalloonPod": True, "x" * 200: True}))
    assert view.features() == {"BalloonPod": 1}


@pytest.mark.parametrize("status, reason", [("True", "Accepted"), ("False", "InProgress"),
                                            ("False", "Infeasible"),
                                            ("True", "EmergencyReduced")])
def test_each_kep_reason_is_the_one_series_at_1(status, reason):
    event = capacity_configured(with_condition(status, reason), 1.0, [])
    assert event is not None and (event.status, event.reason) == (status, reason)
    assert event.configured == {Resource.CPU: 2.0, Resource.MEMORY: 8 * 2**30}
    view = KubeletView()
    view.handle(event)
    values = view.capacity_configured()
    assert values[reason] == 1 and sum(values.values()) == 1


def test_todays_nodes_have_no_condition_and_no_series():
    node = copy.deepcopy(NODE)
    del node["spec"]["configuredCapacity"]
    del node["status"]["conditions"][1]
    assert capacity_configured(node, 1.0, []) is None


def test_unknown_reason_is_other_and_garbage_is_skipped():
    event = capacity_configured(with_condition("True", "Z" * 500), 1.0, [])
    view = KubeletView()
    view.handle(event)
    assert view.capacity_configured()["Other"] == 1 and len(view.capacity_configured()) == 5
    problems: list[str] = []
    node = copy.deepcopy(NODE)
    node["spec"]["configuredCapacity"] = {"cpu": "lots"}
    node["status"]["conditions"] = {"not": "a list"}
    event = capacity_configured(node, 1.0, problems)
    assert event is not None and event.configured == {} and problems
    assert capacity_configured(["not", "a", "node"], 1.0, []) is None


def test_filter_emits_changes_only():
    f = CapacityConfiguredFilter()
    assert f.feed(with_condition("False", "InProgress"), 1.0, []) is not None
    assert f.feed(with_condition("False", "InProgress"), 2.0, []) is None  # a heartbeat
    assert f.feed(with_condition("True", "Accepted"), 3.0, []).reason == "Accepted"
    node = copy.deepcopy(NODE)
    del node["spec"]["configuredCapacity"]
    del node["status"]["conditions"][1]
    gone = f.feed(node, 4.0, [])
    assert gone is not None and gone.status == ""  # the condition went away: said once
    assert f.feed(node, 5.0, []) is None
    view = KubeletView()
    view.handle(gone)
    assert view.capacity_configured() == {}


def test_a_pod_failed_node_capacity_exceeded_is_a_readmission_rejection():
    """KEP-3953: after a capacity decrease the kubelet fails pods that no longer fit with
    reason NodeCapacityExceeded; the episode counts them as rejected under that reason."""
    from exporter.correlate.model import PodVerdict, UpdateKind
    from exporter.events import Direction
    from testkit.correlator_stream import Stream

    s = Stream(kubernetes=True, readmission_settle=2.0)
    s.snapshot(0, cpus=2)
    s.node(0.1, cpu=2)
    s.pod(0.2, "big", requests={Resource.CPU: 1.5})
    s.transition(1.0, Resource.CPU, 1, Direction.OFFLINE)
    s.snapshot(1.05, cpus=1)
    s.tick(3.5)
    s.node(4.0, cpu=1)
    s.pod(4.5, "big", phase="Failed", reason="NodeCapacityExceeded", ready=False,
          requests={Resource.CPU: 1.5})
    [ended] = [u for u in s.tick(10.0) if u.kind is UpdateKind.ENDED]
    [rejected] = [p for p in ended.episode.pods if p.outcome is PodVerdict.REJECTED]
    assert rejected.reason == "NodeCapacityExceeded"
    assert s.stats.readmission_pods[("rejected", "NodeCapacityExceeded")] == 1


def test_the_view_knows_the_gates_the_source_reads():
    from exporter.correlate import kubelet_view
    from exporter.sources.kubelet import kubelet_metrics
    assert kubelet_view.GATES == kubelet_metrics.GATES
