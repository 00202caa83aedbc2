"""The Prometheus sink: counts episode statistics from the correlator's updates, and renders
them with the ledger's and the node view's state at scrape time (a prometheus_client Collector).

No metric object is updated as events flow. The ledger and the node view are written by the
Correlator alone, under the agent's lock, and read here under that same lock; the statistics
this sink counts (exporter/sinks/stats.py) are under its own lock, since the agent calls sinks
outside its lock. Names are the contract in docs/metrics.md (tests/e2e/test_catalogue.py checks it).

The composition root builds it (exporter/app.py `build_agent`): the ledger and the node view
are the Correlator's own; the sink is one of the agent's sinks, so it also sees the episodes
the journal kept open as they are resumed through every sink.

`sinks` is the agent's live list (their error counters are shown; this sink skips itself).
"""
from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter import __version__, buildinfo
from exporter.correlate.histogram import Histogram
from exporter.correlate.kube_view import RESIZE_REASONS, VIEWS
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.model import EpisodeUpdate
from exporter.correlate.node_view import NodeView
from exporter.events import HEARTBEAT_VIA, Direction, Event, Resource, Result
from exporter.sinks import reporting, up_of
from exporter.sinks.stats import EpisodeStats

KERNEL_RESOURCES = (Resource.CPU, Resource.MEMORY)
# Error reasons are a closed set: every series the alerts read exists from the start at 0, so
# increase() and rate() see the first error instead of a series that appears already at 1. Only
# reasons that can occur: without the Kubernetes join an episode ends kernel_only or
# kernel_failed, never resync_timeout, mismatch or readmission_rejected.
RESYNC_ERROR_REASONS = ("kernel_failed", "resync_timeout", "mismatch")
UNPLUG_ERROR_REASONS = RESYNC_ERROR_REASONS + ("readmission_rejected",)
KERNEL_ONLY_ERROR_REASONS = ("kernel_failed",)
READMISSION_OUTCOMES = (("kept", "Running"),)
HUGEPAGES = (Resource.HUGEPAGES_2MI, Resource.HUGEPAGES_1GI)


def _with_zeros(values: Mapping[Any, int], keys: Iterable[Hashable]) -> dict[Any, int]:
    return {**{k: 0 for k in keys}, **values}


def _histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    """One histogram's series, once it has an observation: a node that never resized (and
    every label combination that never occurred) costs no buckets."""
    if h.n:
        family.add_metric(labels, h.cumulative(), h.total)


class MetricsSink(Collector):
    """Everything /metrics shows. `view` None: the kernel side only (no episode metrics).
    `kubernetes` False: the episode counters a kernel-only episode can move, and none of the
    Kubernetes join's families (balloons, readmission, the Node's view)."""

    def __init__(self, lock: threading.Lock, ledger: KernelLedger, view: NodeView | None = None,
                 sinks: Iterable[object] = (), kubernetes: bool = True,
                 lossy: Iterable[str] = ()) -> None:
        self.lock = lock  # the agent's: held while the Correlator writes ledger and view
        self.ledger = ledger
        self.view = view
        self.kubernetes = kubernetes
        self.sinks = sinks  # their error counters are shown too (the agent's live list)
        # The sources that can lose events (their registrations say `lossy`: a ring buffer
        # full, netlink ENOBUFS): their events_lost_total exists at 0 for
        # NodeResizeExporterEventsLost; any other source's appears with its first loss.
        self.lossy = frozenset(lossy)
        self.stats = EpisodeStats()
        self._stats_lock = threading.Lock()
        self.errors = 0

    # ------------------------------------------------------------ Sink

    def on_event(self, event: Event) -> None:
        with self._stats_lock:
            self.stats.count_event(event)

    def on_update(self, update: EpisodeUpdate) -> None:
        with self._stats_lock:
            self.stats.count_update(update)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------ Collector

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            unused = self._unused_hugepages()
            families = list(self._self_metrics()) + list(self._kernel(unused))
            if self.view is not None:
                with self._stats_lock:
                    families += list(self._episodes(self.stats))
                    if self.kubernetes:
                        families += list(self._kubernetes(self.view, self.stats, unused))
        families.append(self._sink_errors())
        up = self._sink_up()
        if up.samples:  # only a journal has one; none with --no-journal
            families.append(up)
        return families

    def _unused_hugepages(self) -> frozenset[Resource]:
        """Hugepage sizes no side has any of: the kernel has no page of the size, and the Node
        neither reports nor allocates one, nor does a balloon hold one (a kubelet reports every
        size the kernel supports, at 0). Each of their series would be 0 in every per-resource
        family, so none is shown; the first page of the size, on either side, shows them all."""
        snap = self.ledger.snapshot
        view = self.view if self.kubernetes else None
        unused = set()
        for r in HUGEPAGES:
            values = [snap.capacity(r)] if snap is not None else []
            if view is not None:
                values += [view.kubelet_capacity().get(r, 0.0),
                           view.kubelet_allocatable().get(r, 0.0)]
                values += [view.balloon_requests(which).get(r, 0.0) for which in VIEWS]
            if not any(values):
                unused.add(r)
        return frozenset(unused)

    def _sink_errors(self) -> Metric:
        fam = CounterMetricFamily("node_resize_exporter_sink_errors",
                                  "Writes a sink could not make (journal read-only or full, "
                                  "trace export failures); the agent keeps running.",
                                  labels=["sink"])
        for name, sink in self._named_sinks():
            fam.add_metric([name], sink.errors)
        return fam

    def _named_sinks(self) -> list[tuple[str, Any]]:
        """The sinks that report (exporter/sinks/__init__.py Reporting: journal, trace,
        kubeevents); the views (kubelet, running pods, plan) write nothing, have no series."""
        return reporting(s for s in self.sinks if s is not self)

    def _sink_up(self) -> Metric:
        """One series per sink that can be down as a whole (the journal: a file of a newer
        schema is left alone; the reason is logged once)."""
        fam = GaugeMetricFamily("node_resize_exporter_sink_up",
                                "1 while the sink works; 0 when it was turned off at start "
                                "(the journal: written by a newer exporter, left untouched).",
                                labels=["sink"])
        for name, sink in self._named_sinks():
            up = up_of(sink)
            if up is not None:
                fam.add_metric([name], 1.0 if up else 0.0)
        return fam

    # ------------------------------------------------------------ the exporter itself

    def _self_metrics(self) -> Iterable[Metric]:
        led = self.ledger
        info = GaugeMetricFamily("node_resize_exporter_build_info",
                                 "Build of the exporter; always 1.",
                                 labels=["version", "revision"])
        info.add_metric([__version__, buildinfo.revision()], 1)
        yield info
        up = GaugeMetricFamily("node_resize_exporter_source_up",
                               "1 when the source is running, 0 when it failed or is down.",
                               labels=["source"])
        for name, state in sorted(led.sources.items()):
            up.add_metric([name], 1 if state.up else 0)
        yield up
        last = GaugeMetricFamily("node_resize_exporter_source_last_event_timestamp_seconds",
                                 "When the source last delivered an event (Unix time).",
                                 labels=["source"])
        for name, when in sorted(led.last_event.items()):
            last.add_metric([name], when)
        yield last
        attached = GaugeMetricFamily("node_resize_exporter_bpf_program_attached",
                                     "1 when the BPF program is attached.", labels=["program"])
        for name, state in sorted(led.programs.items()):
            attached.add_metric([name], 1 if state.up else 0)
        yield attached
        # At 0 from the start: events for every running source, losses for the sources that
        # can lose (the alert's), malformed inputs for none (a series appears with the first).
        for metric, counts, zeros, help_ in (
            ("node_resize_exporter_events", led.events, set(led.sources),
             "Events received, by source."),
            ("node_resize_exporter_events_lost", led.lost, set(led.sources) & self.lossy,
             "Events a source lost (ring buffer full, netlink ENOBUFS)."),
            ("node_resize_exporter_malformed", led.malformed, set(),
             "Inputs a source could not parse; counted and skipped."),
        ):
            fam = CounterMetricFamily(metric, help_, labels=["source"])
            for name in sorted(zeros | {k for k, n in counts.items() if n}):
                fam.add_metric([name], counts.get(name, 0))
            yield fam

    # ------------------------------------------------------------ kernel side

    def _kernel(self, unused: frozenset[Resource] = frozenset()) -> Iterable[Metric]:
        led = self.ledger
        tx = CounterMetricFamily("node_resize_kernel_transitions",
                                 "CPU and memory block transitions the kernel made or refused.",
                                 labels=["resource", "direction", "result"])
        keys = {(r, d, res) for r in KERNEL_RESOURCES for d in Direction for res in Result}
        for r, d, res in sorted(keys | set(led.transitions), key=str):
            tx.add_metric([r.value, d.value, res.value], led.transitions.get((r, d, res), 0))
        yield tx
        down = CounterMetricFamily("node_resize_exporter_down_changes",
                                   "CPUs and memory blocks found in another state at start than "
                                   "the journal last knew: changes while the exporter was down.",
                                   labels=["resource", "direction"])
        # Counted once, at start, before the first scrape: a series only for what changed (none
        # on a node whose exporter saw every transition), never an increase() to miss.
        for r in KERNEL_RESOURCES:
            for d in Direction:
                if led.down_changes.get((r, d), 0):
                    down.add_metric([r.value, d.value], led.down_changes[(r, d)])
        yield down
        dur = HistogramMetricFamily("node_resize_kernel_transition_duration_seconds",
                                    "Kernel time of one transition, first cpuhp step (or "
                                    "online_pages call) to the last (BPF only).",
                                    labels=["resource", "direction"])
        for (r, d), h in sorted(led.durations.items(), key=str):
            _histogram(dur, [r.value, d.value], h)
        yield dur
        snap = led.snapshot
        if snap is None:
            return
        cpus = GaugeMetricFamily("node_resize_kernel_cpus", "CPUs by state (sysfs).",
                                 labels=["state"])
        for state, ids in (
            ("online", snap.cpus_online),
            ("offline", snap.cpus_offline),
            ("present", snap.cpus_present),
            ("possible", snap.cpus_possible),
        ):
            cpus.add_metric([state], len(ids))
        yield cpus
        blocks = GaugeMetricFamily(
            "node_resize_kernel_memory_blocks", "Memory blocks by state.", labels=["state"]
        )
        blocks.add_metric(["online"], len(snap.memory_blocks_online))
        blocks.add_metric(["offline"], len(snap.memory_blocks_offline))
        yield blocks
        cap = GaugeMetricFamily(
            "node_resize_kernel_capacity",
            "What the kernel has now: CPUs online, MemTotal, hugepages, swap.",
            labels=["resource", "unit"],
        )
        for r in Resource:
            if r in (Resource.CPU, Resource.MEMORY, Resource.SWAP) or (
                    r in snap.hugepages_bytes and r not in unused):
                cap.add_metric([r.value, r.unit], snap.capacity(r))
        yield cap
        yield GaugeMetricFamily(
            "node_resize_kernel_memory_blocks_bytes",
            "Online memory blocks times the block size.",
            value=snap.memory_blocks_bytes,
        )

    # ------------------------------------------------------------ episodes

    def _episodes(self, st: EpisodeStats) -> Iterable[Metric]:
        """Episode counters: with the Kubernetes join or without (kernel-only episodes)."""
        k8s = self.kubernetes
        resync_reasons = RESYNC_ERROR_REASONS if k8s else KERNEL_ONLY_ERROR_REASONS
        unplug_reasons = UNPLUG_ERROR_REASONS if k8s else KERNEL_ONLY_ERROR_REASONS
        yield GaugeMetricFamily(
            "node_resize_exporter_episodes_open", "Episodes not yet ended.", value=st.episodes_open
        )
        yield _counter(
            "node_resize_resync_request",
            "Hot-plug episodes that need a kubelet resync (KEP-3953).",
            ["resource"],
            _with_zeros(
                {(r.value,): n for r, n in st.resync_requests.items()},
                [(r.value,) for r in KERNEL_RESOURCES],
            ),
        )
        yield _counter(
            "node_resize_resync_errors",
            "Hot-plug episodes that did not resync, by reason.",
            ["resource", "reason"],
            _with_zeros(
                {(r.value, why): n for (r, why), n in st.resync_errors.items()},
                [(r.value, why) for r in KERNEL_RESOURCES for why in resync_reasons],
            ),
        )
        yield _counter(
            "node_hot_unplug_request",
            "Hot-unplug episodes (KEP-5578).",
            ["resource"],
            _with_zeros(
                {(r.value,): n for r, n in st.unplug_requests.items()},
                [(r.value,) for r in KERNEL_RESOURCES],
            ),
        )
        yield _counter(
            "node_hot_unplug_errors",
            "Hot-unplug episodes that failed, by reason.",
            ["resource", "reason"],
            _with_zeros(
                {(r.value, why): n for (r, why), n in st.unplug_errors.items()},
                [(r.value, why) for r in KERNEL_RESOURCES for why in unplug_reasons],
            ),
        )

    # ------------------------------------------------------------ Kubernetes side

    def _kubernetes(self, view: NodeView, st: EpisodeStats,
                    unused: frozenset[Resource] = frozenset()) -> Iterable[Metric]:
        fam = HistogramMetricFamily(
            "node_resize_resync_duration_seconds",
            "Kernel done to Node capacity updated.",
            labels=["resource", "direction", "resynced_by"],
        )
        for (r, change, by), h in sorted(st.resync_duration_by.items(), key=str):
            _histogram(fam, [r.value, change.value, by], h)
        yield fam
        fam = HistogramMetricFamily(
            "node_resize_readmission_duration_seconds",
            "Kernel done to pod readmission settled.",
            labels=["resource"],
        )
        for r, h in sorted(st.readmission_duration.items(), key=str):
            _histogram(fam, [r.value], h)
        yield fam
        yield _counter(
            "node_resize_readmission_pods",
            "Pods judged at readmission.",
            ["outcome", "reason"],
            _with_zeros(
                {(o, why): n for (o, why), n in st.readmission_pods.items()}, READMISSION_OUTCOMES
            ),
        )
        yield _gauge(
            "node_resize_kubelet_capacity", "Node status.capacity.", view.kubelet_capacity(),
            unused,
        )
        yield _gauge(
            "node_resize_kubelet_allocatable",
            "Node status.allocatable.",
            view.kubelet_allocatable(),
            unused,
        )
        yield _gauge(
            "node_resize_capacity_drift",
            "Kernel capacity minus the Node's (0 in sync).",
            view.drift(),
            unused,
        )
        drift_s = GaugeMetricFamily(
            "node_resize_capacity_drift_seconds",
            "How long the current drift has lasted.",
            labels=["resource"],
        )
        for r, v in sorted(view.drift_seconds().items(), key=str):
            if r not in unused:
                drift_s.add_metric([r.value], v)
        yield drift_s
        yield from self._balloons(view, st, unused)
        fam = HistogramMetricFamily(
            "node_resize_balloon_resize_duration_seconds", "Balloon resize spec change to applied."
        )
        _histogram(fam, [], st.balloon_resize_duration)
        yield fam
        yield from _heartbeats(view)
        allocatable = view.podresources_allocatable_cpus()
        if allocatable is not None:
            yield GaugeMetricFamily(
                "node_resize_podresources_allocatable_cpus",
                "CPU ids the kubelet podresources API offers.",
                value=allocatable,
            )
            yield GaugeMetricFamily(
                "node_resize_podresources_offline_cpus",
                "Offered CPU ids the kernel has offline.",
                value=view.podresources_offline_cpus() or 0,
            )

    # ------------------------------------------------------------ balloons

    def _balloons(self, view: NodeView, st: EpisodeStats,
                  unused: frozenset[Resource] = frozenset()) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "node_resize_balloon_requests",
            "Requests held by balloon pods, as the scheduler (KEP-1287: "
            "max of spec, allocated, actual) or the kubelet (allocated) "
            "counts them.",
            labels=["resource", "unit", "view"],
        )
        for which in VIEWS:
            for r, v in sorted(view.balloon_requests(which).items(), key=str):
                fam.add_metric([r.value, r.unit, which], v)
        yield fam
        yield GaugeMetricFamily(
            "node_resize_balloon_pods", "Balloon pods on the node.", value=view.balloon_pods()
        )
        yield _gauge(
            "node_resize_capacity_effective",
            "Kubelet allocatable minus balloon requests in the scheduler's view.",
            view.effective(),
            unused,
        )
        # Infeasible by every reason from the start: the alert sees the first one.
        yield _counter(
            "node_resize_balloon_resize",
            "In-place resizes of balloon pods, by result and reason.",
            ["result", "reason"],
            _with_zeros(
                st.balloon_resize_reasons, [("infeasible", why) for why in RESIZE_REASONS[1:]]
            ),
        )


def _heartbeats(view: NodeView) -> Iterable[Metric]:
    """The kubelet's last sign of life, via the Node's Ready condition (posted on a
    change and at least every 5 min) and its Lease (renewed every 10 s)."""
    stamp = GaugeMetricFamily(
        "node_resize_kubelet_heartbeat_timestamp_seconds",
        "The kubelet's last heartbeat (seconds since the epoch): the "
        "Node's Ready lastHeartbeatTime, or its Lease's renewTime.",
        labels=["via"],
    )
    age = GaugeMetricFamily(
        "node_resize_kubelet_heartbeat_age_seconds",
        "Seconds since that heartbeat: a dead kubelet sends nothing, so "
        "this grows while the Node stays Ready.",
        labels=["via"],
    )
    for via in HEARTBEAT_VIA:
        beat = view.heartbeat(via)
        if beat is not None:
            stamp.add_metric([via], beat)
            age.add_metric([via], view.heartbeat_age(via) or 0.0)
    yield stamp
    yield age


def _counter(name: str, help_: str, labels: list[str], values: Mapping[Any, int]) -> Metric:
    fam = CounterMetricFamily(name, help_, labels=labels)
    for key, n in sorted(values.items()):
        fam.add_metric(list(key), n)
    return fam


def _gauge(name: str, help_: str, values: dict[Resource, float],
           unused: frozenset[Resource] = frozenset()) -> Metric:
    fam = GaugeMetricFamily(name, help_, labels=["resource", "unit"])
    for r, v in sorted(values.items(), key=str):
        if r not in unused:
            fam.add_metric([r.value, r.unit], v)
    return fam
