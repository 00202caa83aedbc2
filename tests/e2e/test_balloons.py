"""Balloon pods as they exist today, on the recorded objects of a real kubelet v1.36.2
(tests/fixtures/kubelet-v1.36/): the two views of what a balloon holds, the bounded reason of a
resize that did not happen, --balloon-priority-class, and the Node's heartbeat.

Conversion of single recorded objects and the CLI here; the recordings replayed event by event
are in tests/e2e/test_recordings_kubelet_v136.py.
"""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from exporter.config.options import Options
from exporter.correlate.kube_view import RESIZE_REASONS, resize_reason
from exporter.events import Resource
from exporter.kube.convert import LabelSelector, node_status, pod_status
from exporter.sources.apiserver.kube_pods import BALLOON_PRIORITY_CLASSES
from testkit.exporter_proc import REPO
from testkit.kube_replay import at, recording

SELECTOR = LabelSelector("node-resize-exporter.io/balloon=true")


def last_pod(name: str) -> dict:
    return [e for e in recording(name) if e["type"] != "BOOKMARK"][-1]["object"]


def views(obj: dict) -> tuple[float, float]:
    event = pod_status(obj, 0.0, SELECTOR).event
    assert event is not None and event.scheduler_requests is not None
    return event.scheduler_requests[Resource.CPU], event.kubelet_requests[Resource.CPU]


def test_infeasible_resize_counts_what_the_pod_holds_in_both_views():
    obj = last_pod("pods-watch-balloon-resize-infeasible-static.jsonl")
    event = pod_status(obj, 0.0, SELECTOR).event
    assert event.requests[Resource.CPU] == 0.2  # the spec asks for 200m...
    assert views(obj) == (0.5, 0.5)  # ...the pod holds 500m, for the scheduler and the kubelet
    assert event.resize.pending_reason == "Infeasible"
    assert resize_reason(event.resize.message) == "cpu_manager_static"


def test_an_infeasible_grow_is_not_counted_by_the_scheduler():
    """The issue's case: a balloon holding 100m asked to grow to 300m, Infeasible. Before the
    kubelet said so, the scheduler counts the grow; after, what the pod holds."""
    obj = copy.deepcopy(last_pod("pods-watch-balloon-resize-infeasible-static.jsonl"))
    container, status = obj["spec"]["containers"][0], obj["status"]["containerStatuses"][0]
    container["resources"]["requests"]["cpu"] = "300m"
    status["allocatedResources"]["cpu"] = "100m"
    status["resources"]["requests"]["cpu"] = "100m"
    assert views(obj) == (0.1, 0.1)
    pending = [c for c in obj["status"]["conditions"] if c["type"] == "PodResizePending"][0]
    obj["status"]["conditions"].remove(pending)
    assert views(obj) == (0.3, 0.1)  # not (yet) infeasible: max(spec, allocated, actual)


def test_a_pod_not_started_counts_its_spec():
    first = [e for e in recording("pods-watch-balloon-resize-applied.jsonl")
             if e["type"] == "ADDED"][0]["object"]
    assert "containerStatuses" not in first["status"]
    assert views(first) == (0.5, 0.5)


@pytest.mark.parametrize("message, reason", [
    ('Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"',
     "cpu_manager_static"),
    ("Node didn't have enough capacity: cpu, requested: 2500, capacity: 1930", "capacity"),
    ("Node didn't have enough resource: cpu, requested: 1500, used: 1450, capacity: 1930",
     "capacity"),
    ('Resize is infeasible for Guaranteed Pods alongside Memory Manager policy "Static"', "other"),
    ("", "other"),
    ("\x00" * 10_000, "other"),
])
def test_resize_reason_is_bounded(message, reason):
    assert resize_reason(message) == reason
    assert reason in RESIZE_REASONS


def test_a_condition_message_is_kept_bounded():
    obj = copy.deepcopy(last_pod("pods-watch-balloon-resize-infeasible-static.jsonl"))
    pending = [c for c in obj["status"]["conditions"] if c["type"] == "PodResizePending"][0]
    pending["message"] = "x" * 1_000_000
    event = pod_status(obj, 0.0, SELECTOR).event
    assert len(event.resize.message) == 256


def test_priority_class_matches_without_the_label():
    obj = copy.deepcopy(last_pod("pods-watch-balloon-resize-infeasible-static.jsonl"))
    del obj["metadata"]["labels"]
    obj["spec"]["priorityClassName"] = "overprovisioning"
    assert not pod_status(obj, 0.0, SELECTOR).event.balloon
    assert pod_status(obj, 0.0, SELECTOR, priority_classes=("overprovisioning",)).event.balloon
    assert not pod_status(obj, 0.0, SELECTOR, priority_classes=("other",)).event.balloon
    obj["spec"]["priorityClassName"] = "system-balloon"  # KEP-5620's, once it is built in
    assert pod_status(obj, 0.0, None).event.balloon


def test_node_heartbeat_is_the_ready_condition_s():
    for event, stamp in zip([e for e in recording("node-watch-cpu1-unplug-restart.jsonl")
                             if e["type"] != "BOOKMARK"], ["08:21:44", "08:23:19", "08:23:57"]):
        converted = node_status(event["object"], 0.0)
        assert converted.event.heartbeat == at(stamp) and not converted.problems


@pytest.mark.parametrize("value", ["yesterday", 12, "", "2026-11-23T08:21:44", "9" * 500,
                                   "2026-13-45T99:99:99Z"])
def test_a_bad_heartbeat_is_a_problem_not_a_crash(value):
    node = copy.deepcopy(recording("node-watch-cpu1-unplug-restart.jsonl")[0]["object"])
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"][0]
    ready["lastHeartbeatTime"] = value
    converted = node_status(node, 0.0)
    assert converted.event is not None and converted.event.heartbeat is None
    assert len(converted.problems) == 1 and len(converted.problems[0]) < 200
    assert converted.event.capacity[Resource.CPU] == 2  # the rest of the Node still counts


def test_balloon_priority_class_option_repeats():
    assert BALLOON_PRIORITY_CLASSES.multiple
    assert BALLOON_PRIORITY_CLASSES.of(Options()) == ()
    given = Options.from_cli({"balloon_priority_classes": ("a", "b")})
    assert BALLOON_PRIORITY_CLASSES.of(given) == ("a", "b")


@pytest.mark.parametrize("bad", ["Overprovisioning", "-x", "a b", "x" * 254])
def test_a_bad_priority_class_name_exits_2_naming_the_flag(bad):
    run = subprocess.run([sys.executable, "-m", "exporter", "run", "--no-journal",
                          "--balloon-priority-class", "ok-class",
                          "--balloon-priority-class", bad],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--balloon-priority-class" in run.stderr and "PriorityClass name" in run.stderr


def test_a_running_exporter_finds_balloons_by_priority_class(tmp_path):
    """The flag reaches the pod watch of a real `run`: a pod of the class is a balloon, one
    with the label too, and an ordinary pod is not."""
    from testkit.exporter_proc import RunningExporter
    from testkit.fakes.apiserver import FakeApiServer

    with FakeApiServer() as api:
        api.set_node("n1", cpu="2", memory="8Gi", allocatable_cpu="1")
        api.put_pod("overprov", node="n1", priority_class="overprovisioning",
                    requests={"cpu": "250m", "memory": "64Mi"})
        api.put_pod("labelled", node="n1", labels={"node-resize-exporter.io/balloon": "true"},
                    requests={"cpu": "500m", "memory": "64Mi"})
        api.put_pod("web", node="n1", requests={"cpu": "100m", "memory": "64Mi"})
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig, "--node-name",
                             "n1", "--podresources-socket", "", "--kubelet-root-dir", "",
                             "--cgroup-root", "", "--balloon-priority-class", "other",
                             "--balloon-priority-class", "overprovisioning") as exp:
            s = exp.wait_for(lambda s: s.value("node_resize_balloon_pods") == 2
                             and s.series("node_resize_kubelet_capacity"))
            for view in ("scheduler", "kubelet"):
                assert s.value("node_resize_balloon_requests", resource="cpu", unit="core",
                               view=view) == 0.75
            assert s.value("node_resize_capacity_effective", resource="cpu", unit="core") == 0.25
