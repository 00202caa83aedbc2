"""Before you unplug, from the running agent: the plan over HTTP (`GET /plan?cpu=-2&memory=-4Gi`)
and what can leave now as gauges, both from the same pure planner (exporter/plan/planner.py)
as `node-resize-exporter plan`.

A sink and a Collector in one (exporter/sinks/__init__.py ViewSink) that copies nothing the
agent already keeps: on a node listing 20,000 pods a second forecast and a second running-pods
view would hold every pod twice and handle every pod event twice. It plans on
- the Correlator's readmission forecast, under the agent's lock (the lock the Correlator
  writes it under), asked about hypothetical kernels and left as it was
  (ReadmissionForecast.result_on), and whether it saw the pods (the Correlator's
  ForecastValidity): while it did not, a plan says the pods are unjudged (not safe) and
  `node_resize_unpluggable` is absent, as the forecast's own series are;
- the running-pods sink's view (exporter/sinks/running_pods_collector.py), under that sink's
  lock: the running containers, their pods, and the kernel snapshot every plan starts from.
The agent still hands it every event, for what nobody else keeps (under its own lock): whether
a Node was seen (no Node: the plan says Kubernetes is off, as `plan` does), the kubelet's
checkpoints and feature gates, and a count of events for the gauges' cache key (memory by
zone and the hot-added blocks: exporter/sinks/memory_zones_collector.py, from the kernel).
The kernel's memory blocks are read when asked (a plan, a scrape), kept HARDWARE_TTL seconds
or until a kernel event; /proc/kpageflags only for a plan, at most PAGE_BUDGET blocks a plan,
each block's flags kept PAGE_FLAGS_TTL seconds. The gauges are computed at scrape time and
kept until an input changes, like the forecast's.

The composition root wires it (exporter/app.py):

    running = RunningPodsSink.attach(agent)
    plan = PlanSink.attach(agent, SharedViews.of(agent, running), sysfs, procfs)
    MetricsServer(..., plan=plan.http)                      # GET /plan
    registry.register(plan)                                 # the gauges
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.correlate.forecast_validity import ForecastValidity, Validity
from exporter.correlate.readmission_forecast import ReadmissionForecast
from exporter.events import (
    CpuManagerCheckpoint,
    DeviceChange,
    Event,
    KubeletFeatures,
    MemoryManagerCheckpoint,
    NodeStatus,
    Resource,
    Transition,
)
from exporter.plan.model import BadChange, parse_change
from exporter.plan.planner import Inputs, TooLarge, judge_blocks, plan, unpluggable
from exporter.sinks import ViewSink
from exporter.sinks.running_pods_collector import RunningPodsSink
from exporter.sources.kernel.memory_blocks import HotplugHardware, PageFlagsReader, read_hardware

HARDWARE_TTL = 10.0  # seconds the memory blocks' zones are kept (a kernel event drops them)
PAGE_FLAGS_TTL = 30.0  # seconds one block's page flags are kept
GAUGE_MAX_AGE = 15.0  # seconds the gauges may lag a pod change (a kernel change: none)
PAGE_BUDGET = 64  # blocks whose page flags one plan reads at most (~0.5 s)
QUERY_KEYS = ("cpu", "memory")
MAX_QUERY = 256  # bytes of query string
FIX = "ask as GET /plan?cpu=-2&memory=-4Gi (cpu and/or memory, each once)"


@dataclass(frozen=True)
class SharedViews:
    """What the plan reads and others keep, each written under its keeper's lock."""

    lock: threading.Lock  # the agent's: the Correlator writes `forecast` under it
    forecast: ReadmissionForecast  # the Correlator's
    validity: ForecastValidity  # the Correlator's: did the forecast see this node's pods
    running: RunningPodsSink  # its view, under its own lock
    # Bumped under `lock` once the agent has handed an event to every sink and the Correlator.
    # This sink counts events too, but it may count one before the forecast and the view have
    # it: a scrape in between would keep gauges computed without it under the new count.
    version: Callable[[], int]

    @classmethod
    def of(cls, agent: Any, running: RunningPodsSink) -> "SharedViews":
        """The running agent's (exporter/agent.py), and the running-pods sink attached to it."""
        return cls(agent.lock, agent.correlator.forecast, agent.correlator.forecast_validity,
                   running, agent.state_version)


class PlanSink(ViewSink):
    """Lock order, for a plan and a scrape alike: the agent's lock, then the running-pods
    sink's, then this sink's own, each only as long as needed. The agent never holds one while
    taking another (it hands events to the sinks outside its lock, exporter/agent.py _process)
    and feed() takes only this sink's: a plan waiting for the agent's lock holds nothing the
    agent waits for. Never take this sink's lock first: the day the agent calls its sinks
    under its own lock, that would deadlock."""

    def __init__(self, shared: SharedViews, sysfs: str = "/sys", procfs: str = "/proc",
                 kubelet_root: str = "/var/lib/kubelet") -> None:
        super().__init__()
        self.shared = shared
        self.sysfs, self.procfs, self.kubelet_root = sysfs, procfs, kubelet_root
        self.kubernetes = False  # a Node status was seen
        self.cpu_checkpoint: CpuManagerCheckpoint | None = None
        self.memory_checkpoint: MemoryManagerCheckpoint | None = None
        self.kubelet_resizes = False
        self._version = 0  # bumped by every input: with the agent's, the gauges' cache key
        self._hardware: tuple[float, HotplugHardware] | None = None
        self._flags: dict[int, tuple[float, Any]] = {}  # block -> (read at, flags)
        # (key, value, computed at): the gauges' cache
        self._gauges: tuple[tuple[int, int, int, int], tuple[int, int], float] | None = None
        self._io = threading.Lock()  # one reader of sysfs/kpageflags at a time
        self.plans = 0

    # ------------------------------------------------------------ inputs (agent thread)

    def feed(self, event: Event) -> None:
        # Pods, relists, kernel snapshots and running containers: the forecast and the
        # running-pods view have them (SharedViews); only the count sees them here.
        self._version += 1
        if isinstance(event, NodeStatus):
            self.kubernetes = True
        elif isinstance(event, CpuManagerCheckpoint):
            self.cpu_checkpoint = event
        elif isinstance(event, MemoryManagerCheckpoint):
            self.memory_checkpoint = event
        elif isinstance(event, KubeletFeatures):
            self.kubelet_resizes = bool(event.gates.get("NodeResourceHotPlug"))
        elif isinstance(event, (Transition, DeviceChange)) and \
                event.resource is Resource.MEMORY:
            self._hardware = None  # the blocks changed: read again when asked

    # ------------------------------------------------------------ reading the kernel

    def hardware(self) -> HotplugHardware:
        with self.lock:
            cached = self._hardware
        now = time.monotonic()
        if cached is not None and now - cached[0] < HARDWARE_TTL:
            return cached[1]
        with self._io:
            hw = read_hardware(self.sysfs)
        with self.lock:
            self._hardware = (now, hw)
        return hw

    def _page_flags(self, reader: PageFlagsReader) -> Any:
        def read(block: int) -> Any:
            now = time.monotonic()
            hit = self._flags.get(block)
            if hit is not None and now - hit[0] < PAGE_FLAGS_TTL:
                return hit[1]
            flags = reader.read(block)
            if flags is not None:
                self._flags[block] = (now, flags)
            return flags
        return read

    def _kernel_read(self) -> bool:
        with self.shared.running.lock:
            return self.shared.running.view.snapshot is not None

    def _inputs(self, hw: HotplugHardware) -> tuple[Inputs, int, Validity | None] | None:
        """The planner's inputs, this sink's event count and, with Kubernetes on, whether the
        forecast saw the pods; None before the kernel was read. Under the agent's lock and the
        running-pods sink's, held while the planner runs: it asks the forecast about other
        kernels and the view for its (cached) findings."""
        running = self.shared.running.view
        if running.snapshot is None:
            return None
        with self.lock:
            kubernetes, version = self.kubernetes, self._version
            cpu, memory, resizes = self.cpu_checkpoint, self.memory_checkpoint, \
                self.kubelet_resizes
        return (Inputs(running.snapshot, hw, self.shared.forecast if kubernetes else None,
                       running if running.scan is not None else None, cpu, memory,
                       self.kubelet_root, resizes), version,
                self.shared.validity.current if kubernetes else None)

    # ------------------------------------------------------------ GET /plan

    def http(self, query: str) -> tuple[int, bytes]:
        """The answer to GET /plan?<query>: (status, JSON body). Never raises for what the
        client sends. Runs off the event loop (it reads sysfs and kpageflags)."""
        try:
            change = parse_change(*self._query(query))
        except BadChange as e:
            return 400, _error(str(e), FIX)
        hw = self.hardware()
        verdicts = None
        if change.memory < 0 and hw.block_size > 0:
            needed = -(change.memory // hw.block_size)  # ceil of the bytes asked
            with self._io, PageFlagsReader(hw.block_size, self.procfs) as reader:
                verdicts = judge_blocks(hw, self._page_flags(reader), PAGE_BUDGET,
                                        enough=needed)
        with self.shared.lock, self.shared.running.lock:  # the lock order: PlanSink's doc
            got = self._inputs(hw)
            if got is None:
                return 503, _error("the kernel has not been read yet", "ask again in a "
                                   "second")
            try:
                result = plan(change, got[0], verdicts=verdicts)
            except TooLarge as e:
                return 400, _error(str(e), FIX)
            validity = got[2]
        if validity is not None and not validity.valid:
            # A forecast of pods it never saw says "nothing rejected": `plan` says the same
            # of a list it could not make (exporter/cli/plan.py gather).
            result = dataclasses.replace(result, unjudged=(
                *result.unjudged, f"pods: {validity.describe()} ({validity.fix})"))
        with self.lock:
            self.plans += 1
        return (200, json.dumps(result.json(), indent=1).encode())

    @staticmethod
    def _query(query: str) -> tuple[str | None, str | None]:
        if len(query) > MAX_QUERY:
            raise BadChange(f"query longer than {MAX_QUERY} bytes")
        try:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=True,
                                           max_num_fields=len(QUERY_KEYS) + 1) if query else []
        except ValueError as e:
            raise BadChange(f"query {query[:60]!r} does not parse ({e})") from None
        seen: dict[str, str] = {}
        for key, value in pairs:
            if key not in QUERY_KEYS:
                raise BadChange(f"unknown query key {key[:40]!r}: only cpu and memory")
            if key in seen:
                raise BadChange(f"query key {key!r} given twice")
            # A query string's "+" means a space: `cpu=+2` arrives as " 2". Read it as the
            # sign it was meant to be (%2B works too).
            seen[key] = "+" + value[1:] if value.startswith(" ") else value
        return seen.get("cpu"), seen.get("memory")

    # ------------------------------------------------------------ the gauges

    def collect(self) -> Iterable[Metric]:
        hw = self.hardware() if self._kernel_read() else None
        value = None
        if hw is not None:
            with self.shared.lock, self.shared.running.lock:  # the lock order: PlanSink's doc
                got = self._inputs(hw)
                # While the forecast has not seen the pods, "what can leave with no pod
                # rejected" cannot be said: absent, as the forecast's series are.
                if got is not None and (got[2] is None or got[2].valid):
                    inputs, version, _ = got
                    # Kept until an input changes; a pod's change alone (a busy node: every
                    # scrape) is taken into account at most every GAUGE_MAX_AGE seconds, a
                    # kernel change at once.
                    key = (version, self.shared.version(), id(hw), id(inputs.snapshot))
                    now = time.monotonic()
                    with self.lock:
                        cached = self._gauges
                    if cached is not None and (cached[0] == key or (
                            cached[0][2:] == key[2:] and now - cached[2] < GAUGE_MAX_AGE)):
                        value = cached[1]
                    else:
                        value = unpluggable(inputs, judge_blocks(hw, None, 0))
                        with self.lock:
                            self._gauges = (key, value, now)
        can = GaugeMetricFamily(
            "node_resize_unpluggable",
            "The most of each resource that can be removed now, each on its own, with no pod "
            "rejected at the kubelet's next restart, no running container left stale and no "
            "kernel refusal expected: CPUs with an online file, memory blocks in ZONE_MOVABLE "
            "(kernel-zone blocks need their page flags read: `node-resize-exporter plan` or "
            "GET /plan).", labels=["resource", "unit"])
        if value is not None:
            can.add_metric(["cpu", "core"], value[0])
            can.add_metric(["memory", "byte"], value[1])
        yield can

    def describe(self) -> Iterable[Metric]:
        # The families, without reading the kernel (register() calls this at start-up).
        yield GaugeMetricFamily("node_resize_unpluggable", "", labels=["resource", "unit"])


def _error(message: str, fix: str) -> bytes:
    return json.dumps({"error": message, "fix": fix}).encode()

