"""The Collectors /metrics renders, in one table, as the sources have theirs
(exporter/sources/registry.py; node_exporter's `factories`): what `serve` registers, the lines
`check` asks of them and what the tests build are read from COLLECTORS alone.

Each is built from the running agent's wiring (`Wiring`: the agent, the metrics sink
build_agent made, the running-pods, kubelet and plan sinks serve attached first, because the
plan reads the other two's views). The web endpoint's own Collector (authentication counts,
exporter/web/authmetrics.py) is registered by the endpoint itself, which owns what it counts.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import Collector, CollectorRegistry

from exporter.checks import Check, guarded
from exporter.readnow import Reads
from exporter.sinks.forecast_collector import ForecastCollector
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.memory_zones_collector import MemoryZonesCollector
from exporter.sinks.metrics import MetricsSink
from exporter.sinks.plan_collector import PlanSink
from exporter.sinks.running_pods_collector import RunningPodsSink


@dataclass(frozen=True)
class Wiring:
    """What the collectors are built from."""

    agent: Any  # exporter/agent.py Agent
    metrics: MetricsSink
    running: RunningPodsSink
    kubelet: KubeletSink
    plan: PlanSink


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    build: Callable[[Wiring], Collector]  # registered once, in the table's order
    # `check`'s lines for what it shows (None: none), under `label`; `kubernetes`: asked with
    # the Kubernetes side's lines (only when it is on).
    check: Callable[[Reads], list[Check]] | None = None
    label: str = ""
    kubernetes: bool = False


def _forecast(w: Wiring) -> Collector:
    return ForecastCollector(w.agent.lock, w.agent.correlator.forecast,
                             w.agent.correlator.forecast_validity)


COLLECTORS: tuple[CollectorSpec, ...] = (
    # The exporter's own: episodes, both sides' capacity, sources, sinks, the process.
    CollectorSpec("metrics", lambda w: w.metrics),
    # The kubelet's local state (checkpoints, kubepods cpuset).
    CollectorSpec("kubelet", lambda w: w.kubelet, KubeletSink.check, "kubelet restart"),
    # What a resize left in the running containers.
    CollectorSpec("running_pods", lambda w: w.running, RunningPodsSink.check,
                  "running containers"),
    # What a kubelet restart now would reject.
    CollectorSpec("forecast", _forecast, ForecastCollector.check, "readmission forecast",
                  kubernetes=True),
    # Before you unplug: node_resize_unpluggable.
    CollectorSpec("plan", lambda w: w.plan),
    # Memory by zone and the hot-added blocks that may never leave, from the kernel's state
    # (read at the scrape, from the paths the plan reads).
    CollectorSpec("memory_zones", lambda w: MemoryZonesCollector(w.plan.sysfs, w.plan.procfs)),
)


def register(registry: CollectorRegistry, wiring: Wiring) -> list[Collector]:
    """Build and register every collector of the table, in its order."""
    built = []
    for spec in COLLECTORS:
        collector = spec.build(wiring)
        registry.register(collector)
        built.append(collector)
    return built


def checks(reads: Reads, *, kubernetes: bool) -> list[Check]:
    """The `check` lines of the collectors on the kernel's side (kubernetes=False) or on the
    Kubernetes side (True), each guarded: one that raises is a FAIL line, not a traceback.
    `reads`: the run's one-shot reads (exporter/readnow), shared by every line."""
    out: list[Check] = []
    for spec in COLLECTORS:
        if spec.check is not None and spec.kubernetes == kubernetes:
            out += guarded(spec.label, spec.check, reads)
    return out
