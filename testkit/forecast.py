"""Builders for the readmission forecast's tests: Pod and Node objects shaped as the API server
serialises them (the fields convert.py reads), a kernel snapshot, and a forecast run through
the real converters, as the watch sources would deliver them."""
from __future__ import annotations

from typing import Any

from exporter.correlate.readmission_forecast import Forecast, ReadmissionForecast
from exporter.events import CpuManagerCheckpoint, KernelSnapshot, NodeStatus, Resource
from exporter.kube.convert import node_status, pod_status

GiB = 2**30
MiB = 2**20
T = 1_795_430_000.0  # 2026-11-23, the recordings' day


def container(name: str, requests: dict[str, str] | None = None,
              restart_policy: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10",
                           "resources": {"requests": dict(requests or {})}}
    if restart_policy:
        out["restartPolicy"] = restart_policy
    return out


def pod(name: str, requests: dict[str, str] | None = None, *, created: str = "08:00:00",
        namespace: str = "default", init: list[dict[str, str]] | tuple = (),
        sidecars: list[dict[str, str]] | tuple = (), overhead: dict[str, str] | None = None,
        qos: str = "Burstable", phase: str = "Running", allocated: dict[str, str] | None = None,
        pod_level: dict[str, str] | None = None, uid: str | None = None) -> dict[str, Any]:
    """A pod bound to the node, one app container with `requests`; `init` regular init
    containers and `sidecars` restartable ones (restartPolicy Always, KEP-753), in that order;
    `allocated`: the app container's status allocatedResources (an in-place resize pending)."""
    inits = [container(f"init{i}", r) for i, r in enumerate(init)]
    inits += [container(f"sidecar{i}", r, "Always") for i, r in enumerate(sidecars)]
    spec: dict[str, Any] = {"nodeName": "vm", "containers": [container("app", requests)],
                            "initContainers": inits}
    if overhead is not None:
        spec["overhead"] = overhead
    if pod_level is not None:
        spec["resources"] = {"requests": pod_level}
    status: dict[str, Any] = {"phase": phase, "qosClass": qos}
    if allocated is not None:
        status["containerStatuses"] = [{"name": "app", "allocatedResources": allocated}]
    stamp = created if "T" in created else f"2026-11-23T{created}Z"
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                         "creationTimestamp": stamp, "resourceVersion": "1"},
            "spec": spec, "status": status}


def node(cpu: str = "2", allocatable_cpu: str = "1", memory: str = "8Gi",
         allocatable_memory: str | None = None, pods: str = "110",
         hugepages_2mi: str = "0", allocatable_hugepages_2mi: str | None = None
         ) -> dict[str, Any]:
    capacity = {"cpu": cpu, "memory": memory, "pods": pods, "hugepages-2Mi": hugepages_2mi,
                "hugepages-1Gi": "0", "ephemeral-storage": "100Gi"}
    allocatable = dict(capacity, cpu=allocatable_cpu,
                       memory=allocatable_memory if allocatable_memory is not None else memory)
    if allocatable_hugepages_2mi is not None:
        allocatable["hugepages-2Mi"] = allocatable_hugepages_2mi
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": "vm", "resourceVersion": "1"},
            "status": {"capacity": capacity, "allocatable": allocatable}}


def snapshot(cpus: int, memory: int = 8 * GiB, hugepages_2mi: int | None = None,
             when: float = T, possible: int = 2) -> KernelSnapshot:
    online = frozenset(range(cpus))
    return KernelSnapshot(
        time=when, cpus_online=online, cpus_offline=frozenset(range(possible)) - online,
        cpus_present=frozenset(range(possible)), cpus_possible=frozenset(range(possible)),
        memory_block_size=128 * MiB, memory_blocks_online=frozenset(),
        memory_blocks_offline=frozenset(), mem_total_bytes=memory, swap_total_bytes=0,
        hugepages_bytes={} if hugepages_2mi is None else {Resource.HUGEPAGES_2MI: hugepages_2mi})


def static_policy(when: float = T) -> CpuManagerCheckpoint:
    return CpuManagerCheckpoint(time=when, path="/var/lib/kubelet/cpu_manager_state",
                                present=True, policy="static", default_cpus=frozenset({0, 1}))


def forecaster(node_obj: dict[str, Any], snap: KernelSnapshot, pods: list[dict[str, Any]],
               static: bool = False) -> ReadmissionForecast:
    """A ReadmissionForecast fed as the Correlator feeds it, the objects converted by
    exporter/kube/convert.py exactly as the watch sources convert them."""
    f = ReadmissionForecast()
    f.on_snapshot(snap)
    converted = node_status(node_obj, T).event
    assert isinstance(converted, NodeStatus)
    f.on_node(converted)
    if static:
        f.on_cpu_manager(static_policy())
    for obj in pods:
        event = pod_status(obj, T, None).event
        assert event is not None
        f.on_pod(event)  # type: ignore[arg-type]
    return f


def forecast(node_obj: dict[str, Any], snap: KernelSnapshot, pods: list[dict[str, Any]],
             static: bool = False) -> Forecast:
    result = forecaster(node_obj, snap, pods, static).result()
    assert result is not None
    return result


def rejected(result: Forecast) -> list[tuple[str, str]]:
    """[(pod name, reason)] in readmission order."""
    return [(r.name, r.reason) for r in result.rejected]
