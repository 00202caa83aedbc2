"""The pod watch (pods on this node) and Pod JSON -> PodStatus conversion."""
from __future__ import annotations

import click
import pytest

from exporter.clock import MonotonicWallClock
from exporter.config.decide import resolve_node_name
from exporter.config.options import Options
from exporter.config.types import LabelSelectorText
from exporter.events import MalformedInput, PodsRelisted, PodStatus, Resource, SourceStatus
from exporter.kube.convert import LabelSelector, pod_status
from exporter.sources import registry
from exporter.sources.apiserver.kube_pods import BALLOON_SELECTOR, KubePodsSource
from testkit.event_log import EventLog, started_sources
from testkit.fakes.apiserver import FakeApiServer

MiB = 2**20
BALLOON = {"node-resize-exporter.io/balloon": "true"}


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def running(api):
    yield from started_sources(lambda node="n1": KubePodsSource(
        MonotonicWallClock(), node_name=node, kubeconfig=api.kubeconfig_path,
        balloon_selector=BALLOON_SELECTOR.default, backoff_initial=0.05, backoff_max=0.5))


def by_name(log: EventLog, name: str) -> list[PodStatus]:
    return [e for e in log.of(PodStatus) if e.name == name]


def test_lists_pods_of_this_node_with_balloons(api, running):
    web = api.put_pod("web", node="n1", requests={"cpu": "250m", "memory": "64Mi"},
                      containers=2)
    balloon = api.put_pod("balloon", node="n1", labels=BALLOON,
                          requests={"cpu": "1", "memory": "1Gi"})
    kep = api.put_pod("kep-balloon", node="n1", namespace="kube-system",
                      priority_class="system-balloon", requests={"cpu": "500m"})
    api.put_pod("elsewhere", node="n2")
    source, log = running()
    relisted = log.wait_for(PodsRelisted)
    assert relisted.uids == {web["metadata"]["uid"], balloon["metadata"]["uid"],
                             kep["metadata"]["uid"]}
    pods = {e.name: e for e in log.of(PodStatus)}
    assert set(pods) == {"web", "balloon", "kep-balloon"}
    assert pods["web"].requests == {Resource.CPU: 0.5, Resource.MEMORY: 128 * MiB}
    assert not pods["web"].balloon and pods["web"].resize is None
    assert pods["web"].phase == "Running" and pods["web"].ready
    assert pods["balloon"].balloon and pods["balloon"].requests[Resource.MEMORY] == 1024 * MiB
    assert pods["kep-balloon"].balloon and pods["kep-balloon"].namespace == "kube-system"
    assert api.requests_for("pods")[0]["fieldSelector"] == "spec.nodeName=n1"


def test_changes_deletes_and_admission_rejections(api, running):
    api.put_pod("web", node="n1")
    source, log = running()
    log.wait_for(PodsRelisted)
    api.wait_for_watches(1, "pods")
    api.put_pod("web", node="n1")  # same content, new RV: not a change worth an event
    api.put_pod("late", node="n1", phase="Failed", reason="OutOfcpu", ready=False)
    rejected = log.wait_for(PodStatus, lambda e: e.name == "late")
    assert (rejected.phase, rejected.reason, rejected.ready) == ("Failed", "OutOfcpu", False)
    api.delete_pod("web")
    gone = log.wait_for(PodStatus, lambda e: e.name == "web" and e.deleted)
    assert gone.deleted
    assert [e.deleted for e in by_name(log, "web")] == [False, True]


def test_relist_after_gap_reports_only_changes(api, running):
    keep = api.put_pod("keep", node="n1")
    api.put_pod("vanish", node="n1")
    api.put_pod("grow", node="n1", labels=BALLOON, requests={"cpu": "1"})
    source, log = running()
    log.wait_for(PodsRelisted)
    api.wait_for_watches(1, "pods")
    api.hold_watches()
    api.drop_watches()
    api.delete_pod("vanish")
    api.put_pod("grow", node="n1", labels=BALLOON, requests={"cpu": "2"})
    api.compact(expire_watches=False)  # the deletion is no longer in the history
    api.release_watches()
    second = log.wait_for(PodsRelisted, count=2)
    assert source.relists_gone == 1
    assert keep["metadata"]["uid"] in second.uids
    assert len(second.uids) == 2  # "vanish" is gone: the correlator learns it from here
    assert len(by_name(log, "keep")) == 1  # unchanged: not emitted twice
    assert len(by_name(log, "vanish")) == 1
    assert [e.requests[Resource.CPU] for e in by_name(log, "grow")] == [1.0, 2.0]


def test_malformed_quantity_counted_rest_flows(api, running):
    api.put_pod("bad", node="n1", requests={"cpu": "lots", "memory": "64Mi"})
    api.put_pod("good", node="n1", requests={"cpu": "100m"})
    source, log = running()
    relisted = log.wait_for(PodsRelisted)
    assert len(relisted.uids) == 2
    bad = by_name(log, "bad")[0]
    assert bad.requests == {Resource.MEMORY: 64 * MiB}
    problems = log.of(MalformedInput)
    # spec requests and the kubelet-reported resources both carry it: two places, two counts
    assert len(problems) == 2
    assert all("lots" in p.detail and "default/bad" in p.detail for p in problems)
    assert by_name(log, "good")[0].requests == {Resource.CPU: 0.1}
    api.put_raw("pods", {"kind": "Pod", "apiVersion": "v1",
                         "metadata": {"name": "no-uid", "namespace": "default"},
                         "spec": {"nodeName": "n1"}})
    log.wait_for(MalformedInput, lambda e: "without metadata.uid" in e.detail)
    api.put_pod("after", node="n1")
    log.wait_for(PodStatus, lambda e: e.name == "after")


def test_forbidden_then_recovers(api, running):
    api.put_pod("web", node="n1")
    api.set_forbidden(True)
    source, log = running()
    down = log.wait_for(SourceStatus)
    assert not down.up and "RBAC" in down.reason and "pods" in down.reason
    api.set_forbidden(False)
    log.wait_for(PodsRelisted)
    assert log.of(SourceStatus)[-1].up


# ---------------------------------------------------------------- pure conversion


def pod(**kwargs) -> dict:
    return FakeApiServer().put_pod("p", node="n1", **kwargs)  # builder only; never started


def test_resize_state_from_conditions():
    obj = pod(labels=BALLOON, requests={"cpu": "2"}, applied={"cpu": "1"},
              conditions=[{"type": "PodResizePending", "status": "True", "reason": "Deferred",
                           "message": "Node didn't have enough capacity"}])
    event = pod_status(obj, 5.0, LabelSelector(BALLOON_SELECTOR.default)).event
    assert event.resize.pending_reason == "Deferred"
    assert event.resize.desired == {Resource.CPU: 2.0}
    assert event.resize.applied == {Resource.CPU: 1.0}
    assert not event.resize.in_progress

    obj = pod(conditions=[{"type": "PodResizeInProgress", "status": "True", "reason": "Error",
                           "message": "failed to update cgroup"}])
    event = pod_status(obj, 5.0, None).event
    assert event.resize.in_progress and event.resize.in_progress_error
    assert not event.balloon


def test_resize_state_from_deprecated_status_resize():
    event = pod_status(pod(resize="Infeasible"), 1.0, None).event
    assert event.resize.pending_reason == "Infeasible"
    event = pod_status(pod(resize="InProgress"), 1.0, None).event
    assert event.resize.in_progress and not event.resize.in_progress_error


def test_odd_objects_never_raise():
    for obj in [{}, None, [], {"metadata": "x"}, {"metadata": {"uid": "u"}, "spec": 3,
                                                   "status": {"conditions": [1, None]}}]:
        converted = pod_status(obj, 0.0, None)
        assert converted.event is None or converted.event.uid == "u"
    event = pod_status({"metadata": {"uid": "u"}}, 0.0, None).event
    assert (event.phase, event.ready, event.requests) == ("", False, {})


def test_label_selector_grammar():
    s = LabelSelector("a=1,b==2,c!=3,d,!e")
    assert s.matches({"a": "1", "b": "2", "d": ""})
    assert not s.matches({"a": "1", "b": "2", "c": "3", "d": ""})
    assert not s.matches({"a": "1", "b": "2", "d": "", "e": "x"})
    assert not s.matches({"a": "1", "b": "2"})
    assert not LabelSelector("").matches({"a": "1"})
    with pytest.raises(ValueError):
        LabelSelector("tier in (a,b)")
    with pytest.raises(click.BadParameter, match="set-based"):  # --balloon-selector: exit 2
        LabelSelectorText().convert("env in (a)", None, None)


API_SOURCES = ("kube_node", "kube_pods", "podresources", "kubelet_metrics")


def _kube_sources(options: Options) -> list[str]:
    """The API-side sources the registry builds for `options`, in start order (other
    Kubernetes-group sources, such as the kubelet's checkpoints, are not this test's)."""
    ctx = registry.SourceContext(options, MonotonicWallClock(), "n1")
    built = [spec.factory(ctx).name for spec in registry.specs(registry.KUBERNETES)
             if spec.wanted(options)]
    return [name for name in built if name in API_SOURCES]


def test_registry_builds_the_kube_sources_the_options_ask_for(monkeypatch):
    registry.load()  # every source's options declared (kubelet_metrics_url is that source's)
    assert _kube_sources(Options(kubelet_metrics_url="http://127.0.0.1:1/metrics")) == [
        "kube_node", "kube_pods", "podresources", "kubelet_metrics"]
    assert _kube_sources(Options(podresources_socket="")) == ["kube_node", "kube_pods"]
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert resolve_node_name(Options(node_name="flag")) == "flag"
    assert resolve_node_name(Options()) == "from-env"
    monkeypatch.delenv("NODE_NAME")
    assert resolve_node_name(Options())  # the hostname


def test_a_list_of_more_objects_than_the_bound_is_refused_then_recovers(api, running,
                                                                          monkeypatch):
    """Item 7: a pod list is bounded in objects (LIST_MAX_OBJECTS; 20 here instead of 10,000
    so the test stays small): past it, down naming the bound, nothing of it used."""
    from exporter.sources.apiserver import listwatch
    from testkit.event_log import wait_until
    monkeypatch.setattr(listwatch, "LIST_MAX_OBJECTS", 20)
    for i in range(21):
        api.put_pod(f"p{i}", node="n1")
    source, log = running()
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert "list of pods has more than 20 objects" in down.reason
    assert not log.of(PodStatus) and not log.of(PodsRelisted)
    api.delete_pod("p20")
    relisted = log.wait_for(PodsRelisted)
    assert len(relisted.uids) == 20
    wait_until(lambda: log.of(SourceStatus)[-1].up, "up again")


def test_poison_pod_is_counted_and_the_others_flow(api, running):
    """Item 6: one pod with a 400-digit request and one with a negative one are counted in
    MalformedInput; every pod still arrives, without the bad values."""
    api.put_pod("huge", node="n1", requests={"cpu": "9" * 400})
    api.put_pod("negative", node="n1", requests={"memory": "-4Gi"})
    api.put_pod("fine", node="n1", requests={"cpu": "1"})
    source, log = running()
    log.wait_for(PodsRelisted)
    assert {p.name for p in log.of(PodStatus)} == {"huge", "negative", "fine"}
    assert by_name(log, "huge")[0].requests.get(Resource.CPU) is None
    assert by_name(log, "negative")[0].requests.get(Resource.MEMORY) is None
    assert by_name(log, "fine")[0].requests[Resource.CPU] == 1.0
    # Each bad value is reported where it is (spec requests and status resources), never
    # with all 400 digits.
    details = [m.detail for m in log.of(MalformedInput)]
    assert details and all(len(d) < 400 for d in details)
    assert any("huge" in d for d in details) and any("negative" in d for d in details)
    assert source.lists == 1


def test_pods_of_other_nodes_are_counted_and_skipped_whatever_the_server_applied(api, running):
    """An API server (or a proxy) that ignores fieldSelector answers every pod of the cluster:
    only pods whose spec.nodeName is this node are used; the others are counted, once each."""
    api.ignore_field_selector = True
    api.put_pod("mine", node="n1", labels=BALLOON, requests={"cpu": "500m"})
    for i in range(5):
        api.put_pod(f"other-{i}", node="n2", labels=BALLOON, requests={"cpu": "8"})
    api.put_pod("unscheduled", node="", labels=BALLOON)
    source, log = running()
    relisted = log.wait_for(PodsRelisted)
    assert len(relisted.uids) == 1
    assert [e.name for e in log.of(PodStatus)] == ["mine"]
    first = log.wait_for(MalformedInput, lambda m: "not asked for" in m.detail)
    assert "6 pods" in first.detail and "spec.nodeName=n1" in first.detail
    api.wait_for_watches(1, "pods")
    api.put_pod("other-0", node="n2", phase="Failed", reason="OutOfcpu")  # not our rejection
    api.put_pod("mine", node="n1", labels=BALLOON, requests={"cpu": "500m"}, ready=False)
    log.wait_for(PodStatus, lambda e: e.name == "mine", count=2)
    assert {e.name for e in log.of(PodStatus)} == {"mine"}
    # other-0 was reported in the list already: not counted again
    assert len([m for m in log.of(MalformedInput) if "not asked for" in m.detail]) == 1
    api.put_pod("other-new", node="n3")
    log.wait_for(MalformedInput, lambda m: "not asked for" in m.detail, count=2)
