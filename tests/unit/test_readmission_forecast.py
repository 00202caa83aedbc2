"""The readmission forecast (exporter/correlate/readmission_forecast.py): which pods a kubelet
restart now would reject, and why, judged before the restart.

First against the real thing: a kubelet v1.36 restarted after cpu1 went offline rejected both
recorded pods OutOfcpu (tests/fixtures/kubelet-v1.36); the forecast, made from the events the
exporter had before that restart, must name exactly those two. Then constructed cases for each
rule the kubelet applies (order, init containers and sidecars, overhead, memory, hugepages,
maxPods, the static CPU manager, in-place resizes), and bad input.
"""
from __future__ import annotations

from datetime import datetime

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter import codec
from exporter.clock import FakeClock
from exporter.correlate.correlator import Correlator
from exporter.correlate.model import UpdateKind
from exporter.correlate.readmission_forecast import (
    CPU_MANAGER,
    LISTED_MAX,
    OUT_OF_CPU,
    OUT_OF_HUGEPAGES_2MI,
    OUT_OF_MEMORY,
    OUT_OF_PODS,
    ReadmissionForecast,
)
from exporter.events import (
    Direction,
    DownCause,
    PodsRelisted,
    PodStatus,
    Resource,
    Result,
    SourceStatus,
    Transition,
)
from exporter.kube.convert import node_status, pod_status
from exporter.sinks.forecast_collector import ForecastCollector
from testkit.correlator import config
from testkit.exporter_proc import Scrape
from testkit.forecast import (
    GiB,
    MiB,
    T,
    forecast,
    forecaster,
    node,
    pod,
    rejected,
    snapshot,
    static_policy,
)
from testkit.kube_replay import recording


def at(stamp: str) -> float:
    return datetime.fromisoformat(f"2026-11-23T{stamp}Z").timestamp()


# ---------------------------------------------------------------- the recorded readmission


def _recorded_before_restart() -> tuple[dict, list[dict]]:
    """The recorded Node before the restart (capacity 2, allocatable 1) and the pod objects
    the watch delivered until both pods ran, before cpu1 went offline (RV 1121)."""
    node_obj = recording("node-watch-cpu1-unplug-restart.jsonl")[0]["object"]
    pods = [e["object"] for e in recording("pods-watch-readmission-outofcpu.jsonl")
            if e["type"] != "BOOKMARK" and int(e["object"]["metadata"]["resourceVersion"]) <= 1121]
    return node_obj, pods


def test_forecast_names_the_two_pods_the_real_kubelet_rejected():
    node_obj, pods = _recorded_before_restart()
    assert {p["metadata"]["name"] for p in pods} == {"sleeper-1", "sleeper-2"}
    # cpu1 online: everything fits.
    assert rejected(forecast(node_obj, snapshot(2, 24684084 * 1024), pods)) == []
    # cpu1 offline, the kubelet not yet restarted: capacity 1 minus the 1 CPU reserved.
    result = forecast(node_obj, snapshot(1, 24684084 * 1024), pods)
    assert sorted(rejected(result)) == [("sleeper-1", OUT_OF_CPU), ("sleeper-2", OUT_OF_CPU)]
    assert result.rejected_total == 2 and result.pods == 2
    assert result.by_reason == {OUT_OF_PODS: 0, OUT_OF_CPU: 2, OUT_OF_MEMORY: 0}


@pytest.mark.parametrize("pod_source", ["up", "forbidden"])
def test_the_episode_carries_the_forecast_the_restart_then_proved_right(pod_source):
    """Through the Correlator on the recording's own clock: the episode of cpu1's unplug
    carries the forecast made before the restart, and the pods the kubelet then really
    rejected are exactly the ones it named; through the journal's codec unchanged."""
    node_events = recording("node-watch-cpu1-unplug-restart.jsonl")
    pod_events = [e for e in recording("pods-watch-readmission-outofcpu.jsonl")
                  if e["type"] != "BOOKMARK"]
    clock = FakeClock(at("08:30:00"))
    c = Correlator(config(kubernetes=True, readmission_settle=10), clock)
    updates = []

    def feed(event, when: float) -> None:
        clock.t = when
        updates.extend(c.handle(event))

    feed(snapshot(2, 24684084 * 1024, when=clock.t), clock.t)
    feed(node_status(node_events[0]["object"], clock.t).event, clock.t)
    feed(SourceStatus("kube_pods", True, clock.t, "listed pods (2)"), clock.t)  # as it does
    before, after = [], []
    for e in pod_events:
        (before if int(e["object"]["metadata"]["resourceVersion"]) <= 1121 else after).append(e)
    for e in before:
        feed(pod_status(e["object"], clock.t, None).event, clock.t)
    if pod_source == "forbidden":  # RBAC changed: the pods can no longer be seen
        feed(SourceStatus("kube_pods", False, clock.t, "RBAC: forbidden to list/watch pods: "
                          "pods is forbidden", DownCause.FORBIDDEN), clock.t)
    off = at("08:31:00")
    feed(Transition("bpf", Resource.CPU, 1, Direction.OFFLINE, Result.SUCCESS, off,
                    off - 0.0078125), off)
    feed(snapshot(1, 24684084 * 1024, when=off), off)
    clock.t = at("08:31:03")
    updates.extend(c.tick())
    open_now = c.open_episodes()
    assert len(open_now) == 1
    # The restart: the pods' first statuses, the Node resynced (capacity 1, allocatable 0),
    # then both pods Failed OutOfcpu.
    for e in after[:2]:
        feed(pod_status(e["object"], at("08:31:30"), None).event, at("08:31:30"))
    feed(node_status(node_events[3]["object"], at("08:31:32")).event, at("08:31:32"))
    for e in after[2:]:
        feed(pod_status(e["object"], at("08:31:33"), None).event, at("08:31:33"))
    clock.t = at("08:31:42")
    updates.extend(c.tick())
    ended = [u.episode for u in updates if u.kind is UpdateKind.ENDED]
    assert len(ended) == 1
    ep = ended[0]
    if pod_source == "forbidden":  # never a forecast of pods it could not see
        assert ep.forecast is None and c.forecast_validity.current.reason == "pods_forbidden"
        return
    assert ep.forecast is not None
    assert sorted((r.name, r.reason) for r in ep.forecast.rejected) == \
        [("sleeper-1", OUT_OF_CPU), ("sleeper-2", OUT_OF_CPU)]
    really = sorted((p.name, p.reason) for p in ep.pods if p.outcome.value == "rejected")
    assert really == sorted((r.name, r.reason) for r in ep.forecast.rejected)
    # After the restart nothing more would be rejected (both pods are Failed): the live
    # forecast says so, the episode keeps what it said before.
    assert c.forecast.result().rejected_total == 0
    assert codec.loads(codec.dumps(ep)) == ep


# ---------------------------------------------------------------- the kubelet's rules


def test_pods_are_readmitted_oldest_first():
    pods = [pod("young", {"cpu": "600m"}, created="08:00:05"),
            pod("old", {"cpu": "600m"}, created="08:00:01")]
    assert rejected(forecast(node(), snapshot(2), pods)) == [("young", OUT_OF_CPU)]
    pods[0] = pod("young", {"cpu": "600m"}, created="07:59:00")
    assert rejected(forecast(node(), snapshot(2), pods)) == [("old", OUT_OF_CPU)]


def test_same_second_is_ordered_by_namespace_and_name():
    pods = [pod("b", {"cpu": "600m"}), pod("a", {"cpu": "600m"})]
    assert rejected(forecast(node(), snapshot(2), pods)) == [("b", OUT_OF_CPU)]


def test_a_rejected_pod_holds_nothing_and_zero_requests_always_fit():
    """A later, smaller pod still fits after a bigger one was rejected; a pod without
    requests (BestEffort) is admitted even with no CPU left (fitsRequest checks only
    requests above 0)."""
    pods = [pod("big", {"cpu": "2"}, created="08:00:01"),
            pod("small", {"cpu": "900m"}, created="08:00:02"),
            pod("besteffort", None, created="08:00:03")]
    result = forecast(node(), snapshot(2), pods)
    assert rejected(result) == [("big", OUT_OF_CPU)]
    assert result.pods == 3


def test_init_containers_count_as_the_kubelet_counts_them():
    # max(app 200m, init 900m) = 900m > 850m allocatable
    n = node(cpu="2", allocatable_cpu="850m")
    one = pod("init-heavy", {"cpu": "200m"}, init=[{"cpu": "900m"}])
    assert rejected(forecast(n, snapshot(2), [one])) == [("init-heavy", OUT_OF_CPU)]
    light = pod("init-light", {"cpu": "200m"}, init=[{"cpu": "100m"}])
    assert rejected(forecast(n, snapshot(2), [light])) == []


def test_sidecars_add_to_the_app_and_to_later_init_containers():
    """Restartable init containers (sidecars) run beside the app: app 200m + sidecar 300m =
    500m; a regular init container after the sidecar runs beside it: 600m + 300m = 900m."""
    event = pod_status(pod("p", {"cpu": "200m"}, sidecars=[{"cpu": "300m"}]), T, None).event
    assert event.admission_requests[Resource.CPU] == pytest.approx(0.5)
    obj = pod("p", {"cpu": "200m"}, sidecars=[{"cpu": "300m"}])
    obj["spec"]["initContainers"].append({"name": "late-init",
                                          "resources": {"requests": {"cpu": "600m"}}})
    assert pod_status(obj, T, None).event.admission_requests[Resource.CPU] == pytest.approx(0.9)
    n = node(cpu="2", allocatable_cpu="850m")
    assert rejected(forecast(n, snapshot(2), [obj])) == [("p", OUT_OF_CPU)]


def test_pod_overhead_is_added():
    n = node(cpu="2", allocatable_cpu="700m")
    assert rejected(forecast(n, snapshot(2), [pod("p", {"cpu": "500m"})])) == []
    heavy = pod("p", {"cpu": "500m"}, overhead={"cpu": "250m", "memory": "120Mi"})
    assert rejected(forecast(n, snapshot(2), [heavy])) == [("p", OUT_OF_CPU)]


def test_pod_level_requests_replace_the_containers_sum():
    obj = pod("p", {"cpu": "100m"}, pod_level={"cpu": "1500m"})
    assert pod_status(obj, T, None).event.admission_requests[Resource.CPU] == 1.5


def test_memory_against_the_kernel_minus_the_reservation():
    # 8 GiB Node, 7 GiB allocatable (1 GiB reserved); memory taken away: the kernel has 6.
    n = node(cpu="4", allocatable_cpu="4", memory="8Gi", allocatable_memory="7Gi")
    pods = [pod("a", {"memory": "3Gi"}, created="08:00:01"),
            pod("b", {"memory": "3Gi"}, created="08:00:02")]
    assert rejected(forecast(n, snapshot(4, 8 * GiB), pods)) == []
    result = forecast(n, snapshot(4, 6 * GiB), pods)
    assert rejected(result) == [("b", OUT_OF_MEMORY)]
    assert result.by_reason[OUT_OF_MEMORY] == 1


def test_hugepages_from_the_kernel():
    n = node(cpu="4", allocatable_cpu="4", hugepages_2mi="1Gi")
    pods = [pod("hp", {"hugepages-2Mi": "512Mi", "memory": "64Mi"})]
    assert rejected(forecast(n, snapshot(4, hugepages_2mi=GiB), pods)) == []
    result = forecast(n, snapshot(4, hugepages_2mi=256 * MiB), pods)
    assert rejected(result) == [("hp", OUT_OF_HUGEPAGES_2MI)]
    assert OUT_OF_HUGEPAGES_2MI in result.by_reason
    # A node without hugepages cannot reject for them: no such reason is shown.
    assert OUT_OF_HUGEPAGES_2MI not in forecast(node(), snapshot(2), []).by_reason


def test_max_pods_from_the_node_and_pods_checked_first():
    n = node(cpu="4", allocatable_cpu="1", pods="2")
    pods = [pod(f"p{i}", {"cpu": "400m"}, created=f"08:00:0{i}") for i in range(4)]
    # p2 would also be out of cpu (1200m > 1000m): the kubelet names the pod count first.
    assert rejected(forecast(n, snapshot(4), pods)) == [("p2", OUT_OF_PODS), ("p3", OUT_OF_PODS)]


def test_finished_and_deleted_pods_do_not_count():
    pods = [pod("done", {"cpu": "1"}, phase="Succeeded", created="08:00:01"),
            pod("failed", {"cpu": "1"}, phase="Failed", created="08:00:02"),
            pod("runs", {"cpu": "1"}, created="08:00:03")]
    f = forecaster(node(), snapshot(2), pods)
    assert rejected(f.result()) == [] and f.result().pods == 1
    gone = pod_status(pod("runs", {"cpu": "1"}), T + 1, None, deleted=True).event
    f.on_pod(gone)
    assert f.result().pods == 0


def test_a_relist_drops_pods_it_did_not_list():
    f = forecaster(node(), snapshot(1), [pod("a", {"cpu": "1"}), pod("b", {"cpu": "1"})])
    assert f.result().rejected_total == 2
    f.on_relist(frozenset({"uid-a"}), T + 1)
    assert rejected(f.result()) == [("a", OUT_OF_CPU)]


def test_in_place_resize_admits_against_what_was_allocated():
    """A resize pending (spec 900m, allocated 200m): the kubelet readmits with its allocation."""
    resized = pod("r", {"cpu": "900m"}, allocated={"cpu": "200m"})
    n = node(cpu="2", allocatable_cpu="500m")
    assert rejected(forecast(n, snapshot(2), [resized])) == []
    assert rejected(forecast(n, snapshot(2), [pod("r", {"cpu": "900m"})])) == [("r", OUT_OF_CPU)]


def test_static_cpu_manager_needs_whole_free_cpus():
    """Static policy, 4 CPUs with 500m reserved (one whole CPU kept from pinning), one CPU
    offlined: 2.5 CPUs allocatable, 2 to pin. A Guaranteed 2-CPU pod takes both; the next
    Guaranteed 1-CPU pod gets none (the CPU manager's refusal, judged before the resource
    fit); a Burstable pod is not pinned and fits in the 500m left."""
    n = node(cpu="4", allocatable_cpu="3500m")
    pods = [pod("g2", {"cpu": "2", "memory": "1Gi"}, qos="Guaranteed", created="08:00:01"),
            pod("g1", {"cpu": "1", "memory": "1Gi"}, qos="Guaranteed", created="08:00:02"),
            pod("b", {"cpu": "500m"}, created="08:00:03")]
    snap = snapshot(3, possible=4)
    assert rejected(forecast(n, snap, pods, static=True)) == [("g1", CPU_MANAGER)]
    # Without the static policy the same pod is refused by the resource fit instead.
    assert rejected(forecast(n, snap, pods, static=False)) == [("g1", OUT_OF_CPU)]
    assert CPU_MANAGER in forecast(n, snap, pods, static=True).by_reason
    assert pod_status(pods[2], T, None).event.exclusive_cpus == 0
    frac = pod("gf", {"cpu": "1500m"}, qos="Guaranteed")
    assert pod_status(frac, T, None).event.exclusive_cpus == 0  # not whole: shared pool


def test_nothing_is_forecast_without_the_node_or_the_kernel():
    f = ReadmissionForecast()
    assert f.result() is None
    f.on_snapshot(snapshot(2))
    assert f.result() is None


# ---------------------------------------------------------------- bad input, many pods


def test_unusable_requests_are_counted_and_skipped():
    """An event from an older journal with NaN or negative requests cannot be judged: left
    out and counted; absurd but valid quantities are judged (the kubelet rejects them too)."""
    f = forecaster(node(), snapshot(2), [pod("absurd", {"cpu": "1e15", "memory": "1e18"}),
                                         pod("fine", {"cpu": "500m"}, created="08:00:01")])
    assert rejected(f.result()) == [("absurd", OUT_OF_CPU)]
    for uid, value in (("nan", float("nan")), ("neg", -1.0), ("inf", float("inf"))):
        f.on_pod(PodStatus(T, uid, "default", uid, "Running", "", True,
                           admission_requests={Resource.CPU: value}))
    result = f.result()
    assert result.skipped == 3 and result.pods == 2
    f.on_pod(PodStatus(T + 1, "nan", "default", "nan", "Running", "", True,
                       admission_requests={Resource.CPU: 0.25}))
    assert f.result().skipped == 2 and f.result().pods == 3


def test_missing_requests_in_an_old_event_fall_back_to_what_it_carried():
    f = forecaster(node(), snapshot(1), [])
    f.on_pod(PodStatus(T, "old", "default", "old", "Running", "", True,
                       requests={Resource.CPU: 0.5}))
    assert rejected(f.result()) == [("old", OUT_OF_CPU)]


def test_ten_thousand_pods_recompute_only_when_an_input_changed():
    f = forecaster(node(cpu="2", allocatable_cpu="1", pods="20000"), snapshot(2), [])
    for i in range(10_000):
        f.on_pod(PodStatus(T + i, f"u{i}", "ns", f"p{i:05d}", "Running", "", True,
                           admission_requests={Resource.CPU: 0.001}, created=T + i))
    result = f.result()
    assert result.pods == 10_000 and result.rejected_total == 9_000  # 1000 fit in 1 CPU
    assert len(result.rejected) == LISTED_MAX and result.unlisted == 9_000 - LISTED_MAX
    assert result.rejected[0].name == "p01000"
    done = f.recomputed
    f.on_snapshot(snapshot(2))  # the same kernel again: nothing to do
    f.on_pod(PodStatus(T, "u5", "ns", "p00005", "Running", "", True,
                       admission_requests={Resource.CPU: 0.001}, created=T + 5))
    assert f.result() is result and f.recomputed == done
    f.on_snapshot(snapshot(1))
    assert f.result().rejected_total == 10_000 and f.recomputed == done + 1
    f.on_relist(frozenset(), T + 20_000)
    assert f.result().pods == 0


# ---------------------------------------------------------------- the gauges


def _scrape(f: ReadmissionForecast) -> Scrape:
    import threading

    registry = CollectorRegistry()
    registry.register(ForecastCollector(threading.Lock(), f))
    return Scrape(generate_latest(registry).decode())


def test_gauges_name_the_pods_capped_with_the_rest_counted():
    pods = [pod(f"p{i:02d}", {"cpu": "1"}, created=f"08:00:{i:02d}") for i in range(25)]
    s = _scrape(forecaster(node(), snapshot(1), pods))
    assert s.value("node_resize_readmission_forecast_rejected_pods", resource="cpu",
                   reason=OUT_OF_CPU) == 25
    assert s.value("node_resize_readmission_forecast_rejected_pods", resource="pods",
                   reason=OUT_OF_PODS) == 0
    assert s.value("node_resize_readmission_forecast_rejected", namespace="default",
                   pod="p00", reason=OUT_OF_CPU) == 1
    assert len(s.series("node_resize_readmission_forecast_rejected")) == LISTED_MAX
    assert s.value("node_resize_readmission_forecast_rejected_unlisted_pods") == 5
    assert s.value("node_resize_readmission_forecast_pods") == 25


def test_no_gauge_values_before_a_forecast_exists():
    s = _scrape(ReadmissionForecast())
    assert s.series("node_resize_readmission_forecast_rejected_pods") == {}
    assert s.value("node_resize_readmission_forecast_pods") is None


def test_a_relist_event_reaches_the_forecast_through_the_correlator():
    clock = FakeClock(T)
    c = Correlator(config(kubernetes=True), clock)
    c.handle(snapshot(1, when=T))
    c.handle(node_status(node(), T).event)
    c.handle(pod_status(pod("a", {"cpu": "1"}), T, None).event)
    c.handle(static_policy(T))
    assert c.forecast.result().rejected_total == 1
    c.handle(PodsRelisted(T + 1, frozenset()))
    assert c.forecast.result().rejected_total == 0


# ---------------------------------------------------------------- the episode's forecast shown


def _episode_with_forecast():
    import dataclasses

    from exporter.correlate.readmission_forecast import Forecast, ForecastRejection
    from testkit.postmortem_samples import cpu_offline_episode

    said = Forecast(T, pods=3, rejected_total=2, by_reason={OUT_OF_CPU: 2},
                    rejected=(ForecastRejection("default", "sleeper-1", "u1", OUT_OF_CPU),
                              ForecastRejection("default", "sleeper-2", "u2", OUT_OF_CPU)))
    return dataclasses.replace(cpu_offline_episode(), forecast=said)


def test_trace_text_and_picture_carry_the_forecast():
    import dataclasses

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from exporter.report import figure
    from exporter.report.text import timeline
    from exporter.report.timeline import build
    from exporter.sinks.traces.spans import build_trace

    ep = _episode_with_forecast()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build_trace(provider.get_tracer("test"), ep)
    [root] = [s for s in exporter.get_finished_spans() if s.name.startswith("episode ")]
    assert root.attributes["node_resize.forecast.rejected"] == 2
    assert list(root.attributes["node_resize.forecast.rejected_pods"]) == [
        "default/sleeper-1:OutOfcpu", "default/sleeper-2:OutOfcpu"]
    line = ("forecast before the resync: a kubelet restart would reject 2 of 3 pods: "
            "default/sleeper-1 OutOfcpu, default/sleeper-2 OutOfcpu")
    assert f"  {line}" in timeline(ep).splitlines()
    tl = build(ep)
    assert tl.forecast == line
    assert line in [t.get_text() for t in figure.draw(tl).texts]
    assert "forecast" not in timeline(dataclasses.replace(ep, forecast=None))


def test_the_check_line_names_the_pods_and_the_fix():
    from exporter.sinks.forecast_collector import forecast_check

    node_obj, pods = _recorded_before_restart()
    snap = snapshot(1, 24684084 * 1024)
    check = forecast_check(forecaster(node_obj, snap, pods), snap.cpus_offline)
    assert check.status == "fail"
    assert check.detail == ("a kubelet restart now would reject 2 of 2 pods: "
                            "default/sleeper-1 (OutOfcpu), default/sleeper-2 (OutOfcpu)")
    assert check.fix.startswith("drain these, or restore cpu 1, before restarting the kubelet")
    fine = forecast_check(forecaster(node_obj, snapshot(2, 24684084 * 1024), pods), frozenset())
    assert (fine.status, fine.detail) == ("ok", "a kubelet restart now would readmit all 2 pods")


def test_the_episode_keeps_the_forecast_from_before_the_resyncing_node_status():
    """The Node update that resyncs the episode may change what the forecast sees (here the
    restarted kubelet reserves nothing): the episode carries the verdict from before it."""
    clock = FakeClock(T)
    c = Correlator(config(kubernetes=True, readmission_settle=10), clock)
    c.handle(snapshot(2, when=T))
    c.handle(node_status(node(cpu="2", allocatable_cpu="1500m"), T).event)
    c.handle(SourceStatus("kube_pods", True, T, "listed pods (2)"))  # as the pod source does
    for name, second in (("a", "01"), ("b", "02")):
        c.handle(pod_status(pod(name, {"cpu": "300m"}, created=f"08:00:{second}"), T, None).event)
    off = T + 10
    clock.t = off
    c.handle(Transition("bpf", Resource.CPU, 1, Direction.OFFLINE, Result.SUCCESS, off,
                        off - 0.0078125))
    c.handle(snapshot(1, when=off))
    clock.t = T + 20
    c.tick()
    clock.t = T + 30
    updates = c.handle(node_status(node(cpu="1", allocatable_cpu="1"), T + 30).event)
    [resynced] = [u.episode for u in updates if u.kind is UpdateKind.RESYNCED]
    assert rejected(resynced.forecast) == [("b", OUT_OF_CPU)]
    assert c.forecast.result().rejected_total == 0  # the live forecast, with the new Node
    clock.t = T + 45
    [ended] = [u.episode for u in c.tick() if u.kind is UpdateKind.ENDED]
    assert rejected(ended.forecast) == [("b", OUT_OF_CPU)]


def test_the_episode_keeps_the_forecast_from_before_a_pod_rejected_ahead_of_the_node():
    """A restarted kubelet may fail a pod a millisecond before its Node update arrives: the
    forecast kept is the one from before the kubelet first acted (that pod is in it), so the
    postmortem does not print "1 pod rejected" beside "would reject none"."""
    from exporter.report.text import timeline

    clock = FakeClock(T)
    c = Correlator(config(kubernetes=True, readmission_settle=10), clock)
    c.handle(snapshot(2, when=T))
    c.handle(node_status(node(cpu="2", allocatable_cpu="1500m"), T).event)
    c.handle(SourceStatus("kube_pods", True, T, "listed pods (3)"))  # as the pod source does
    for name, second in (("a", "01"), ("b", "02"), ("c", "03")):
        c.handle(pod_status(pod(name, {"cpu": "300m"}, created=f"08:00:{second}"), T, None).event)
    off = T + 10
    clock.t = off
    c.handle(Transition("bpf", Resource.CPU, 1, Direction.OFFLINE, Result.SUCCESS, off,
                        off - 0.0078125))
    c.handle(snapshot(1, when=off))
    clock.t = T + 20
    c.tick()
    assert rejected(c.forecast.result()) == [("b", OUT_OF_CPU), ("c", OUT_OF_CPU)]
    clock.t = T + 30
    obj = pod("c", {"cpu": "300m"}, created="08:00:03", phase="Failed")
    obj["status"]["reason"] = OUT_OF_CPU
    failed = pod_status(obj, T + 30, None).event
    [first] = [u.episode for u in c.handle(failed) if u.kind is UpdateKind.POD]
    assert rejected(first.forecast) == [("b", OUT_OF_CPU), ("c", OUT_OF_CPU)]
    clock.t = T + 30.001
    updates = c.handle(node_status(node(cpu="1", allocatable_cpu="500m"), T + 30.001).event)
    [resynced] = [u.episode for u in updates if u.kind is UpdateKind.RESYNCED]
    assert rejected(resynced.forecast) == [("b", OUT_OF_CPU), ("c", OUT_OF_CPU)]
    clock.t = T + 45
    [ended] = [u.episode for u in c.tick() if u.kind is UpdateKind.ENDED]
    assert [p.name for p in ended.pods if p.outcome.value == "rejected"] == ["c"]
    assert rejected(ended.forecast) == [("b", OUT_OF_CPU), ("c", OUT_OF_CPU)]
    shown = timeline(ended)
    assert "1 pod rejected OutOfcpu" in shown
    assert "would reject 2 of 3 pods: default/b OutOfcpu, default/c OutOfcpu" in shown


def test_the_forecast_is_valid_only_while_the_pod_source_has_listed_and_is_up():
    from exporter.correlate.forecast_validity import ForecastValidity

    v = ForecastValidity()
    assert (v.current.valid, v.current.reason) == (False, "pods_not_listed")
    v.on_source_status(SourceStatus("kube_node", True, T, "listed nodes (1)"))  # not pods
    assert v.current.reason == "pods_not_listed"
    v.on_source_status(SourceStatus("kube_pods", True, T, "listed pods (3)"))
    assert (v.current.valid, v.current.reason, v.current.describe()) == (True, "ok", "")
    for reason, cause, why in (
            ("list of pods has more than 10000 objects", DownCause.TRUNCATED, "pods_truncated"),
            ("RBAC: forbidden (403): pods is forbidden", DownCause.FORBIDDEN, "pods_forbidden"),
            ("API server unreachable: connection refused", "", "pods_source_down")):
        v.on_source_status(SourceStatus("kube_pods", False, T, reason, cause))
        assert (v.current.valid, v.current.reason) == (False, why)
        assert reason in v.current.describe() and v.current.fix


@pytest.mark.parametrize("reason", [
    "API server did not answer the pods list after 4030ms", "more than 600 requests queued "
    "(objects pending)", "pods is forbidden: the proxy said 403", "RBAC: forbidden (403)"])
def test_the_invalid_reason_is_the_sources_typed_cause_never_its_words(reason):
    """Issue 36 L5: "after 4030ms" read as forbidden, "more than 600 requests" as truncated.
    Without a typed cause the source is down, whatever its (and the server's) words say."""
    from exporter.correlate.forecast_validity import ForecastValidity
    v = ForecastValidity()
    v.on_source_status(SourceStatus("kube_pods", False, T, reason))
    assert v.current.reason == "pods_source_down"


def test_a_hypothetical_kernel_leaves_the_forecast_as_it_was():
    # The planner asks the Correlator's own forecast: nothing of a plan may stay in it, neither
    # the kernel nor the time nor the kept result; nothing is saved and restored to get there.
    f = forecaster(node(cpu="2", allocatable_cpu="1"), snapshot(2),
                   [pod("a", {"cpu": "500m"}), pod("b", {"cpu": "500m"})])
    newer = snapshot(2, when=T + 5)
    f.on_snapshot(newer)
    before = f.result()
    done = f.recomputed
    hypo, offered = f.what_if(snapshot(1, when=T + 9))
    assert hypo is not None and hypo.rejected_total == 2 and offered is not None
    assert offered[0][0] == 0  # 1 CPU less the 1 reserved
    assert f.result() is before and f.recomputed == done  # nothing judged again, nothing kept
    same, _ = f.what_if(newer)
    assert same is before  # the same kernel: the kept result


def test_the_judge_is_pure_and_a_view_stays_as_it_was_taken():
    """judge(pods, kernel, node, policy) is a function of its arguments; a view taken under
    the lock is not changed by the pods the store takes afterwards (judged with no lock)."""
    from exporter.correlate.readmission_forecast import Kernel, judge
    f = forecaster(node(cpu="2", allocatable_cpu="1"), snapshot(2),
                   [pod("a", {"cpu": "500m"}), pod("b", {"cpu": "500m"})])
    view = f.view()
    assert judge(view.pods, Kernel.of(snapshot(1)), view.node, view.static) == \
        judge(view.pods, Kernel.of(snapshot(1)), view.node, view.static)
    f.on_pod(pod_status(pod("c", {"cpu": "500m"}, created="10:00:00"), T, None).event)
    f.on_pod(pod_status(pod("a", {"cpu": "500m"}), T, None, deleted=True).event)
    assert [p[2] for p in view.pods.order] == ["a", "b"]  # as taken
    assert [p[2] for p in f.view().pods.order] == ["b", "c"]
    assert view.result() is not None and view.result().pods == 2
