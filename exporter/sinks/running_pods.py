"""What a resize left behind in the running containers, as Prometheus gauges: a sink and a
Collector in one, like the kubelet sink beside it (exporter/sinks/kubelet_collector.py).

The agent hands it every raw event (`on_event`, in the agent's thread); it feeds the pure
RunningPodsView (exporter/correlate/running_pods.py) under its own lock, and /metrics renders
the findings under that lock: judged at scrape time, so a memory block that goes offline
makes a Burstable container's OOM score stale at the next scrape, without a rescan. It also
pokes the running-pods source after every CPU or memory event (a cpuset changes without any
notification); the source itself keeps its rescans at least --running-pods.min-interval apart.

The composition root wires it (exporter/app.py):

    registry.register(RunningPodsSink.attach(agent))
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.correlate.model import EpisodeUpdate
from exporter.correlate.running_pods import KINDS, RunningPodsView
from exporter.events import DeviceChange, Event, Resource, Transition
from exporter.sinks import SelfDescribing

SOURCE = "running_pods"
POKED = frozenset({Resource.CPU, Resource.MEMORY})


class RunningPodsSink(SelfDescribing):
    def __init__(self, pokes: Iterable[Callable[[], None]] = ()) -> None:
        self.view = RunningPodsView()
        self.lock = threading.Lock()
        self._pokes = list(pokes)

    @classmethod
    def attach(cls, agent: Any) -> "RunningPodsSink":
        """Built for a running agent: pokes its running-pods source, and is one of its sinks."""
        sink = cls([s.poke for s in agent.sources if s.name == SOURCE])
        agent.add_sink(sink)
        return sink

    # ------------------------------------------------------------ Sink

    def on_event(self, event: Event) -> None:
        with self.lock:
            self.view.handle(event)
        if isinstance(event, (Transition, DeviceChange)) and event.resource in POKED:
            for poke in self._pokes:
                poke()

    def on_update(self, update: EpisodeUpdate) -> None:
        pass  # judged from the kernel's truth now, not from episodes

    def close(self) -> None:
        pass

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
