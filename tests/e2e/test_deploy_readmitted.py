"""The exporter survives what it watches: the default install's pod (the DaemonSet's template as
`kubectl apply -k deploy/` renders it, bound to a node as the API server returns it) is never
among the pods the readmission forecast says the next kubelet restart rejects after a CPU
hot-unplug, however far the node shrinks and wherever the pod falls in the readmission order.

On a real kubelet v1.36 with one of two CPUs offlined the forecast named the exporter's own pod
(20m CPU, 64Mi, priority 1e9, below the kubelet's critical threshold: no room is made for it),
and the real kubelet's restart failed a pod of that shape OutOfcpu. The forecast follows the
kubelet's admission (tests/unit/test_readmission_forecast.py holds it to that recording); here
it is asked about the pod deploy/ ships. What remains is memory, and the last test says so."""
from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

from exporter.correlate.readmission_forecast import OUT_OF_MEMORY
from testkit.deploy import render
from testkit.forecast import GiB, MiB, forecast, node, pod, rejected, snapshot
from testkit.kube_replay import recording

CRITICAL = 2_000_000_000  # pkg/apis/scheduling SystemCriticalPriority: the kubelet makes room


@functools.cache
def _installed() -> tuple[dict[str, Any], int]:
    """The rendered DaemonSet and its PriorityClass's value (rendered once: read, never
    changed)."""
    docs = render()
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    classes = {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "PriorityClass"}
    return ds, classes[ds["spec"]["template"]["spec"]["priorityClassName"]]


def exporter_pod(created: str) -> dict[str, Any]:
    """The DaemonSet's pod on node "vm", as the API server serves it once it runs."""
    ds, priority = _installed()
    template = copy.deepcopy(ds["spec"]["template"])
    spec = dict(template["spec"], nodeName="vm", priority=priority)
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {**template["metadata"], "name": "node-resize-exporter-7xk2q",
                         "namespace": ds["metadata"]["namespace"], "uid": "uid-exporter",
                         "creationTimestamp": f"2026-11-23T{created}Z", "resourceVersion": "1"},
            "spec": spec, "status": {"phase": "Running", "qosClass": "Burstable"}}


def _named(result) -> list[str]:
    return [reason for name, reason in rejected(result) if name.startswith("node-resize-exporter")]


def test_the_default_install_is_not_critical_to_the_kubelet():
    """Why it must fit by itself: its priority is below the kubelet's critical threshold, so a
    restart makes no room for it (if this changes, the forecast must model that first)."""
    _, priority = _installed()
    assert priority < CRITICAL


def test_the_recorded_unplug_readmits_the_exporter():
    """The recorded node (2 CPUs, 1 reserved) and its two 500m pods; cpu1 offline: the real
    kubelet's restart rejected both pods OutOfcpu. With the exporter's pod older or newer than
    them, the forecast still rejects both and never the exporter."""
    node_obj = recording("node-watch-cpu1-unplug-restart.jsonl")[0]["object"]
    pods = [e["object"] for e in recording("pods-watch-readmission-outofcpu.jsonl")
            if e["type"] != "BOOKMARK" and int(e["object"]["metadata"]["resourceVersion"]) <= 1121]
    pods = list({p["metadata"]["name"]: p for p in pods}.values())
    for created in ("00:00:00", "23:59:59"):
        result = forecast(node_obj, snapshot(1, 24684084 * 1024), [*pods, exporter_pod(created)])
        assert sorted(n for n, _ in rejected(result)) == ["sleeper-1", "sleeper-2"], created
        assert result.pods == 3


@pytest.mark.parametrize("possible", [2, 16])
def test_the_exporter_is_never_named_on_a_shrinking_node(possible):
    """From every CPU online down to one, on a node whose workloads request all of its CPU
    (one reserved), the exporter first, in the middle and last in readmission order: workloads
    are rejected OutOfcpu as the node shrinks, the exporter never."""
    node_obj = node(cpu=str(possible), allocatable_cpu=str(possible - 1), memory="16Gi")
    workloads = [pod(f"work-{i}", {"cpu": "1", "memory": "100Mi"},
                     created=f"09:{i // 60:02}:{i % 60:02}") for i in range(possible - 1)]
    rejections = 0
    for created in ("08:00:00", "09:00:00", "10:00:00"):
        for online in range(possible, 0, -1):
            result = forecast(node_obj, snapshot(online, 16 * GiB, possible=possible),
                              [*workloads, exporter_pod(created)])
            assert _named(result) == [], (created, online)
            rejections += result.rejected_total
    assert rejections > 0  # the node did shrink past its workloads


def test_what_remains_is_memory():
    """Memory still counts: after a memory hot-unplug, the exporter is rejected OutOfmemory when
    the pods readmitted before it request more than allocatable memory minus its own request,
    as the DaemonSet's comment says; never when it is readmitted first."""
    ds, _ = _installed()
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"memory": "64Mi"}
    node_obj = node(cpu="2", allocatable_cpu="2", memory="4Gi")
    hog = pod("hog", {"memory": "3Gi"}, created="08:00:00")
    after = forecast(node_obj, snapshot(2, 3 * GiB + 32 * MiB), [hog, exporter_pod("09:00:00")])
    assert _named(after) == [OUT_OF_MEMORY]
    first = forecast(node_obj, snapshot(2, 3 * GiB + 32 * MiB), [hog, exporter_pod("07:00:00")])
    assert _named(first) == [] and rejected(first) == [("hog", OUT_OF_MEMORY)]
