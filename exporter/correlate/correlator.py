"""The correlator: events in, episode updates out. Pure (no I/O), clock injected.

    events ──► KernelLedger (counts, de-duplicates) ──► NodeView (both sides now: the gauges)
                                                   ├──► EpisodeTracker (episodes) ──► updates
                                                   └──► ReadmissionForecast (kept per episode)

Statistics are no part of it: the metrics sink counts them from the updates. The ledger and the
view are built by the composition root and handed both to the Correlator, which alone writes
them, and to the metrics sink, which reads them at scrape time under the agent's lock.
"""
from __future__ import annotations

from collections.abc import Callable
from math import isfinite
from typing import Any, cast

from exporter.clock import Clock
from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.episodes import EpisodeTracker
from exporter.correlate.forecast_validity import ForecastValidity
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.model import (
    Episode,
    EpisodeUpdate,
    Outcome,
    ResyncedBy,
    UpdateKind,
)
from exporter.correlate.node_view import NodeView
from exporter.correlate.readmission_forecast import Forecast, ReadmissionForecast
from exporter.events import (
    CpuManagerCheckpoint,
    Event,
    KernelSnapshot,
    KubeletProcess,
    NodeHeartbeat,
    NodeStatus,
    PodResourcesAllocatable,
    PodsRelisted,
    PodStatus,
    SourceStatus,
    Transition,
)

# What resynced an episode, once known for sure.
KNOWN = (ResyncedBy.LIVE, ResyncedBy.RESTART)
# Episodes that ended waiting for a kubelet: a restart would still have judged the pods.
_RESTART_JUDGED = frozenset({Outcome.RESYNC_TIMEOUT, Outcome.MISMATCH})
_RESYNCED, _ENDED, _POD = UpdateKind.RESYNCED, UpdateKind.ENDED, UpdateKind.POD


class Correlator:
    def __init__(self, config: CorrelatorConfig, clock: Clock,
                 ledger: KernelLedger | None = None, view: NodeView | None = None,
                 forecast: ReadmissionForecast | None = None) -> None:
        self._clock = clock
        self._ledger = KernelLedger() if ledger is None else ledger
        self._view = NodeView(config, clock) if view is None else view
        self._tracker = EpisodeTracker(config, self._view)
        self._next_due = self._tracker.next_due  # when the earliest deadline falls due
        self.malformed_events = 0  # skipped: a timestamp that is not a finite number
        self._apply: dict[type, Callable[[Any], list[EpisodeUpdate]]] = {
            Transition: self._transition,
            KernelSnapshot: self._snapshot,
            NodeStatus: self._node,
            PodStatus: self._pod,
            PodsRelisted: self._relist,
            PodResourcesAllocatable: self._podresources,
            KubeletProcess: self._kubelet_process,
            NodeHeartbeat: self._heartbeat,
            CpuManagerCheckpoint: self._cpu_manager,
        }
        self._kubelet_starts: list[float] = []  # Kubelet start times seen, newest last
        # The start time of the kubelet each source sees now, by the source's name: while one
        # does, a resync without a restart is the running kubelet's (kubelet_live).
        self._kubelet_seen: dict[str | None, float] = {}
        self._resynced_by: dict[str, ResyncedBy] = {}  # by episode id, once decided
        # The readmission forecast (what a kubelet restart would reject). An episode carries
        # it as it stood just before the kubelet acted on the episode (_note_forecasts).
        self.forecast = ReadmissionForecast() if forecast is None else forecast
        self._forecast_for: dict[str, Forecast | None] = {}  # by episode id, once decided
        # Whether the forecast saw the pods it judges (the pod source listed them and is up):
        # while not, the metrics show why instead of a forecast and episodes store none.
        self.forecast_validity = ForecastValidity()

    def handle(self, event: Event, source: str | None = None) -> list[EpisodeUpdate]:
        if not self._ledger.handle(event, source):
            if isinstance(event, Transition) and event.start is not None:
                # A duplicate that knows more (BPF's kernel times after a uevent got there
                # first): let the episode keep the better record.
                self._tracker.enrich(event)
            return []
        kind = type(event)
        if kind is KubeletProcess or kind is SourceStatus:
            self._watch(cast("KubeletProcess | SourceStatus", event), source)
        apply = self._apply.get(kind)
        if apply is None:
            if type(event) is SourceStatus:  # the pod source's state: the forecast's validity
                self.forecast_validity.on_source_status(event)
            return []
        when: object = event.end if isinstance(event, Transition) else event.time
        if not isinstance(when, (int, float)) or not isfinite(when):
            self.malformed_events += 1
            return []
        # Deadlines that fell due before this event are decided first, on the state before it.
        # Not past now: a stamp from the future (a source's bad clock) must not fast-forward
        # every open episode. The earliest deadline says whether anything is due at all.
        due = self._next_due()
        if due <= when:  # the clock is read only when something may be due
            now = self._clock.now()
            upto = float(when) if when < now else now
            if due <= upto:
                # (Finished first: their forecast is the one from before this event.)
                decided = self._finish(self._tracker.advance(upto))
                return decided + self._finish(apply(event))
        updates = apply(event)
        return self._finish(updates) if updates else updates

    def tick(self) -> list[EpisodeUpdate]:
        return self._finish(self._tracker.advance(self._clock.now()))

    def resume(self, episodes: list[Episode]) -> list[EpisodeUpdate]:
        """Re-open the episodes a journal kept open across a restart. Every sink must see the
        RESUMED updates returned (the metrics sink counts their requests)."""
        return self._finish(self._tracker.resume(episodes, self._clock.now()))

    def episodes_open(self) -> int:
        return self._tracker.episodes_open

    def next_due(self) -> float:
        """When tick() next has something to decide, on the clock's axis: the earliest
        deadline of an open episode (it may be early, never late); inf when none is due."""
        return self._next_due()

    @property
    def episodes_looked_at(self) -> int:
        """Work done per open episode so far (next decisions and resync checks worked out): an
        event that concerns none of them adds nothing, whatever their number."""
        return self._tracker.looked_at

    def open_episodes(self) -> list[Episode]:
        """Copies of the open episodes, oldest first."""
        return self._tracker.open_episodes()

    # ------------------------------------------------------------ per event type

    def _transition(self, t: Transition) -> list[EpisodeUpdate]:
        if t.start is not None and not isfinite(t.start):
            self.malformed_events += 1
            return []
        return self._tracker.on_transition(t)

    # The tracker sees each event before the forecast does: an episode the event resyncs (or
    # the first pod it rejects) carries the forecast from before it (_note_forecasts).

    def _snapshot(self, snap: KernelSnapshot) -> list[EpisodeUpdate]:
        previous = self._view.snapshot
        self._view.on_snapshot(snap)
        updates = self._note_forecasts(
            self._tracker.on_snapshot(previous is not None and snap.time < previous.time))
        self.forecast.on_snapshot(snap)
        return updates

    def _node(self, node: NodeStatus) -> list[EpisodeUpdate]:
        self._view.on_node(node)
        updates = self._note_forecasts(self._tracker.on_node())
        self.forecast.on_node(node)
        return updates

    def _pod(self, pod: PodStatus) -> list[EpisodeUpdate]:
        prev = self._view.on_pod(pod)
        updates = self._note_forecasts(self._tracker.on_pod(pod, prev))
        self.forecast.on_pod(pod)
        return updates

    def _relist(self, relist: PodsRelisted) -> list[EpisodeUpdate]:
        self._view.on_relist(relist)
        self.forecast.on_relist(relist.uids, relist.time)
        return []

    def _cpu_manager(self, checkpoint: CpuManagerCheckpoint) -> list[EpisodeUpdate]:
        self.forecast.on_cpu_manager(checkpoint)  # static policy: whole CPUs are checked too
        return []

    def _podresources(self, alloc: PodResourcesAllocatable) -> list[EpisodeUpdate]:
        self._view.on_podresources(alloc)
        return []

    def _heartbeat(self, beat: NodeHeartbeat) -> list[EpisodeUpdate]:
        self._view.on_heartbeat(beat)  # A gauge only, no episode reads it
        return []

    def _kubelet_process(self, process: KubeletProcess) -> list[EpisodeUpdate]:
        start = process.start_time
        if start is not None and isfinite(start) and start not in self._kubelet_starts:
            self._kubelet_starts = (self._kubelet_starts + [start])[-16:]
        return []

    def _finish(self, updates: list[EpisodeUpdate]) -> list[EpisodeUpdate]:
        self._mark_resynced_by(updates)
        self._stamp_forecasts(self._note_forecasts(updates))
        return updates

    def _note_forecasts(self, updates: list[EpisodeUpdate]) -> list[EpisodeUpdate]:
        """Keep the forecast as it stands now for each episode the kubelet has just acted on
        for the first time: the first pod it rejected or the Node update that resynced it,
        whichever came first (called before the forecast is fed the event), or its end still
        waiting (resync_timeout, mismatch: the restart never came, the forecast still says
        what it would do). Computed once per episode, never per event (a flap storm's episodes
        end superseded and never need it); one resumed from the journal keeps what it had."""
        carried = self._forecast_for
        for update in updates:
            ep, kind = update.episode, update.kind
            if (kind is _POD or kind is _RESYNCED or (
                    kind is _ENDED and ep.resynced is None and ep.outcome in _RESTART_JUDGED)) \
                    and ep.id not in carried and ep.forecast is None:
                # A forecast over pods it has not seen (pods unlisted, forbidden, truncated)
                # is none at all, never a zero it did not compute.
                carried[ep.id] = self.forecast.result() \
                    if self.forecast_validity.current.valid else None
        return updates

    def _stamp_forecasts(self, updates: list[EpisodeUpdate]) -> None:
        """Each update's episode carries the forecast kept for it (_note_forecasts); episodes
        the kubelet never acted on (superseded, kernel_failed, kernel_only) carry none. Runs
        on every update: nothing to do is cheap."""
        carried = self._forecast_for
        if not carried:
            return
        for update in updates:
            ep = update.episode
            if ep.id in carried:
                ep.forecast = carried.pop(ep.id) if update.kind is _ENDED else carried[ep.id]

    def _watch(self, event: KubeletProcess | SourceStatus, source: str | None) -> None:
        """Which sources see the kubelet now: one that reports none, or goes down, no longer
        vouches for it."""
        if isinstance(event, SourceStatus):
            if not event.up:
                self._kubelet_seen.pop(event.source, None)
        elif event.start_time is not None and isfinite(event.start_time):
            self._kubelet_seen[source] = event.start_time
        else:
            self._kubelet_seen.pop(source, None)

    def _mark_resynced_by(self, updates: list[EpisodeUpdate]) -> None:
        """A resynced episode says what resynced it: a kubelet that started after the kernel
        was done and by the resync (a restart, today's only remedy); the running one when a
        kubelet watched now started before the kernel was done (the same process all along);
        else unknown (no kubelet watched: no hostPID, no --kubelet-metrics-url). Set on each
        update's copy, so a restart seen late still reaches the ENDED update; once known, it is
        never unknown again (a restart after the resync ends the watch of the old kubelet)."""
        decided = self._resynced_by
        for update in updates:
            ep = update.episode
            if ep.resynced is None or ep.kernel_done is None:
                continue
            done, resynced = ep.kernel_done, ep.resynced
            if any(done < start <= resynced for start in self._kubelet_starts):
                by = ResyncedBy.RESTART
            else:
                before = decided.get(ep.id, ep.resynced_by)
                live = any(start <= done for start in self._kubelet_seen.values())
                by = ResyncedBy.LIVE if live else before if before in KNOWN else \
                    ResyncedBy.UNKNOWN
            if update.kind is _ENDED:
                decided.pop(ep.id, None)
            else:
                decided[ep.id] = by
            ep.resynced_by = by
