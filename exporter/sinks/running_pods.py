"""What a resize left behind in the running containers, as Prometheus gauges: a sink and a
Collector in one, like the kubelet sink beside it (exporter/sinks/kubelet_collector.py).

The agent hands it every raw event (`on_event`, in the agent's thread); it feeds the pure
RunningPodsView (exporter/correlate/running_pods.py) under its own lock, and /metrics renders
the findings under that lock: judged at scrape time, so a memory block that goes offline
makes a Burstable container's OOM score stale at the next scrape, without a rescan. The
running-pods source rescans after every CPU or memory event (its `poked_by`: a cpuset changes
without any notification), at least --running-pods.min-interval apart.

The composition root wires it (exporter/app.py):

    registry.register(RunningPodsSink.attach(agent))
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.correlate.running_pods import KINDS, RunningPodsView
from exporter.events import Event
from exporter.sinks import ViewSink


class RunningPodsSink(ViewSink):
    def __init__(self) -> None:
        super().__init__()
        self.view = RunningPodsView()

    def feed(self, event: Event) -> None:
        self.view.handle(event)

    # ------------------------------------------------------------ Collector

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            counts = self.view.counts()
            scanned = self.view.containers()
        stale = GaugeMetricFamily(
            "node_resize_running_containers_stale",
            "Running containers a resize left in a state the kubelet would not create today, "
            "by kind: an OOM score adjustment from another memory capacity, a cpuset with "
            "offline CPUs or without online ones, a CPU or memory limit above what the node "
            "has, a swap limit from another capacity. `node-resize-exporter check` names them.",
            labels=["kind"])
        for kind in KINDS:
            if kind in counts:
                stale.add_metric([kind], counts[kind])
        yield stale
        found = GaugeMetricFamily(
            "node_resize_running_containers",
            "Container cgroups under kubepods the last scan read.")
        if scanned is not None:
            found.add_metric([], scanned)
        yield found
