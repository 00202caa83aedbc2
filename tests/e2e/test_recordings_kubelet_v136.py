"""The real kubelet v1.36.2 sequences of tests/fixtures/kubelet-v1.36/ (its README says
what happened in each), replayed event by event through the list/watch test server into the
exporter's real watch sources, correlator and metrics sink (testkit/kube_replay.py), with the
exact metrics the exporter must show after each event.

The recordings hold no kernel: the kernel side the sequence implies (cpu1 offlined while the
kubelet ran, onlined later; 2 CPUs, the Node's memory) is injected in-process as the
Transition and KernelSnapshot the BPF and sysfs sources would emit, on the recording's own
clock. test_recording_replay_kernel.py runs the Node recording against a running exporter with
cpu1 offlined for real.
"""
from __future__ import annotations

import copy

import pytest

from exporter.events import Direction
from testkit.fakes.apiserver import FakeApiServer
from testkit.kube_replay import NODE_MEMORY, Replay, at, recording


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def beat_at(s, via="node_status"):
    return s.value("node_resize_kubelet_heartbeat_timestamp_seconds", via=via)


def beat_age(s, via="node_status"):
    return s.value("node_resize_kubelet_heartbeat_age_seconds", via=via)


def cpu(s, name, **labels):
    return s.value(name, resource="cpu", unit="core", **labels)


# ---------------------------------------------------------------- node-watch-cpu1-unplug-restart


def test_node_watch_unplug_restart_resync(api):
    """Drift -1 at the unplug, no Node event while the kubelet was dead, the restart's resync,
    and the same after cpu1 came back; the heartbeat ages while the kubelet is dead."""
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    assert [e["type"] for e in node] == ["ADDED", "BOOKMARK", "BOOKMARK", "MODIFIED",
                                         "BOOKMARK", "MODIFIED"]
    with Replay(api) as r:
        r.kernel(at("08:21:44"), cpus=2)
        r.publish(node[0], at("08:21:44"))  # capacity 2, allocatable 1 (reservedSystemCPUs 0)
        s = r.scrape()
        assert (
            cpu(s, "node_resize_kubelet_capacity") == 2
            and cpu(s, "node_resize_kubelet_allocatable") == 1
        )
        assert cpu(s, "node_resize_capacity_drift") == 0
        assert s.value("node_resize_capacity_drift", resource="memory", unit="byte") == 0
        assert (
            s.value("node_resize_kubelet_capacity", resource="memory", unit="byte") == NODE_MEMORY
        )
        assert beat_at(s) == at("08:21:44")
        assert beat_age(s) == 0
        r.publish(node[1], at("08:21:50"))  # BOOKMARK (initial-events-end): nothing moves
        assert beat_age(r.scrape()) == 6

        # cpu1 offlined while the kubelet runs: no Node event, the kernel says 1.
        r.kernel(at("08:22:00"), cpus=1, direction=Direction.OFFLINE)
        s = r.scrape()
        assert cpu(s, "node_resize_capacity_drift") == -1
        assert s.value("node_hot_unplug_request_total", resource="cpu") == 1
        assert s.value("node_resize_exporter_episodes_open") == 1
        r.tick(at("08:22:02.5"))  # the coalescing window passes: kernel done at 08:22:00

        # The kubelet is restarted and dies (kubelet-restart-fail.log): the Node says nothing,
        # Ready stays True. The heartbeat's age is what tells a dead kubelet from a live one.
        r.publish(node[2], at("08:22:30"))  # BOOKMARK
        s = r.scrape()
        assert cpu(s, "node_resize_capacity_drift") == -1
        assert s.value("node_resize_capacity_drift_seconds", resource="cpu") == 30
        assert beat_age(s) == 46
        assert (
            s.total(
                "node_resize_resync_duration_seconds_count", resource="cpu", direction="decrease"
            )
            == 0
        )

        # The state file removed, the kubelet starts: capacity 1, allocatable 0.
        r.publish(node[3], at("08:23:19"))
        s = r.scrape()
        assert (
            cpu(s, "node_resize_kubelet_capacity") == 1
            and cpu(s, "node_resize_kubelet_allocatable") == 0
        )
        assert cpu(s, "node_resize_capacity_drift") == 0
        assert s.value("node_resize_capacity_drift_seconds", resource="cpu") == 0
        assert (
            s.total(
                "node_resize_resync_duration_seconds_count", resource="cpu", direction="decrease"
            )
            == 1
        )
        assert (
            s.total("node_resize_resync_duration_seconds_sum", resource="cpu", direction="decrease")
            == 79
        )
        assert beat_age(s) == 0
        r.tick(at("08:23:29"))  # readmission settles: no pod on the node, none rejected
        s = r.scrape()
        assert s.value("node_resize_exporter_episodes_open") == 0
        assert s.value("node_resize_readmission_duration_seconds_count", resource="cpu") == 1
        assert (
            s.value("node_hot_unplug_errors_total", resource="cpu", reason="readmission_rejected")
            == 0
        )
        r.publish(node[4], at("08:23:30"))  # BOOKMARK

        # cpu1 onlined: drift +1 until the next restart's Node update says 2 again.
        r.kernel(at("08:23:40"), cpus=2, direction=Direction.ONLINE)
        s = r.scrape()
        assert cpu(s, "node_resize_capacity_drift") == 1
        assert s.value("node_resize_resync_request_total", resource="cpu") == 1
        r.tick(at("08:23:42.5"))
        r.publish(node[5], at("08:23:57"))
        s = r.scrape()
        assert (
            cpu(s, "node_resize_kubelet_capacity") == 2
            and cpu(s, "node_resize_kubelet_allocatable") == 1
        )
        assert cpu(s, "node_resize_capacity_drift") == 0
        assert (
            s.total("node_resize_resync_duration_seconds_sum", resource="cpu", direction="increase")
            == 17
        )
        assert s.value("node_resize_exporter_episodes_open") == 0
        assert (
            s.value("node_resize_resync_errors_total", resource="cpu", reason="resync_timeout") == 0
        )
        assert beat_at(s) == at("08:23:57")


def _beat(event: dict, stamp: str, rv: int) -> dict:
    """The recorded Node as its kubelet re-posts it unchanged: every condition's heartbeat at
    `stamp` (what a live kubelet does at least every nodeStatusReportFrequency, 5 min)."""
    obj = copy.deepcopy(event["object"])
    obj["metadata"]["resourceVersion"] = str(rv)
    for cond in obj["status"]["conditions"]:
        cond["lastHeartbeatTime"] = f"2026-11-23T{stamp}Z"
    return {"type": "MODIFIED", "object": obj}


def test_a_live_kubelet_s_heartbeat_moves_without_a_node_status(api):
    """A heartbeat-only Node update is a NodeHeartbeat, not a NodeStatus: the episode side sees
    no capacity change, the heartbeat gauges move."""
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    with Replay(api) as r:
        r.kernel(at("08:21:44"), cpus=2)
        r.publish(node[0], at("08:21:44"))
        r.publish(_beat(node[0], "08:26:44", 1018), at("08:26:45"))
        s = r.scrape()
        assert beat_at(s) == at("08:26:44")
        assert beat_age(s) == 1
        r.publish(_beat(node[0], "08:26:44", 1019), at("08:27:00"))  # the same heartbeat again
        assert beat_age(r.scrape()) == 16
        kinds = [type(e).__name__ for e in r.emitted if type(e).__name__.startswith("Node")]
        assert kinds == ["NodeStatus", "NodeHeartbeat"]


# ---------------------------------------------------------------- pods-watch-readmission-outofcpu


def test_readmission_rejects_both_pods_outofcpu(api):
    """Two Running Burstable pods of 500m; cpu1 offlined; the kubelet restarted with its state
    file removed rejects both at readmission: Failed, OutOfcpu."""
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    pods = recording("pods-watch-readmission-outofcpu.jsonl")
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in pods]
    with Replay(api, settle=10) as r:
        r.kernel(at("08:30:00"), cpus=2)
        r.publish(node[0], at("08:30:00"))
        for event in pods[: rvs.index(1121) + 1]:  # both pods scheduled, started, Ready
            r.publish(event)
        s = r.scrape()
        assert s.value("node_resize_balloon_pods") == 0  # no balloon label: ordinary pods

        r.kernel(at("08:31:00"), cpus=1, direction=Direction.OFFLINE)
        r.tick(at("08:31:03"))
        s = r.scrape()
        assert cpu(s, "node_resize_capacity_drift") == -1
        assert s.value("node_hot_unplug_request_total", resource="cpu") == 1

        # The kubelet restarts: its first pod statuses (no Ready condition), containers
        # terminated. The Node's MODIFIED of this restart is not in the pods recording; the
        # Node recording's (capacity 1, allocatable 0: the rejections' "capacity: 0") stands in.
        r.set_clock(at("08:31:30"))
        for event in pods[rvs.index(1121) + 1 : rvs.index(1148) + 1]:
            r.publish(event)
        r.publish(node[3], at("08:31:32"))
        s = r.scrape()
        assert cpu(s, "node_resize_capacity_drift") == 0
        assert (
            s.total(
                "node_resize_resync_duration_seconds_count", resource="cpu", direction="decrease"
            )
            == 1
        )
        assert s.value("node_resize_exporter_episodes_open") == 1  # readmission still open

        r.set_clock(at("08:31:33"))
        for event in pods[rvs.index(1148) + 1 :]:  # Failed, OutOfcpu, both
            published = r.publish(event)
            assert published["status"]["reason"] == "OutOfcpu"
        # Settles 10 s after the resync (08:31:32): the pods were already rejected (NotReady at
        # the restart), OutOfcpu only names the reason, it is no new change.
        r.tick(at("08:31:41"))
        assert r.scrape().value("node_resize_exporter_episodes_open") == 1  # not settled yet
        r.tick(at("08:31:42"))
        s = r.scrape()
        assert s.value("node_resize_exporter_episodes_open") == 0
        assert (
            s.value("node_resize_readmission_pods_total", outcome="rejected", reason="OutOfcpu")
            == 2
        )
        assert (
            s.value("node_resize_readmission_pods_total", outcome="rejected", reason="NotReady")
            is None
        )  # the telling reason replaced NotReady
        assert s.value("node_resize_readmission_pods_total", outcome="kept", reason="Running") == 0
        assert (
            s.value("node_hot_unplug_errors_total", resource="cpu", reason="readmission_rejected")
            == 1
        )
        assert s.value("node_resize_readmission_duration_seconds_sum", resource="cpu") == 32


# ---------------------------------------------------------------- balloons


def balloon(s, view, resource="cpu"):
    unit = "core" if resource == "cpu" else "byte"
    return s.value("node_resize_balloon_requests", resource=resource, unit=unit, view=view)


def test_balloon_resize_applied_both_views(api):
    """A Burstable balloon (500m) resized to 200m, then 900m: the scheduler counts
    max(spec, allocated, actual) the moment the spec changes, the kubelet what it allocated;
    the effective capacity follows the scheduler; each resize counted applied once."""
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    pods = recording("pods-watch-balloon-resize-applied.jsonl")
    # RV -> (scheduler, kubelet) cpu after that event, as the recording's objects say:
    expected = {
        907: (0.5, 0.5),  # Pending, no container status: the spec in both
        908: (0.5, 0.5),
        910: (0.5, 0.5),
        913: (0.5, 0.5),  # Running, allocated 500m
        914: (0.5, 0.5),  # spec 200m; nothing allocated yet: the scheduler keeps the 500m
        916: (0.5, 0.2),  # allocated 200m, still running with 500m
        918: (0.2, 0.2),  # actuated
        922: (0.9, 0.2),  # spec 900m: the scheduler counts the grow at once
        924: (0.9, 0.9),  # allocated 900m (running 200m)
        926: (0.9, 0.9),
    }
    applied_after = {918: 1, 926: 2}
    with Replay(api) as r:
        r.set_clock(at("08:20:00"))
        r.publish(node[0])  # allocatable cpu 1
        applied = 0
        for event in pods:
            r.set_clock(r.clock.t + 1)
            r.publish(event)
            rv = int(event["object"]["metadata"]["resourceVersion"])  # as recorded
            s = r.scrape()
            if event["type"] == "BOOKMARK":
                assert s.value("node_resize_balloon_pods") == 0
                continue
            sched, kubelet = expected[rv]
            assert (balloon(s, "scheduler"), balloon(s, "kubelet")) == pytest.approx(
                (sched, kubelet)
            ), rv
            assert cpu(s, "node_resize_capacity_effective") == pytest.approx(1 - sched), rv
            assert balloon(s, "scheduler", "memory") == 64 * 2**20
            assert balloon(s, "kubelet", "memory") == 64 * 2**20
            assert s.value("node_resize_balloon_pods") == 1
            applied = applied_after.get(rv, applied)
            assert (
                s.value("node_resize_balloon_resize_total", 0, result="applied", reason="none")
                == applied
            ), rv
        s = r.scrape()
        assert s.value("node_resize_balloon_resize_duration_seconds_count") == 2
        # 200m: spec at 914, actuated at 918 (two events later, 1 s apart); 900m: 922 -> 926.
        assert s.value("node_resize_balloon_resize_duration_seconds_sum") == 4
        assert s.total("node_resize_balloon_resize_total", result="infeasible") == 0


def test_balloon_resize_infeasible_under_static_policy(api):
    """A Guaranteed balloon (500m) resized to 200m under the static CPU manager: Infeasible,
    reason cpu_manager_static. The pod keeps 500m, and so do both views (not the 200m the
    spec asks for); counted once however often the pod is re-delivered."""
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    pods = recording("pods-watch-balloon-resize-infeasible-static.jsonl")
    with Replay(api) as r:
        r.set_clock(at("08:19:00"))
        r.publish(node[0])
        for event in pods:
            r.publish(event)
        s = r.scrape()
        assert (
            s.value(
                "node_resize_balloon_resize_total", result="infeasible", reason="cpu_manager_static"
            )
            == 1
        )
        for why in ("capacity", "other"):  # every reason's series from the start, at 0
            assert s.value("node_resize_balloon_resize_total", result="infeasible", reason=why) == 0
        assert balloon(s, "scheduler") == balloon(s, "kubelet") == 0.5
        assert cpu(s, "node_resize_capacity_effective") == 0.5
        # A relist (or any re-delivery) of the same pod does not count it again.
        r.publish(pods[-1])
        s = r.scrape()
        assert (
            s.value(
                "node_resize_balloon_resize_total", result="infeasible", reason="cpu_manager_static"
            )
            == 1
        )


def _as_priority_class(event: dict, name: str) -> dict:
    """The recorded pod without its balloon label, of PriorityClass `name` instead."""
    if event["type"] == "BOOKMARK":
        return event
    obj = {**event["object"]}
    obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    obj["spec"] = {**obj["spec"], "priorityClassName": name, "priority": -10}
    return {"type": event["type"], "object": obj}


@pytest.mark.parametrize(
    "classes, balloons", [(("overprovisioning",), 1), ((), 0), (("other", "overprovisioning"), 1)]
)
def test_balloon_found_by_priority_class(api, classes, balloons):
    """--balloon-priority-class: a pod of that class is a balloon whatever its labels (the
    cluster-autoscaler's overprovisioning pattern); not one without the flag."""
    pods = [
        _as_priority_class(e, "overprovisioning")
        for e in recording("pods-watch-balloon-resize-infeasible-static.jsonl")
    ]
    with Replay(api, priority_classes=classes) as r:
        for event in pods:
            r.publish(event)
        s = r.scrape()
        assert s.value("node_resize_balloon_pods") == balloons
        assert (
            s.value(
                "node_resize_balloon_resize_total", result="infeasible", reason="cpu_manager_static"
            )
            == balloons
        )
        assert (balloon(s, "scheduler") or 0) == 0.5 * balloons
