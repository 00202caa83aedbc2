"""The episode correlator: kernel transitions joined with what the kubelet says, as episodes.

Pure: events in, EpisodeUpdates out, time from the injected clock. Every timed decision
(coalescing window, resync deadline, mismatch and readmission settle windows) is taken at the
instant it falls due, not when tick() happens to run: before an event is applied the state is
advanced to that event's time, so the outcome does not depend on the tick rate and a replay of
the same events gives the same episodes. The README's "Episodes and the Kubernetes join"
describes them.
"""
from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from exporter.clock import Clock
from exporter.correlate.histogram import RESYNC_BUCKETS, Histogram
from exporter.correlate.kube_view import (BalloonResizes, NodeView, PodView, reason_concerns,
                                          rejection, subtract)
from exporter.correlate.model import (Episode, EpisodeUpdate, Outcome, Phase, PodOutcome,
                                      PodVerdict, UpdateKind)
from exporter.events import (Change, KernelSnapshot, NodeStatus, PodResourcesAllocatable,
                             PodsRelisted, PodStatus, Resource, Result, Transition)

# Resources a kernel Transition can be about (per CPU, per memory block).
EPISODE_RESOURCES = (Resource.CPU, Resource.MEMORY)

_RECENT_IDS = 256  # bounded memory; a collision needs two opens in one microsecond anyway

_ERROR_REASON = {
    Outcome.KERNEL_FAILED: "kernel_failed",
    Outcome.RESYNC_TIMEOUT: "resync_timeout",
    Outcome.MISMATCH: "mismatch",
}


@dataclass(frozen=True)
class CorrelatorConfig:
    coalesce_window: float = 2.0  # s: same resource+direction transitions join one episode
    resync_deadline: float = 600.0  # s after kernel done -> resync_timeout
    readmission_settle: float = 10.0  # s without a pod change after resync -> settled
    memory_tolerance_bytes: float = 100 * 2**20  # KEP-3953's jitter bound for the kubelet
    cpu_tolerance_cores: float = 0.0  # whole cores
    kubernetes: bool = False  # a Node source is configured; False -> episodes end kernel_only
    # Pod status reasons that mean "admission rejected it"; any "OutOf" prefix counts too.
    rejection_reasons: frozenset[str] = frozenset(
        {"OutOfcpu", "OutOfmemory", "UnexpectedAdmissionError", "NodeCapacityExceeded"})


def _resync_histograms() -> dict[tuple[Resource, Change], Histogram]:
    return {(r, c): Histogram(RESYNC_BUCKETS) for r in EPISODE_RESOURCES for c in Change}


def _readmission_histograms() -> dict[Resource, Histogram]:
    return {r: Histogram(RESYNC_BUCKETS) for r in EPISODE_RESOURCES}


@dataclass
class EpisodeStats:
    """Counters and histograms the metrics Collector renders.

    resync_*: node_resize_resync_{request_total,errors_total,duration_seconds};
    unplug_*, readmission_*: node_hot_unplug_{request_total,errors_total,
    readmission_duration_seconds,readmission_pods_total}; balloon_*: node_balloon_resize_*.
    Errors are counted per episode at its end, requests when it opens: errors <= requests.
    """

    resync_requests: Counter[Resource] = field(default_factory=Counter)
    resync_errors: Counter[tuple[Resource, str]] = field(default_factory=Counter)
    resync_duration: dict[tuple[Resource, Change], Histogram] = field(
        default_factory=_resync_histograms)
    unplug_requests: Counter[Resource] = field(default_factory=Counter)
    unplug_errors: Counter[tuple[Resource, str]] = field(default_factory=Counter)
    readmission_duration: dict[Resource, Histogram] = field(
        default_factory=_readmission_histograms)
    readmission_pods: Counter[tuple[str, str]] = field(default_factory=Counter)  # (outcome, reason)
    balloon_resizes: Counter[str] = field(default_factory=Counter)  # applied|deferred|...
    balloon_resize_duration: Histogram = field(default_factory=lambda: Histogram(RESYNC_BUCKETS))
    # Not in the metric catalogue; for logs and tests.
    episodes_ended: Counter[Outcome] = field(default_factory=Counter)
    malformed_events: int = 0  # events skipped (a timestamp that is not a finite number)


@dataclass
class _Track:
    """An open episode plus what the tracker needs to move it on."""

    ep: Episode
    last_end: float  # latest transition end: the coalescing window runs from here
    rejected: dict[str, PodOutcome] = field(default_factory=dict)
    last_change: float | None = None  # latest new pod rejection (readmission settle)
    after_fresh: bool = False  # kernel_after read from a snapshot taken after kernel_done

    @property
    def last_success_end(self) -> float | None:
        ends = [t.end for t in self.ep.transitions if t.result is Result.SUCCESS]
        return max(ends) if ends else None


def _event_time(event: object) -> float:
    return event.end if isinstance(event, Transition) else event.time  # type: ignore[attr-defined]


def _copy(ep: Episode) -> Episode:
    """A copy sinks may keep: the two lists are the only mutable parts. (dataclasses.replace
    re-runs __init__ field by field and was a fifth of the correlator's time.)"""
    new = object.__new__(Episode)
    new.__dict__.update(ep.__dict__)
    new.transitions = list(ep.transitions)
    new.pods = list(ep.pods)
    return new


def _describe_failures(transitions: list[Transition]) -> str:
    failed = [t for t in transitions if t.result is Result.FAILED]
    words = []
    for t in failed[:4]:
        what = f"{'cpu' if t.resource is Resource.CPU else 'memory block '}{t.unit} " \
               f"{t.direction.value} failed"
        why = " ".join(x for x in (
            f"cpuhp state {t.failed_state}" if t.failed_state else "", t.error or "") if x)
        words.append(f"{what}: {why}" if why else what)
    if len(failed) > 4:
        words.append(f"and {len(failed) - 4} more")
    return "; ".join(words)


class EpisodeTracker:
    def __init__(self, config: CorrelatorConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self.stats = EpisodeStats()
        self._open: dict[str, _Track] = {}
        self._snapshot: KernelSnapshot | None = None
        self._node = NodeView()
        self._pods = PodView()
        self._resizes = BalloonResizes()
        self._podresources: frozenset[int] | None = None
        self._drift_since: dict[Resource, float] = {}
        # Ids handed out lately, ended ones included: a flap within one microsecond
        # (online, offline, online) must not reuse the id of the episode it superseded.
        self._recent_order: deque[str] = deque(maxlen=_RECENT_IDS)
        self._recent_ids: set[str] = set()  # the same ids, for O(1) lookups
        self._handlers = {
            Transition: self._on_transition,
            KernelSnapshot: self._on_snapshot,
            NodeStatus: self._on_node,
            PodStatus: self._on_pod,
            PodsRelisted: self._on_relist,
            PodResourcesAllocatable: self._on_podresources,
        }

    # ------------------------------------------------------------ entry points

    def handle(self, event: object) -> list[EpisodeUpdate]:
        handler = self._handlers.get(type(event))
        if handler is None:
            return []
        when = _event_time(event)
        if not isinstance(when, (int, float)) or not math.isfinite(when):
            self.stats.malformed_events += 1
            return []
        # Deadlines that fell due before this event are decided first. min(): a stamp from the
        # future (a source's bad clock) must not fast-forward every open episode.
        updates = self._advance(min(float(when), self._clock.now()))
        return updates + handler(event)

    def tick(self) -> list[EpisodeUpdate]:
        return self._advance(self._clock.now())

    def resume(self, episodes: list[Episode]) -> None:
        """Re-open episodes a journal kept across a restart.

        The request is counted again: this process's counters start at zero, and an error
        counted for a resumed episode must stay a subset of the requests counted here.
        """
        for kept in episodes:
            if kept.outcome is not None or kept.phase is Phase.ENDED or kept.id in self._open:
                continue
            ep = _copy(kept)
            ep.pods = [p for p in ep.pods if p.outcome is PodVerdict.REJECTED]
            rejected = {p.uid: p for p in ep.pods}
            track = _Track(ep, last_end=max([t.end for t in ep.transitions], default=ep.opened),
                           rejected=rejected,
                           last_change=max((p.time for p in ep.pods), default=None))
            self._open[ep.id] = track
            self._remember_id(ep.id)
            self._count_request(ep)

    # ------------------------------------------------------------ gauges

    @property
    def episodes_open(self) -> int:
        return len(self._open)

    def open_episodes(self) -> list[Episode]:
        return [_copy(t.ep) for t in sorted(self._open.values(), key=lambda t: t.ep.opened)]

    def kubelet_capacity(self) -> dict[Resource, float]:
        status = self._node.status
        return {} if status is None else {r: float(v) for r, v in status.capacity.items()}

    def kubelet_allocatable(self) -> dict[Resource, float]:
        status = self._node.status
        return {} if status is None else {r: float(v) for r, v in status.allocatable.items()}

    def drift(self) -> dict[Resource, float]:
        snap = self._snapshot
        if snap is None:
            return {}
        return {r: snap.capacity(r) - kubelet for r, kubelet in self.kubelet_capacity().items()
                if self._kernel_reports(r)}

    def drift_seconds(self) -> dict[Resource, float]:
        now = self._clock.now()
        return {r: (max(0.0, now - self._drift_since[r]) if r in self._drift_since else 0.0)
                for r in self.drift()}

    def balloon_pods(self) -> int:
        return len(self._pods.balloons())

    def balloon_requests(self) -> dict[Resource, float]:
        return self._pods.balloon_requests()

    def effective(self) -> dict[Resource, float]:
        return subtract(self.kubelet_allocatable(), self.balloon_requests())

    def podresources_allocatable_cpus(self) -> int | None:
        return None if self._podresources is None else len(self._podresources)

    def podresources_offline_cpus(self) -> int | None:
        if self._podresources is None or self._snapshot is None:
            return None
        return len(self._podresources - self._snapshot.cpus_online)

    def enrich(self, t: Transition) -> None:
        """A duplicate carrying the kernel's own times (a BPF record after the uevent of the same
        transition won the race): the open episode keeps the better record. Counting is the
        ledger's business; this only replaces the record, so spans get the kernel's times."""
        if t.start is None:
            return
        for track in self._open.values():
            if track.ep.resource is not t.resource:
                continue
            for i, old in enumerate(track.ep.transitions):
                if (old.start is None and (old.unit, old.direction, old.result)
                        == (t.unit, t.direction, t.result)
                        and abs(old.end - t.end) < self._config.coalesce_window):
                    track.ep.transitions[i] = t
                    track.ep.opened = min(track.ep.opened, t.start)
                    return

    def _remember_id(self, ep_id: str) -> None:
        if len(self._recent_order) == self._recent_order.maxlen:
            self._recent_ids.discard(self._recent_order[0])
        self._recent_order.append(ep_id)
        self._recent_ids.add(ep_id)

    # ------------------------------------------------------------ kernel events

    def _on_transition(self, t: Transition) -> list[EpisodeUpdate]:
        if t.resource not in EPISODE_RESOURCES:
            return []
        if t.start is not None and not math.isfinite(t.start):
            self.stats.malformed_events += 1
            return []
        change = t.direction.change
        began = t.end if t.start is None else min(t.start, t.end)
        updates: list[EpisodeUpdate] = []
        for track in list(self._open.values()):
            # Only a change the kernel made supersedes: a refused opposite transition (EBUSY)
            # leaves the capacity, and so the open episode, as they were.
            if (track.ep.resource is t.resource and track.ep.change is not change
                    and t.result is Result.SUCCESS):
                if track.ep.kernel_done is None:
                    success_end = track.last_success_end
                    track.ep.kernel_done = track.last_end if success_end is None else success_end
                updates += self._end(track, Outcome.SUPERSEDED, max(began, track.ep.opened),
                                     f"superseded by a {change.value} of {t.resource.value}")
        joinable = [tr for tr in self._open.values()
                    if tr.ep.resource is t.resource and tr.ep.change is change
                    and tr.ep.phase is Phase.KERNEL
                    and t.end < tr.last_end + self._config.coalesce_window]
        if joinable:
            track = joinable[-1]
            track.ep.transitions.append(t)
            track.last_end = max(track.last_end, t.end)
            # Sources deliver out of order: a transition that began earlier widens the episode
            # (its id stays, so that a replay keeps it).
            track.ep.opened = min(track.ep.opened, began)
            self._note_kernel_after(track)
            return updates + [self._update(UpdateKind.TRANSITION, track, t.end)]
        ep_id = base_id = f"{t.resource.value}-{change.value}-{int(began * 1e6)}"
        n = 1
        while ep_id in self._open or ep_id in self._recent_ids:
            n += 1
            ep_id = f"{base_id}-{n}"
        self._remember_id(ep_id)
        snap = self._snapshot
        ep = Episode(
            id=ep_id, resource=t.resource, change=change, opened=began, transitions=[t],
            # A snapshot taken after the transition already shows its effect.
            kernel_before=snap.capacity(t.resource) if snap and snap.time <= began else None,
            kubelet_before=self._node.capacity(t.resource))
        track = self._open[ep_id] = _Track(ep, last_end=t.end)
        self._note_kernel_after(track)
        self._count_request(ep)
        return updates + [self._update(UpdateKind.OPENED, track, began)]

    def _on_snapshot(self, snap: KernelSnapshot) -> list[EpisodeUpdate]:
        self._snapshot = snap
        self._note_drift(snap.time)
        updates: list[EpisodeUpdate] = []
        for track in list(self._open.values()):
            self._note_kernel_after(track)
            updates += self._check_resync(track)
        return updates

    # ------------------------------------------------------------ Kubernetes events

    def _on_node(self, node: NodeStatus) -> list[EpisodeUpdate]:
        self._node.update(node)
        self._note_drift(node.time)
        updates: list[EpisodeUpdate] = []
        for track in list(self._open.values()):
            if track.ep.kubelet_before is None:
                # No Node seen when it opened: the first one is the baseline a mismatch moves from.
                track.ep.kubelet_before = self._node.capacity(track.ep.resource)
            updates += self._check_resync(track)
        return updates

    def _on_pod(self, pod: PodStatus) -> list[EpisodeUpdate]:
        prev = self._pods.get(pod.uid)
        reason = rejection(prev, pod, self._config.rejection_reasons)
        updates: list[EpisodeUpdate] = []
        if reason is not None:
            for track in list(self._open.values()):
                updates += self._note_rejection(track, pod, reason)
        self._pods.apply(pod)
        for result, duration in self._resizes.observe(pod):
            self.stats.balloon_resizes[result] += 1
            if duration is not None:
                self.stats.balloon_resize_duration.observe(duration)
        return updates

    def _on_relist(self, relist: PodsRelisted) -> list[EpisodeUpdate]:
        for uid in self._pods.relist(relist.uids):
            self._resizes.forget(uid)
        return []

    def _on_podresources(self, alloc: PodResourcesAllocatable) -> list[EpisodeUpdate]:
        # An empty list is what a kubelet without the static CPU manager returns: not reported.
        self._podresources = alloc.cpu_ids or None
        return []

    # ------------------------------------------------------------ time

    def _advance(self, upto: float) -> list[EpisodeUpdate]:
        updates: list[EpisodeUpdate] = []
        for track in list(self._open.values()):
            updates += self._advance_one(track, upto)
        return updates

    def _advance_one(self, track: _Track, upto: float) -> list[EpisodeUpdate]:
        ep, cfg = track.ep, self._config
        updates: list[EpisodeUpdate] = []
        if ep.phase is Phase.KERNEL and upto >= track.last_end + cfg.coalesce_window:
            updates += self._close_kernel(track)
            # Just entered RESYNC: the Node may already agree. (Later, only a Node or kernel
            # snapshot can change that, and their handlers check: not every event re-checks.)
            updates += self._check_resync(track) if cfg.kubernetes else []
        if ep.phase in (Phase.RESYNC, Phase.READMISSION) and not cfg.kubernetes:
            # A resumed episode from a run that had a Node source.
            return updates + self._end(track, Outcome.KERNEL_ONLY, ep.kernel_done or ep.opened,
                                       "no Kubernetes source configured")
        if ep.phase is Phase.RESYNC:
            assert ep.kernel_done is not None
            deadline = ep.kernel_done + cfg.resync_deadline
            moved = self._mismatch_since(track)
            settled = None if moved is None else max(moved + cfg.readmission_settle,
                                                      ep.kernel_done)
            if settled is not None and settled <= min(upto, deadline):
                updates += self._end_mismatch(track, settled)
            elif upto >= deadline:
                if moved is not None:
                    updates += self._end_mismatch(track, deadline)
                else:
                    ep.kubelet_after = self._node.capacity(ep.resource)
                    updates += self._end(track, Outcome.RESYNC_TIMEOUT, deadline,
                                         f"Node capacity {ep.resource.value} "
                                         f"{_num(ep.kubelet_after)} did not reach the kernel's "
                                         f"{_num(self._kernel_now(ep))} within "
                                         f"{cfg.resync_deadline:g} s")
        if ep.phase is Phase.READMISSION:
            assert ep.resynced is not None
            since = max(ep.resynced, track.last_change or ep.resynced)
            if upto >= since + cfg.readmission_settle:
                updates += self._settle(track, since)
        return updates

    # ------------------------------------------------------------ phases

    def _close_kernel(self, track: _Track) -> list[EpisodeUpdate]:
        ep = track.ep
        success_end = track.last_success_end
        ep.kernel_done = track.last_end if success_end is None else success_end
        self._note_kernel_after(track)
        if success_end is None:
            return self._end(track, Outcome.KERNEL_FAILED, ep.kernel_done,
                             _describe_failures(ep.transitions))
        if not self._config.kubernetes:
            return self._end(track, Outcome.KERNEL_ONLY, ep.kernel_done,
                             "no Kubernetes source configured")
        ep.phase = Phase.RESYNC
        return [self._update(UpdateKind.KERNEL_DONE, track, ep.kernel_done)]

    def _check_resync(self, track: _Track) -> list[EpisodeUpdate]:
        ep = track.ep
        if ep.phase is not Phase.RESYNC:
            return []
        assert ep.kernel_done is not None
        kubelet, kernel = self._node.capacity(ep.resource), self._kernel_now(ep)
        if kubelet is None or kernel is None or not self._within(ep.resource, kubelet, kernel):
            return []
        # An update delivered before the kernel phase closed still counts (a fast kubelet).
        ep.resynced = max(ep.kernel_done, self._node.since[ep.resource])
        ep.kubelet_after = kubelet
        self.stats.resync_duration[(ep.resource, ep.change)].observe(ep.resynced - ep.kernel_done)
        updates = [self._update(UpdateKind.RESYNCED, track, ep.resynced)]
        if ep.change is Change.INCREASE:
            return updates + self._end(track, Outcome.CONVERGED, ep.resynced,
                                       f"Node capacity {ep.resource.value} {_num(kubelet)}")
        ep.phase = Phase.READMISSION
        return updates

    def _mismatch_since(self, track: _Track) -> float | None:
        """When the kubelet moved to a value that is not the kernel's, if it did."""
        ep = track.ep
        kubelet, kernel = self._node.capacity(ep.resource), self._kernel_now(ep)
        if kubelet is None or kernel is None or self._within(ep.resource, kubelet, kernel):
            return None
        if ep.kubelet_before is None or self._within(ep.resource, kubelet, ep.kubelet_before):
            return None  # it never moved: that is a (pending) timeout, not a mismatch
        return max(self._node.since[ep.resource], ep.opened)

    def _end_mismatch(self, track: _Track, at: float) -> list[EpisodeUpdate]:
        ep = track.ep
        ep.kubelet_after = self._node.capacity(ep.resource)
        return self._end(track, Outcome.MISMATCH, at,
                         f"Node capacity {ep.resource.value} settled on {_num(ep.kubelet_after)}, "
                         f"the kernel has {_num(self._kernel_now(ep))}")

    def _note_rejection(self, track: _Track, pod: PodStatus, reason: str
                        ) -> list[EpisodeUpdate]:
        ep = track.ep
        if ep.change is not Change.DECREASE or not reason_concerns(reason, ep.resource):
            return []
        since = ep.kernel_done if ep.phase is not Phase.KERNEL else track.last_success_end
        if since is None or pod.time < since:
            return []
        outcome = PodOutcome(pod.time, pod.namespace, pod.name, pod.uid, PodVerdict.REJECTED,
                             reason)
        known = track.rejected.get(pod.uid)
        if known is not None:
            # A pod seen NotReady first and then Failed OutOfcpu: keep the telling reason, but
            # it is the same rejection (no new change, no second count).
            if known.reason == "NotReady" and reason != "NotReady":
                outcome = replace(outcome, time=known.time)
                track.rejected[pod.uid] = outcome
                ep.pods = [p for p in ep.pods if p.uid != pod.uid] + [outcome]
            return []
        track.rejected[pod.uid] = outcome
        track.last_change = pod.time if track.last_change is None else max(track.last_change,
                                                                            pod.time)
        ep.pods.append(outcome)
        return [self._update(UpdateKind.POD, track, pod.time)]

    def _settle(self, track: _Track, settled: float) -> list[EpisodeUpdate]:
        ep = track.ep
        assert ep.kernel_done is not None
        ep.readmission_settled = settled
        self.stats.readmission_duration[ep.resource].observe(settled - ep.kernel_done)
        ep.pods.extend(PodOutcome(settled, pod.namespace, pod.name, pod.uid, PodVerdict.KEPT,
                                  "Running")
                       for pod in self._pods.active() if pod.uid not in track.rejected)
        for p in ep.pods:
            self.stats.readmission_pods[(p.outcome.value, p.reason)] += 1
        if track.rejected:
            self.stats.unplug_errors[(ep.resource, "readmission_rejected")] += 1
        kept = len(ep.pods) - len(track.rejected)
        return self._end(track, Outcome.CONVERGED, settled,
                         f"readmission: {kept} pods kept, {len(track.rejected)} rejected")

    def _end(self, track: _Track, outcome: Outcome, at: float, detail: str
             ) -> list[EpisodeUpdate]:
        ep = track.ep
        ep.outcome, ep.ended, ep.phase = outcome, at, Phase.ENDED
        failed = sum(1 for t in ep.transitions if t.result is Result.FAILED)
        if failed and outcome is not Outcome.KERNEL_FAILED:
            detail += f" ({failed} of {len(ep.transitions)} transitions failed: " \
                      f"{_describe_failures(ep.transitions)})"
        ep.detail = detail
        reason = _ERROR_REASON.get(outcome)
        if reason is not None:
            errors = (self.stats.resync_errors if ep.change is Change.INCREASE
                      else self.stats.unplug_errors)
            errors[(ep.resource, reason)] += 1
        self.stats.episodes_ended[outcome] += 1
        del self._open[ep.id]
        return [self._update(UpdateKind.ENDED, track, at)]

    # ------------------------------------------------------------ helpers

    def _count_request(self, ep: Episode) -> None:
        if ep.change is Change.INCREASE:
            self.stats.resync_requests[ep.resource] += 1
        else:
            self.stats.unplug_requests[ep.resource] += 1

    def _update(self, kind: UpdateKind, track: _Track, when: float) -> EpisodeUpdate:
        return EpisodeUpdate(kind, _copy(track.ep), when)

    def _kernel_now(self, ep: Episode) -> float | None:
        """The kernel's capacity, from a snapshot taken after the kernel phase (else unknown).

        A snapshot older than kernel_done does not show the change yet and would match the
        Node's stale value: the very thing this exporter exists to catch.
        """
        snap = self._snapshot
        if snap is None or ep.kernel_done is None or snap.time < ep.kernel_done:
            return None
        return snap.capacity(ep.resource)

    def _note_kernel_after(self, track: _Track) -> None:
        snap, ep = self._snapshot, track.ep
        if snap is None or track.after_fresh:
            return
        if ep.phase is Phase.KERNEL or snap.time >= (ep.kernel_done or math.inf):
            ep.kernel_after = snap.capacity(ep.resource)
            track.after_fresh = ep.kernel_done is not None and snap.time >= ep.kernel_done

    def _note_drift(self, when: float) -> None:
        drift = self.drift()
        for resource in list(self._drift_since):
            if resource not in drift or self._within(resource, drift[resource], 0.0):
                del self._drift_since[resource]
        for resource, value in drift.items():
            if not self._within(resource, value, 0.0):
                self._drift_since.setdefault(resource, when)

    def _within(self, resource: Resource, a: float, b: float) -> bool:
        tolerance = (self._config.cpu_tolerance_cores if resource is Resource.CPU
                     else self._config.memory_tolerance_bytes)
        return abs(a - b) <= tolerance + 1e-9

    def _kernel_reports(self, resource: Resource) -> bool:
        snap = self._snapshot
        if snap is None:
            return False
        return resource in (Resource.CPU, Resource.MEMORY, Resource.SWAP) \
            or resource in snap.hugepages_bytes


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"
