"""Before you unplug, from the running agent: the plan over HTTP (`GET /plan?cpu=-2&memory=-4Gi`)
and what can leave now as gauges, both from the same pure planner (exporter/plan/planner.py)
as `node-resize-exporter plan`.

A sink and a Collector in one (exporter/sinks/__init__.py ViewSink) that copies nothing the
agent already keeps (on a node listing 20,000 pods a second forecast and a second running-pods
view would hold every pod twice and handle every pod event twice), and computes nothing under
a lock the agent needs. It takes, each under its keeper's lock and only for as long as that
takes (client_python's registry copies its collectors under its lock the same way):
- an immutable view of the Correlator's readmission forecast (ReadmissionForecast.view, O(1))
  and whether it saw the pods (the Correlator's ForecastValidity), under the agent's lock;
- a copy of the running-pods sink's view (RunningPodsView.copy: the running containers, their
  pods, the kernel snapshot every plan starts from), under that sink's lock;
then plans on them with no lock held. With the Kubernetes side on, the plan always judges the
pods: no Node seen yet, or pods not listed, down, forbidden or cut at their bound, and the
planner says they are unjudged (never safe) and `node_resize_unpluggable` is absent, as the
forecast's own series are.
The kubelet's checkpoints and feature gates are the kubelet sink's (its view keeps them). The
cluster's PodDisruptionBudgets (the kube_pdbs source) are kept here, in a BudgetsView under a
lock of their own (plan/eviction.py): only a plan reads them, for each eviction it asks for. The
agent still hands it every event, for what nobody else keeps: whether a Node was seen, and
which of the sources a plan depends on are down and why (the kubelet's checkpoints, the running
containers: "not read", named in the answer). Memory by zone and the hot-added blocks are
exporter/sinks/memory_zones_collector.py's, from the kernel's state. The kernel's CPUs and
memory blocks are read when asked (a plan, the gauges' thread), kept HARDWARE_TTL seconds or
until a kernel event; a plan also reads the kernel's CPUs, blocks and MemTotal itself when
asked and answers on that, not on the agent's last snapshot, which trails a hotplug by the
time its event takes to arrive (sysfs is polled; a loaded node takes seconds);
/proc/kpageflags only for a plan, at most PAGE_BUDGET blocks a plan, each block's flags kept
PAGE_FLAGS_TTL seconds (a cached block is not charged to the budget).

The unpluggable gauges are worked out when an input changes, off the scrape path (as
kube-state-metrics renders on the event): every event wakes this sink's thread, which lets a
burst land (GAUGE_SETTLE), recomputes if an input changed, at most once per
GAUGE_MIN_INTERVAL; a scrape reads the last value. So the gauge follows a pod, Node, kernel or
checkpoint change within about GAUGE_MIN_INTERVAL plus the time to compute it.

The composition root wires it (exporter/app.py):

    running, kubelet = RunningPodsSink.attach(agent), KubeletSink.attach(agent)
    plan = PlanSink.attach(agent, SharedViews.of(agent, running, kubelet), sysfs, procfs,
                           root, kubernetes=decisions.kubernetes)
    MetricsServer(..., plan=plan.http)                      # GET /plan
    registry.register(plan)                                 # the gauges
    plan.start()                                            # after the privilege drop
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.correlate.forecast_validity import ForecastValidity
from exporter.correlate.readmission_forecast import ReadmissionForecast
from exporter.correlate.running_pods_view import RunningPodsView
from exporter.events import (
    CpuManagerCheckpoint,
    DeviceChange,
    Event,
    KernelSnapshot,
    NodeStatus,
    ParavirtMemory,
    PdbsRelisted,
    PdbStatus,
    SourceStatus,
    Transition,
)
from exporter.plan.answer import answer
from exporter.plan.eviction import PDB_SOURCE, BudgetsView
from exporter.plan.model import LIVE_RESIZE_GATES, BadChange, Change, parse_change
from exporter.plan.planner import PAGE_BUDGET, Inputs, judge_blocks, unpluggable
from exporter.ratelog import RateLimitedLog
from exporter.readnow import (
    KUBELET_ROOT_DIR,
    ROOT_EMPTY,
    HotplugHardware,
    PageFlagsReader,
    find_layout,
    not_mounted,
    read_hardware,
    read_kernel,
    read_reserved_cpus,
    with_logged,
)
from exporter.sinks import ViewSink
from exporter.sinks.forecast_collector import take_forecast
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.running_pods_collector import RunningPodsSink

HARDWARE_TTL = 10.0  # seconds the memory blocks' zones are kept (a kernel event drops them)
PAGE_FLAGS_TTL = 30.0  # seconds one block's page flags are kept
GAUGE_SETTLE = 0.05  # seconds the gauges' thread lets a burst of events land before it works
GAUGE_MIN_INTERVAL = 1.0  # seconds between two computations of the gauges, at least
GAUGE_RECHECK = 15.0  # seconds after which the thread looks at the inputs without a wake-up
QUERY_KEYS = ("cpu", "memory", "generation")
MAX_QUERY = 256  # bytes of query string
FIX = ("ask as GET /plan?cpu=-2&memory=-4Gi (cpu and/or memory, each once; generation= the "
       "16 hex digits of an earlier answer's)")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharedViews:
    """What the plan reads and others keep, each written under its keeper's lock."""

    lock: threading.Lock  # the agent's: the Correlator writes `forecast` under it
    forecast: ReadmissionForecast  # the Correlator's
    validity: ForecastValidity  # the Correlator's: did the forecast see this node's pods
    running: RunningPodsSink  # its view, copied under a sequence lock
    kubelet: KubeletSink  # its view: the kubelet's checkpoints and feature gates
    # Bumped under `lock` once the agent has handed an event to every sink and the Correlator.
    version: Callable[[], int] = lambda: 0

    @classmethod
    def of(cls, agent: Any, running: RunningPodsSink, kubelet: KubeletSink) -> "SharedViews":
        """The running agent's (exporter/agent.py), and the running-pods and kubelet sinks
        attached to it."""
        return cls(agent.lock, agent.correlator.forecast, agent.correlator.forecast_validity,
                   running, kubelet, agent.state_version)


@dataclass(frozen=True)
class Taken:
    """The planner's inputs, taken under their keepers' locks and judged with none held."""

    inputs: Inputs
    running: RunningPodsView  # the copy in `inputs` (also when nothing was scanned)
    gauges: bool  # "what can leave with no pod rejected" can be said (the pods were judged)


class PlanSink(ViewSink):
    """Locks: the agent's, the running-pods sink's and this sink's own are each taken alone,
    never one while holding another, and only to take a view or a copy: a plan or the gauges
    are worked out with none held, so the agent never waits for one."""

    def __init__(self, shared: SharedViews, sysfs: str = "/sys", procfs: str = "/proc",
                 kubelet_root: str = KUBELET_ROOT_DIR.default, *, kubernetes: bool,
                 node: str = "", cgroup_root: str = "") -> None:
        super().__init__()
        self.shared = shared
        self.sysfs, self.procfs, self.kubelet_root = sysfs, procfs, kubelet_root
        self.kubernetes = kubernetes  # the Kubernetes side is on: the pods are judged
        self.node = node
        self.cgroup_root = cgroup_root  # where a kubelet's kubepods cgroup would show
        self.down: dict[str, str] = {}  # source -> why it is down (the checkpoints, the scan)
        self.node_seen = False  # a Node status was seen
        self._version = 0  # bumped by every input: with the agent's, the gauges' key
        # (blocks changed count, read at, the blocks' zones): kept HARDWARE_TTL seconds, and
        # only while no memory event came since
        self._hardware: tuple[int, float, HotplugHardware] | None = None
        self._blocks_changed = 0
        self._virtio: dict[str, tuple[int | None, int | None]] = {}  # virtio-mem: as logged
        self._flags: dict[int, tuple[float, Any]] = {}  # block -> (read at, flags)
        self._gauges: tuple[int, int] | None = None  # the last value worked out
        self._gauges_key: tuple[int, int, int, int] | None = None  # of the inputs it is of
        self._io = threading.Lock()  # one reader of sysfs/kpageflags at a time
        self._stale = threading.Event()  # an input changed: the gauges' thread looks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = RateLimitedLog(log)
        self.plans = 0
        self.gauge_runs = 0  # how often the gauges were worked out (tests, bench)
        # The PodDisruptionBudgets (the kube_pdbs source's events): kept here, under their own
        # lock (taken alone, briefly: a handle or a snapshot), nobody else reads them.
        self._budgets = BudgetsView()
        self._budgets_lock = threading.Lock()

    # ------------------------------------------------------------ inputs (agent thread)

    def on_event(self, event: Event) -> None:
        # Without the lock: feed() only replaces references and bumps counts (each one store,
        # atomic), so the agent never waits for a plan or a scrape here.
        self.feed(event)

    def feed(self, event: Event) -> None:
        if isinstance(event, (PdbStatus, PdbsRelisted)) or (
                isinstance(event, SourceStatus) and event.source == PDB_SOURCE):
            # Only a plan reads the budgets, never the gauges: no recomputation for them (they
            # change with any pod's readiness anywhere in the cluster).
            with self._budgets_lock:
                self._budgets.handle(event)
            return
        # Pods, relists, kernel snapshots and running containers: the forecast and the
        # running-pods view have them (SharedViews); only the count sees them here.
        self._version += 1
        if not self._stale.is_set():
            self._stale.set()
        if isinstance(event, NodeStatus):
            self.node_seen = True
        elif isinstance(event, SourceStatus) and event.source in DOWN_MEANS:
            down = dict(self.down)  # a new dict, one store: take() reads it without a lock
            if event.up:
                down.pop(event.source, None)
            else:
                down[event.source] = event.reason
            self.down = down
        elif isinstance(event, ParavirtMemory):
            # What the virtio-mem driver logged (requested size, block size): the plan's
            # account of each device; its plugged memory changed, so read the kernel again.
            self._virtio = {d.name: (d.requested_bytes, d.block_size) for d in event.virtio_mem}
            self._blocks_changed += 1
        elif isinstance(event, (Transition, DeviceChange)):
            # CPUs or blocks changed: read again when asked (a hot-added CPU's topology too)
            self._blocks_changed += 1

    # ------------------------------------------------------------ reading the kernel

    def hardware(self, kernel: KernelSnapshot | None = None) -> HotplugHardware:
        """The CPUs and memory blocks, read again when a kernel event came since, after
        HARDWARE_TTL, or when they are not the `kernel` just read (its event still on the
        way)."""
        cached, blocks = self._hardware, self._blocks_changed
        now = time.monotonic()
        if cached is not None and cached[0] == blocks and now - cached[1] < HARDWARE_TTL \
                and (kernel is None or _agrees(cached[2], kernel)):
            return cached[2]
        with self._io:
            hw = read_hardware(self.sysfs, self.procfs)
        if hw.devices is not None and self._virtio:
            hw = dataclasses.replace(hw, devices=with_logged(hw.devices, self._virtio))
        self._hardware = (blocks, now, hw)  # one reference: no lock needed
        return hw

    def _with_cached_flags(self, hw: HotplugHardware) -> HotplugHardware:
        """`hw` with the page flags still cached on its blocks: judge_blocks reads only the
        others, so a cache hit is never charged to the budget (repeated asks read further)."""
        now = time.monotonic()
        fresh = {n: flags for n, (at, flags) in self._flags.items()
                 if now - at < PAGE_FLAGS_TTL}
        if not fresh:
            return hw
        return dataclasses.replace(hw, blocks=tuple(
            dataclasses.replace(b, page_flags=fresh[b.number]) if b.number in fresh else b
            for b in hw.blocks))

    def _page_flags(self, reader: PageFlagsReader) -> Any:
        def read(block: int) -> Any:
            flags = reader.read(block)
            if flags is not None:
                self._flags[block] = (time.monotonic(), flags)
            return flags
        return read

    def _kernel_read(self) -> bool:
        return self.shared.running.copy().snapshot is not None

    def take(self, hw: HotplugHardware, kernel: KernelSnapshot | None = None) -> Taken | None:
        """The planner's inputs: an immutable view of the forecast and whether it saw the pods
        (under the agent's lock when it changed), a copy of the running-pods view (under its
        sink's lock when it changed), the kubelet sink's view and this sink's own (references,
        read once), each lock alone and briefly. None before the kernel was read. `kernel`: the
        kernel read for this plan, which the plan is of when the agent's snapshot differs."""
        shared = self.shared
        forecast, validity = None, None
        if self.kubernetes:
            forecast, validity = take_forecast(shared.lock, shared.forecast, shared.validity)
        running = shared.running.copy()
        if running.snapshot is None:
            return None
        snapshot = running.snapshot
        if kernel is not None and not _same_kernel(running.snapshot, kernel):
            # The agent has not seen the kernel's latest change yet: the pods and containers
            # are judged on the kernel as it is now (a new view: the shared one keeps its own).
            running, snapshot = running.what_if(kernel), kernel
        # The kubelet's checkpoints and gates, as the kubelet sink's view keeps them (each a
        # reference, read once: no lock).
        kubelet = shared.kubelet.view
        cpu, memory = kubelet.cpu_checkpoint, kubelet.memory_checkpoint
        gates = {g: bool(kubelet.gates[g]) for g in LIVE_RESIZE_GATES if g in kubelet.gates}
        resizes = any(gates.values())
        down = self.down
        unjudged = "" if forecast is None or validity is None or validity.valid else \
            f"pods: {validity.describe()} ({validity.fix})"
        not_read, reserved, no_kubelet = self._not_read(running, down, cpu)
        budgets = None
        if self.kubernetes:
            with self._budgets_lock:
                read = self._budgets.read()
            if isinstance(read, str):
                not_read["pod_disruption_budgets"] = read
            else:
                budgets = read
        else:
            not_read["pod_disruption_budgets"] = "the Kubernetes side is off"
        inputs = Inputs(snapshot, hw, forecast,
                        running if running.scan is not None and running.scan.cgroup_version
                        else None, cpu, memory, self.kubelet_root or KUBELET_ROOT_DIR.default,
                        resizes, pods_unjudged=unjudged, not_read=not_read,
                        kubelet_reserved_cpus=reserved, gates=gates, no_kubelet=no_kubelet,
                        budgets=budgets, pods=running.pods)
        return Taken(inputs, running, forecast is None or (
            forecast.node_seen and validity is not None and validity.valid))

    def _not_read(self, running: RunningPodsView, down: dict[str, str],
                  cpu: CpuManagerCheckpoint | None
                  ) -> tuple[dict[str, str], frozenset[int] | None, bool]:
        """What was not read, by the plan's input names, as the CLI names it (exporter/cli/
        plan.py gather): a source down says why; the kubelet's configuration is read here."""
        out: dict[str, str] = {}
        mounted = bool(self.kubelet_root) and not not_mounted(self.kubelet_root)
        why = down.get("kubelet_checkpoint") or ("" if self.kubelet_root else ROOT_EMPTY)
        if why:
            out["cpu_manager_checkpoint"] = out["memory_manager_checkpoint"] = why
        reserved = None
        if cpu is not None and cpu.static and self.kubelet_root:
            reserved, config_why = read_reserved_cpus(self.kubelet_root)
            if reserved is None:
                out["kubelet_config"] = config_why
        scan = running.scan
        if "running_pods" in down:
            out["running_containers"] = down["running_pods"]
        elif scan is not None and not scan.cgroup_version:
            out["running_containers"] = "no kubepods cgroup found"
        if not self.kubernetes:
            out["pods"] = "the Kubernetes side is off: the node's pods were not read"
        # Nothing of a kubelet on this host: no root with its files, no kubepods cgroup (looked
        # for here too: with the Kubernetes side off the running-pods source does not run).
        no_kubelet = not self.kubernetes and not mounted and (
            scan is None or not scan.cgroup_version) and not (
            self.cgroup_root and find_layout(self.cgroup_root) is not None)
        return out, reserved, no_kubelet

    # ------------------------------------------------------------ GET /plan

    def endpoint(self) -> "PlanEndpoint":
        """What the web serves as GET /plan (exporter/web/routes.py)."""
        return PlanEndpoint(self.http, self.malformed)

    def malformed(self, query: str) -> bytes | None:
        """The 400 body for a malformed question (None: well formed). The web asks this
        before it charges the plan budget: only a question that parses costs a plan."""
        try:
            self.question(query)
        except BadChange as e:
            return _error(str(e), FIX)
        return None

    def question(self, query: str) -> tuple[Change, str]:
        """(the change, the generation echoed) from the query string; BadChange says the fix."""
        cpu, memory, asked = self._query(query)
        if asked and not (len(asked) == 16 and all(c in "0123456789abcdef" for c in asked)):
            raise BadChange(f"generation {asked[:40]!r}: the 16 hex digits of an answer's "
                            "generation")
        return parse_change(cpu, memory), asked or ""

    def http(self, query: str) -> tuple[int, bytes]:
        """The answer to GET /plan?<query>: (status, JSON body). 400 only for a malformed
        question; what the machine cannot do is a 200 answer that says so (verdict harmful).
        Never raises for what the client sends. Runs off the event loop (it reads sysfs and
        kpageflags)."""
        try:
            change, asked = self.question(query)
        except BadChange as e:
            return 400, _error(str(e), FIX)
        # The kernel as it is now: an answer is of the machine when asked, never of the
        # agent's last snapshot (a CPU onlined a second ago may not have reached it).
        try:
            with self._io:
                kernel = read_kernel(self.sysfs, self.procfs, time.time())
        except (OSError, ValueError) as e:  # never an answer on what was not read
            return 503, _error(f"the kernel could not be read now ({str(e)[:200]})",
                               "ask again; if it lasts, see `node-resize-exporter check`")
        hw = self.hardware(kernel)
        verdicts = None
        if change.memory < 0 and hw.block_size > 0:
            needed = -(change.memory // hw.block_size)  # ceil of the bytes asked
            with self._io, PageFlagsReader(hw.block_size, self.procfs) as reader:
                verdicts = judge_blocks(self._with_cached_flags(hw), self._page_flags(reader),
                                        PAGE_BUDGET, enough=needed)
        taken = self.take(hw, kernel)
        if taken is None:
            return 503, _error("the kernel has not been read yet", "ask again in a second")
        result = answer(change, taken.inputs, node=self.node, now=time.time(),
                        verdicts=verdicts, asked_generation=asked)
        with self.lock:
            self.plans += 1
        return (200, json.dumps(result.json(), indent=1).encode())

    @staticmethod
    def _query(query: str) -> tuple[str | None, str | None, str | None]:
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
        return seen.get("cpu"), seen.get("memory"), seen.get("generation")

    # ------------------------------------------------------------ the gauges' thread

    def start(self) -> None:
        """The thread that works the gauges out when an input changes (serve starts it after
        the privilege drop; close() stops it)."""
        self._thread = threading.Thread(target=self._run, name="plan-gauges", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._stale.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stale.wait(GAUGE_RECHECK)
            if self._stop.wait(GAUGE_SETTLE):  # a list or a storm: let it land first
                return
            self._stale.clear()
            began = time.monotonic()
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a bad tree must not end the thread
                # Once a minute at most, with the count: a tree that stays bad must not
                # flood the log once a second.
                self._failures.note("gauges", "working out node_resize_unpluggable failed",
                                    level=logging.ERROR, exc_info=True)
            self._stop.wait(max(0.0, GAUGE_MIN_INTERVAL - (time.monotonic() - began)))

    def refresh(self) -> bool:
        """Work the unpluggable gauges out when an input changed since the last time (the
        gauges' thread calls this; tests too). True when it did the work."""
        if not self._kernel_read():
            return False
        hw = self.hardware()
        key = (self._version, self.shared.version(), self.shared.running.view.version, id(hw))
        if key == self._gauges_key:
            return False
        taken = self.take(hw)
        if taken is None:
            return False
        # While the pods were not judged (no Node, not listed, down, forbidden, cut), "what
        # can leave with no pod rejected" cannot be said: absent, as the forecast's series.
        value = unpluggable(taken.inputs, judge_blocks(hw, None, 0)) if taken.gauges else None
        with self.lock:
            self._gauges, self._gauges_key = value, key
            self.gauge_runs += 1
        return True

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            value = self._gauges
        if self.kubernetes and not (self.node_seen and self.shared.validity.current.valid):
            value = None  # the pods are unjudged now, whatever was worked out before
        can = GaugeMetricFamily(
            "node_resize_unpluggable",
            "The most of each resource that can be removed now, each on its own, that the "
            "plan calls safe: no pod rejected at the kubelet's next restart, no running "
            "container left stale, the kubelet restarting on its checkpoints, no kernel "
            "refusal expected, every input read. Memory: whole removable devices (DIMMs, "
            "virtio-mem) whose blocks are in ZONE_MOVABLE, never boot memory (kernel-zone "
            "blocks need their page flags read: `node-resize-exporter plan` or GET /plan).",
            labels=["resource", "unit"])
        if value is not None:
            can.add_metric(["cpu", "core"], value[0])
            can.add_metric(["memory", "byte"], value[1])
        yield can


@dataclass(frozen=True)
class PlanEndpoint:
    """GET /plan for the web: the answer, and the malformed-question check the web makes
    before it charges the plan budget."""

    answer: Callable[[str], tuple[int, bytes]]
    malformed: Callable[[str], bytes | None]

    def __call__(self, query: str) -> tuple[int, bytes]:
        return self.answer(query)


# Sources whose being down means an input was not read (their reason says why).
DOWN_MEANS = ("kubelet_checkpoint", "running_pods")


def _same_kernel(a: KernelSnapshot, b: KernelSnapshot) -> bool:
    """The same CPUs, memory blocks and sizes (read at different times)."""
    return dataclasses.replace(a, time=b.time) == b


def _agrees(hw: HotplugHardware, kernel: KernelSnapshot) -> bool:
    """`hw` was read of the kernel `kernel` is: the same CPUs online, the same blocks."""
    if hw.cpus_online != kernel.cpus_online:
        return False
    return hw.truncated or not hw.block_size or \
        frozenset(b.number for b in hw.blocks if b.online) == kernel.memory_blocks_online


def _error(message: str, fix: str) -> bytes:
    return json.dumps({"error": message, "fix": fix}).encode()

