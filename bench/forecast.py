"""The readmission forecast's cost with many pods on the node.

    .venv/bin/python -m bench.forecast [--pods 10000]

10,000 pods (each 10m CPU, 64 MiB, created one second apart) on a Node whose kubelet reserves
1 CPU. Prints, in milliseconds (median of repeats):
- feeding the pods one by one (PodStatus events, as the watch delivers a list);
- a recompute when everything fits (the common case: running totals, O(1));
- a recompute when some do not (one CPU offlined: a pass over every pod, in readmission order);
- one pod's update followed by a recompute, in both cases (what a pod event costs);
- result() when no input changed (the cached Forecast).
"""
from __future__ import annotations

import argparse
import statistics
import time

from exporter.correlate.readmission_forecast import ReadmissionForecast
from exporter.events import KernelSnapshot, NodeStatus, PodStatus, Resource

T0 = 1_795_000_000.0
GiB = 2**30


def snapshot(cpus: int) -> KernelSnapshot:
    online = frozenset(range(cpus))
    return KernelSnapshot(time=T0, cpus_online=online, cpus_offline=frozenset(range(64)) - online,
                          cpus_present=frozenset(range(64)), cpus_possible=frozenset(range(64)),
                          memory_block_size=128 << 20, memory_blocks_online=frozenset(),
                          memory_blocks_offline=frozenset(), mem_total_bytes=1024 * GiB,
                          swap_total_bytes=0)


def pods(n: int, cpu: float = 0.01) -> list[PodStatus]:
    return [PodStatus(T0 + i, f"uid-{i}", f"ns{i % 50}", f"pod-{i:05d}", "Running", "", True,
                      admission_requests={Resource.CPU: cpu, Resource.MEMORY: 64 * 2.0**20},
                      created=T0 + i) for i in range(n)]


def ms(f, repeat: int = 9) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def node(cpus: float) -> NodeStatus:
    """A Node of `cpus` CPUs whose kubelet reserves one."""
    return NodeStatus(T0, "n1", capacity={Resource.CPU: cpus, Resource.MEMORY: 1024.0 * GiB},
                      allocatable={Resource.CPU: cpus - 1, Resource.MEMORY: 1000.0 * GiB},
                      max_pods=100_000)


class Case:
    """A forecast over `events` on a Node of `cpus` CPUs; each recompute() offlines or onlines
    one CPU in the kernel snapshot, so result() has to do the work."""

    def __init__(self, cpus: int, events: list[PodStatus]) -> None:
        self.cpus = cpus
        self.forecast = ReadmissionForecast()
        self.forecast.on_snapshot(snapshot(cpus))
        self.forecast.on_node(node(float(cpus)))
        for pod in events:
            self.forecast.on_pod(pod)
        self.online = cpus

    def recompute(self) -> None:
        self.online = self.cpus - 1 if self.online == self.cpus else self.cpus
        self.forecast.on_snapshot(snapshot(self.online))
        self.forecast.result()

    def pod_event(self, pod: PodStatus) -> None:
        """One pod's requests change, and back: two pod events, two recomputes."""
        self.forecast.on_pod(PodStatus(pod.time, pod.uid, pod.namespace, pod.name, "Running",
                                       "", True, admission_requests={Resource.CPU: 0.011},
                                       created=pod.created))
        self.forecast.result()
        self.forecast.on_pod(pod)
        self.forecast.result()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=10_000)
    n = parser.parse_args().pods
    events = pods(n)  # n x 10m: 100 CPUs of requests for 10,000 pods
    need = n * 0.01
    fits = Case(int(need) + 28, events)  # room for all: the running totals answer
    over = Case(int(need * 0.64), events)  # about a third rejected: a pass over the pods
    for case in (fits, over):
        case.recompute()
    rejected = over.forecast.result().rejected_total  # type: ignore[union-attr]
    assert fits.forecast.result().rejected_total == 0  # type: ignore[union-attr]
    assert rejected > 0
    print(f"pods: {n}; rejected when over: {rejected}")
    print(f"feed {n} pods (one event each):   {ms(lambda: Case(64, events), 3):8.2f} ms")
    print(f"recompute, everything fits:        {ms(fits.recompute):8.3f} ms")
    print(f"recompute, {rejected} rejected:       {ms(over.recompute):8.3f} ms")
    middle = events[n // 2]
    print(f"pod event + recompute, fits:       {ms(lambda: fits.pod_event(middle)) / 2:8.3f} ms")
    print(f"pod event + recompute, over:       {ms(lambda: over.pod_event(middle)) / 2:8.3f} ms")
    print(f"result(), nothing changed:         {ms(over.forecast.result) * 1000:8.3f} us")


if __name__ == "__main__":
    main()
