"""Pods at their own times: the kubelet's status write time from the Pod object (managedFields,
a NotReady pod's Ready condition), and the correlator stamping each pod's verdict with it
instead of the time one relist or watch burst delivered them all."""
from __future__ import annotations

import copy
from datetime import datetime

from exporter.correlate.model import PodVerdict
from exporter.events import Direction, Resource
from exporter.kube.convert import pod_status
from testkit.correlator_stream import T0, Stream
from testkit.kube_replay import recording

NOW = 1_795_000_000.0


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp()


def test_a_recorded_rejection_carries_the_kubelet_s_write_time():
    """kubelet v1.36: both pods Failed OutOfcpu written at 08:25:00, though their conditions
    (rewritten by the restarted kubelet) say 08:24:58."""
    objects = [e["object"] for e in recording("pods-watch-readmission-outofcpu.jsonl")
               if e["type"] != "BOOKMARK"]
    failed = [pod_status(o, NOW, None).event for o in objects
              if o["status"].get("phase") == "Failed"]
    assert [(p.name, p.reason) for p in failed] == [("sleeper-2", "OutOfcpu"),
                                                    ("sleeper-1", "OutOfcpu")]
    assert {p.status_time for p in failed} == {epoch("2026-11-23T08:25:00+00:00")}
    assert all(p.time == NOW for p in failed)  # the delivery time is kept apart
    first = pod_status(objects[0], NOW, None).event  # only kubectl wrote it: not said
    assert first.status_time is None


def _running(ready_status: str, managed_time: object) -> dict:
    obj = copy.deepcopy(next(e["object"] for e in recording(
        "pods-watch-readmission-outofcpu.jsonl") if e["type"] == "MODIFIED"
        and e["object"]["status"].get("phase") == "Running"))
    for c in obj["status"]["conditions"]:
        if c["type"] == "Ready":
            c["status"], c["lastTransitionTime"] = ready_status, "2026-11-23T08:24:50Z"
    for entry in obj["metadata"]["managedFields"]:
        if entry["manager"] == "kubelet":
            entry["time"] = managed_time
    return obj


def test_a_not_ready_pod_is_timed_by_its_ready_condition():
    converted = pod_status(_running("False", "2026-11-23T08:24:58Z"), NOW, None)
    assert converted.event.status_time == epoch("2026-11-23T08:24:50+00:00")
    converted = pod_status(_running("True", "2026-11-23T08:24:58Z"), NOW, None)
    assert converted.event.status_time == epoch("2026-11-23T08:24:58+00:00")


def test_a_malformed_write_time_is_reported_and_not_used():
    for bad in ("yesterday", 12, None, "2026-11-23T08:24:58"):  # the last: no time zone
        converted = pod_status(_running("True", bad), NOW, None)
        assert converted.event is not None and converted.event.status_time is None
        if bad is not None:
            assert any("managedFields kubelet time" in p for p in converted.problems), bad


def test_pods_delivered_together_keep_their_own_times():
    """cpu1 offline at 10.0; the restarted kubelet resyncs at 15.0 and rejects a at 16 and
    b at 17 (its status writes), but one relist delivers both at 20.0."""
    s = Stream(kubernetes=True, readmission_settle=10.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    for uid in "abcde":
        s.pod(0.5, uid, status_time=T0 + 0.4)
    s.transition(10.0, Resource.CPU, 1, Direction.OFFLINE)
    s.snapshot(10.0625, cpus=1)
    s.tick(12.0)
    s.node(15.0, cpu=1)
    s.pod(20.0, "a", phase="Failed", reason="OutOfcpu", ready=False, status_time=T0 + 16.0)
    s.pod(20.0, "b", phase="Failed", reason="OutOfcpu", ready=False, status_time=T0 + 17.0)
    # A status time the rejection cannot have (an hour before the unplug: another clock):
    s.pod(20.0, "c", phase="Failed", reason="OutOfcpu", ready=False,
          status_time=T0 - 3600.0)
    (ep,) = s.open_episodes()
    assert [(p.uid, p.outcome, p.time - T0) for p in ep.pods] == [
        ("a", PodVerdict.REJECTED, 16.0), ("b", PodVerdict.REJECTED, 17.0),
        ("c", PodVerdict.REJECTED, 20.0)]
    # Kept: d re-admitted by the restarted kubelet (its status rewritten at 15.5) is judged
    # then; e, untouched since before the unplug, when readmission settled.
    s.pod(20.5, "d", status_time=T0 + 15.5)
    (ended,) = [u.episode for u in s.tick(40.0) if u.episode.ended is not None]
    kept = {p.uid: p.time - T0 for p in ended.pods if p.outcome is PodVerdict.KEPT}
    assert kept == {"d": 15.5, "e": ended.readmission_settled - T0}
