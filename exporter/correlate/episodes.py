"""The episode state machine: kernel transitions joined with what the kubelet says, as episodes.

Pure: the Correlator hands it events in order, after the NodeView has taken them in (a pod
comes with the view's record of it from before: on_pod), and it returns EpisodeUpdates. It
keeps no statistics and no gauges: the metrics sink counts from the updates, the gauges are
the NodeView's. Every timed decision (coalescing window, resync deadline, mismatch and
readmission settle windows; when each falls due is Deadlines.next_decision) is taken at the
instant it falls due, not when tick() happens to run: before an event is applied the state is
advanced to that event's time, so the outcome does not depend on the tick rate and a replay of
the same events gives the same episodes. The README's "Episodes and the Kubernetes join"
describes them.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.deadlines import EPISODE_RESOURCES, Deadlines, Decide, Decision
from exporter.correlate.detail_words import describe_failures, flap_words
from exporter.correlate.ids import IdMaker
from exporter.correlate.index import TRANSITIONS_KEPT, Kind, OpenEpisodes, Track, by_seq
from exporter.correlate.kube_view import reason_concerns, rejection
from exporter.correlate.model import (
    Episode,
    EpisodeUpdate,
    Outcome,
    Phase,
    PodOutcome,
    PodVerdict,
    UpdateKind,
)
from exporter.correlate.node_view import NodeView
from exporter.events import Change, Direction, PodStatus, Resource, Result, Transition
from exporter.words import amount, count

__all__ = ["CorrelatorConfig", "EpisodeTracker", "EPISODE_RESOURCES"]

UPDATE_EVERY = TRANSITIONS_KEPT // 2  # a long storm's TRANSITION updates (on_transition)
_RECENT_IDS = 256  # bounded memory; a collision needs two opens in one microsecond anyway
_OPPOSITE = {Change.INCREASE: Change.DECREASE, Change.DECREASE: Change.INCREASE}
_SUPERSEDED = {(r, c): f"superseded by {'an' if c is Change.INCREASE else 'a'} {c.value} of "
                       f"{r.value}" for r in Resource for c in Change}


STATUS_TIME_SLACK = 1.0  # s: managedFields times are truncated to the second


def _judged_at(pod: PodStatus, since: float, delivered: float) -> float:
    """When the kubelet judged a pod: the status time the object gives, kept between the
    kernel's end and the delivery (it is truncated to the second); the delivery time when the
    object does not say (one relist delivers every pod at once) or says a time this rejection
    cannot have (before the kernel was done, after the delivery: another clock, a replay)."""
    written = pod.status_time
    if written is None or not since - STATUS_TIME_SLACK <= written <= delivered + \
            STATUS_TIME_SLACK:
        return delivered
    return min(delivered, max(since, written))


def _kept_at(pod: PodStatus, since: float, settled: float) -> float:
    """A kept pod is judged when readmission settles, unless the kubelet wrote its status
    during the episode (a restarted kubelet admitting it again): then at that write."""
    if pod.status_time is not None and since <= pod.status_time <= settled:
        return pod.status_time
    return settled


class EpisodeTracker:
    def __init__(self, config: CorrelatorConfig, view: NodeView) -> None:
        self._config = config
        self._view = view  # read only: the Correlator feeds it
        self._open = OpenEpisodes()
        # Ids handed out lately, ended ones included: a flap within one microsecond
        # (online, offline, online) must not reuse the id of the episode it superseded.
        self._recent_order: deque[str] = deque(maxlen=_RECENT_IDS)
        self._recent_ids: set[str] = set()  # the same ids, for O(1) lookups
        self._ids = IdMaker()
        self._deadlines = Deadlines(config, view, self._open)
        self._resync_checks = 0
        # When the earliest deadline falls due (inf: none), for a caller's "anything due?" test.
        self.next_due = self._open.next_due

    # ------------------------------------------------------------ entry points

    def advance(self, upto: float) -> list[EpisodeUpdate]:
        """Decide every deadline that falls due at or before `upto`, at its own instant."""
        due = self._open.pop_due(upto)
        if not due:
            return []
        updates: list[EpisodeUpdate] = []
        for track in due:
            updates += self._decide_due(track, upto)
            self._deadlines.schedule(track)
        return updates

    def resume(self, episodes: list[Episode], now: float) -> list[EpisodeUpdate]:
        """Re-open episodes a journal kept across a restart; one RESUMED update each.

        The metrics sink counts a RESUMED episode as a request again: this process's counters
        start at zero, and an error counted for it must stay a subset of the requests here.
        """
        updates = []
        for kept in episodes:
            if kept.outcome is not None or kept.phase is Phase.ENDED or kept.id in self._open:
                continue
            ep = kept.copy()
            ep.pods = [p for p in ep.pods if p.outcome is PodVerdict.REJECTED]
            rejected = {p.uid: p for p in ep.pods}
            track = Track(ep, last_end=max([t.end for t in ep.transitions], default=ep.opened),
                          kind=(ep.resource, ep.change), rejected=rejected,
                          last_change=max((p.time for p in ep.pods), default=None))
            self._add(track)
            self._remember_id(ep.id)
            updates.append(EpisodeUpdate(UpdateKind.RESUMED, ep.copy(), now))
        return updates

    @property
    def looked_at(self) -> int:
        """How often an episode's next decision or its resync was looked at: the work done per
        open episode (an event that concerns none of them adds nothing; tests count it)."""
        return self._deadlines.looked_at + self._resync_checks

    @property
    def episodes_open(self) -> int:
        return len(self._open)

    def open_episodes(self) -> list[Episode]:
        return [self._shown(t).copy()
                for t in sorted(self._open.tracks(), key=lambda t: t.ep.opened)]

    def enrich(self, t: Transition) -> None:
        """A duplicate carrying the kernel's own times (a BPF record after the uevent of the same
        transition won the race): the open episode keeps the better record. Counting is the
        ledger's business; this only replaces the record, so spans get the kernel's times."""
        if t.start is None:
            return
        # In a flap storm one episode holds many records of the same transition (cpu1 offline,
        # ...): the duplicate is the one whose end is nearest its own.
        best: tuple[float, Track, Transition] | None = None
        for track, old in self._open.startless(t):
            gap = abs(old.end - t.end)
            if gap < self._config.coalesce_window and (best is None or gap < best[0]):
                best = (gap, track, old)
        if best is not None:
            _, track, old = best
            self._open.replace(track, old, t)
            track.ep.opened = min(track.ep.opened, t.start)
            # (A kernel-phase deadline runs from last_end.)
            if track.ep.phase is not Phase.KERNEL:
                self._deadlines.schedule(track)  # an earlier opening may bring one forward

    def _remember_id(self, ep_id: str) -> None:
        if len(self._recent_order) == self._recent_order.maxlen:
            self._recent_ids.discard(self._recent_order[0])
        self._recent_order.append(ep_id)
        self._recent_ids.add(ep_id)

    # ------------------------------------------------------------ events (state already advanced)

    def on_transition(self, t: Transition) -> list[EpisodeUpdate]:
        resource = t.resource
        if resource not in EPISODE_RESOURCES:
            return []
        change = t.direction.change
        began = t.end if t.start is None else min(t.start, t.end)
        kind = (resource, change)
        window = self._config.coalesce_window
        # A flap: an opposite change while an episode is still in its kernel phase joins it
        # (README, "Flap storms"), so a storm of offline/online cycles is one episode with its
        # counts, not one superseded episode per transition. A refused transition starts no
        # flap (the capacity did not move), but joins one already going.
        flapped = self._open.joinable((resource, _OPPOSITE[change]), t.end, window)
        if flapped is not None and t.result is not Result.SUCCESS and not flapped.ep.flapping:
            flapped = None
        # Only a change the kernel made supersedes: a refused opposite transition (EBUSY)
        # leaves the capacity, and so the open episode, as they were.
        updates = self._supersede(t, kind, flapped, began) if t.result is Result.SUCCESS else []
        joined = flapped or self._open.joinable(kind, t.end, window)
        if joined is not None:
            updates += self._join(joined, t, began)
        else:
            updates.append(self._open_episode(t, kind, began))
        return updates

    def _supersede(self, t: Transition, kind: Kind, flapped: Track | None, began: float
                   ) -> list[EpisodeUpdate]:
        """End the open episodes of the opposite change (bar the flap `t` joins)."""
        updates = []
        for track in self._open.of_kind((t.resource, _OPPOSITE[kind[1]])):
            if track is flapped:
                continue
            if track.ep.kernel_done is None:
                success_end = track.success_end
                track.ep.kernel_done = track.last_end if success_end is None else success_end
            updates.append(self._end(track, Outcome.SUPERSEDED, max(began, track.ep.opened),
                                     _SUPERSEDED[kind]))
        return updates

    def _join(self, joined: Track, t: Transition, began: float) -> list[EpisodeUpdate]:
        self._open.append(joined, t)
        # Sources deliver out of order: a transition that began earlier widens the episode
        # (its id stays, so that a replay keeps it).
        joined.ep.opened = min(joined.ep.opened, began)
        self._note_kernel_after(joined)
        # Past its sample, a storm's episode goes out every UPDATE_EVERY transitions, not on
        # each: the journal rewrites its row that much less often (the counters count every
        # transition; its end has them all).
        seen = joined.ep.offline_transitions + joined.ep.online_transitions
        if seen <= TRANSITIONS_KEPT or seen % UPDATE_EVERY == 0:
            return [EpisodeUpdate(UpdateKind.TRANSITION, joined.ep.copy(), t.end)]
        return []

    def _open_episode(self, t: Transition, kind: Kind, began: float) -> EpisodeUpdate:
        resource, change = kind
        ep_id = base_id = self._ids.make(resource, change, began)
        n = 1
        while ep_id in self._open or ep_id in self._recent_ids:
            n += 1
            ep_id = f"{base_id}-{n}"
        self._remember_id(ep_id)
        snap = self._view.snapshot
        kernel = None if snap is None else snap.capacity(resource)
        ep = Episode(
            id=ep_id, resource=resource, change=change, opened=began, transitions=[t],
            offline_transitions=int(t.direction is Direction.OFFLINE),
            online_transitions=int(t.direction is Direction.ONLINE),
            # A snapshot taken after the transition already shows its effect.
            kernel_before=kernel if snap is not None and snap.time <= began else None,
            # In the kernel phase, the latest snapshot's (what _note_kernel_after sets).
            kernel_after=kernel, kubelet_before=self._view.kubelet(resource))
        track = Track(ep, last_end=t.end, kind=kind, following=snap is not None)
        self._open.add(track)
        self._deadlines.schedule(track)  # (_add, less the resync a new episode is not in)
        return EpisodeUpdate(UpdateKind.OPENED, ep.copy(), began)

    def on_snapshot(self, regressed: bool) -> list[EpisodeUpdate]:
        """`regressed`: the new snapshot is stamped before the one it replaced."""
        for track in self._open.stale():
            self._note_kernel_after(track)
        # While nothing waits, nothing can resync (and the deadlines have nothing to move).
        return self._resync_agreeing(regressed) if self._open.waiting else []

    def on_node(self) -> list[EpisodeUpdate]:
        for track in self._open.without_baseline():
            # No Node seen when it opened: the first one is the baseline a mismatch moves from.
            track.ep.kubelet_before = self._view.kubelet(track.ep.resource)
            if track.ep.kubelet_before is not None:
                self._open.baseline_known(track)
                self._deadlines.schedule(track)
        return self._resync_agreeing() if self._open.waiting else []

    def on_pod(self, pod: PodStatus, prev: PodStatus | None) -> list[EpisodeUpdate]:
        """`prev`: the view's record of this pod before this event (the view has it already)."""
        reason = rejection(prev, pod, self._config.rejection_reasons)
        if reason is None:
            return []
        updates: list[EpisodeUpdate] = []
        # Only a hot-unplug's readmission judges pods, and OutOfcpu only a CPU one.
        unplugs = [track for r in EPISODE_RESOURCES if reason_concerns(reason, r)
                   for track in self._open.of_kind((r, Change.DECREASE))]
        for track in by_seq(unplugs):
            updates += self._note_rejection(track, pod, reason)
        return updates

    # ------------------------------------------------------------ bookkeeping

    def _resync_agreeing(self, regressed: bool = False) -> list[EpisodeUpdate]:
        updates: list[EpisodeUpdate] = []
        for track in self._deadlines.view_moved(regressed):
            updates += self._check_resync(track)
            self._deadlines.schedule(track)
        return updates

    def _add(self, track: Track) -> None:
        self._open.add(track)
        if track.ep.phase is Phase.RESYNC:
            self._deadlines.entered_resync(track)
        self._deadlines.schedule(track)

    # ------------------------------------------------------------ time

    def _decide_due(self, track: Track, upto: float) -> list[EpisodeUpdate]:
        """Take every decision of the track that falls due at or before `upto`, each at its own
        instant (closing the kernel phase may resync it at once, and a resync start the
        readmission window: one look can take several)."""
        updates: list[EpisodeUpdate] = []
        while True:
            decision = self._deadlines.next_decision(track)
            if decision.due > upto:
                return updates
            updates += self._decide(track, decision)

    def _decide(self, track: Track, decision: Decision) -> list[EpisodeUpdate]:
        ep, at = track.ep, decision.at
        what = decision.decide
        if what is Decide.CLOSE_KERNEL:
            updates = self._close_kernel(track)
            if self._config.kubernetes:
                # Just entered RESYNC: the Node may already agree. (Later, only a Node or kernel
                # snapshot can change that, and their handlers check: not every event re-checks.)
                updates += self._check_resync(track)
            return updates
        if what is Decide.KERNEL_ONLY:  # a resumed episode from a run that had a Node source
            return [self._end(track, Outcome.KERNEL_ONLY, at, "no Kubernetes source configured")]
        if what is Decide.MISMATCH:
            return [self._end_mismatch(track, at)]
        if what is Decide.RESYNC_TIMEOUT:
            ep.kubelet_after = self._view.kubelet(ep.resource)
            kernel = amount(ep.resource, self._deadlines.kernel_now(ep))
            return [self._end(
                track, Outcome.RESYNC_TIMEOUT, at,
                f"Node capacity {ep.resource.value} {amount(ep.resource, ep.kubelet_after)} did "
                f"not reach the kernel's {kernel} within {self._config.resync_deadline:g} s")]
        if what is Decide.SETTLE:
            return [self._settle(track, at)]
        return []

    # ------------------------------------------------------------ phases

    def _close_kernel(self, track: Track) -> list[EpisodeUpdate]:
        ep = track.ep
        success_end = track.success_end
        ep.kernel_done = track.last_end if success_end is None else success_end
        self._note_kernel_after(track)
        if success_end is None:
            return [self._end(track, Outcome.KERNEL_FAILED, ep.kernel_done,
                              describe_failures(ep.transitions))]
        if not self._config.kubernetes:
            return [self._end(track, Outcome.KERNEL_ONLY, ep.kernel_done,
                              "no Kubernetes source configured")]
        self._open.set_phase(track, Phase.RESYNC)
        self._deadlines.entered_resync(track)
        return [EpisodeUpdate(UpdateKind.KERNEL_DONE, ep.copy(), ep.kernel_done)]

    def _check_resync(self, track: Track) -> list[EpisodeUpdate]:
        ep = track.ep
        self._resync_checks += 1
        if ep.phase is not Phase.RESYNC:
            return []
        assert ep.kernel_done is not None
        kubelet, kernel = self._view.kubelet(ep.resource), self._deadlines.kernel_now(ep)
        within = self._config.within
        if kubelet is None or kernel is None or not within(ep.resource, kubelet, kernel):
            return []
        # An update delivered before the kernel phase closed still counts (a fast kubelet).
        ep.resynced = max(ep.kernel_done, self._view.kubelet_since(ep.resource))
        ep.kubelet_after = kubelet
        updates = [EpisodeUpdate(UpdateKind.RESYNCED, ep.copy(), ep.resynced)]
        if ep.change is Change.INCREASE:
            updates.append(self._end(track, Outcome.CONVERGED, ep.resynced,
                                     f"Node capacity {ep.resource.value} "
                                     f"{amount(ep.resource, kubelet)}"))
            return updates
        self._open.set_phase(track, Phase.READMISSION)
        return updates

    def _end_mismatch(self, track: Track, at: float) -> EpisodeUpdate:
        ep = track.ep
        ep.kubelet_after = self._view.kubelet(ep.resource)
        return self._end(track, Outcome.MISMATCH, at,
                         f"Node capacity {ep.resource.value} settled on "
                         f"{amount(ep.resource, ep.kubelet_after)}, the kernel has "
                         f"{amount(ep.resource, self._deadlines.kernel_now(ep))}")

    def _note_rejection(self, track: Track, pod: PodStatus, reason: str
                        ) -> list[EpisodeUpdate]:
        ep = track.ep
        if ep.change is not Change.DECREASE or not reason_concerns(reason, ep.resource):
            return []
        since = ep.kernel_done if ep.phase is not Phase.KERNEL else track.success_end
        if since is None or pod.time < since:
            return []
        outcome = PodOutcome(_judged_at(pod, since, pod.time), pod.namespace, pod.name,
                             pod.uid, PodVerdict.REJECTED, reason)
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
        return [EpisodeUpdate(UpdateKind.POD, self._shown(track).copy(), pod.time)]

    def _settle(self, track: Track, settled: float) -> EpisodeUpdate:
        ep = track.ep
        assert ep.kernel_done is not None
        ep.readmission_settled = settled
        ep.pods.extend(PodOutcome(_kept_at(pod, ep.kernel_done, settled), pod.namespace,
                                  pod.name, pod.uid, PodVerdict.KEPT, "Running")
                       for pod in self._view.active_pods() if pod.uid not in track.rejected)
        kept = len(ep.pods) - len(track.rejected)
        return self._end(track, Outcome.CONVERGED, settled,
                         f"readmission: {count(kept, 'pod')} kept, {len(track.rejected)} rejected")

    def _end(self, track: Track, outcome: Outcome, at: float, detail: str) -> EpisodeUpdate:
        ep = self._shown(track) if track.following else track.ep
        self._open.remove(track)
        ep.outcome, ep.ended, ep.phase = outcome, at, Phase.ENDED
        if track.failed and outcome is not Outcome.KERNEL_FAILED:
            detail += f" ({track.failed} of {ep.transitions_seen} transitions failed: " \
                      f"{describe_failures(ep.transitions)})"
        if ep.flapping:
            detail += f" ({flap_words(ep)})"
        ep.detail = detail
        # Final, and no index holds it any more: nothing changes it after this, so the update
        # carries the episode itself, not a copy.
        return EpisodeUpdate(UpdateKind.ENDED, ep, at)

    # ------------------------------------------------------------ helpers

    def _note_kernel_after(self, track: Track) -> None:
        snap, ep = self._view.snapshot, track.ep
        if snap is None or track.after_fresh:
            return
        if ep.phase is Phase.KERNEL or snap.time >= (ep.kernel_done or math.inf):
            ep.kernel_after = snap.capacity(ep.resource)
            if ep.kernel_done is not None and snap.time >= ep.kernel_done:
                self._open.fresh(track)
            else:
                # Until its kernel phase closes, every later snapshot's value would be written
                # here: _shown() reads it from the view instead, when it counts.
                self._open.follow(track, ep.phase is Phase.KERNEL and ep.kernel_done is None)

    def _shown(self, track: Track) -> Episode:
        """The track's episode, its kernel_after brought up to the latest snapshot if it follows
        it: call before the episode goes out (an update, open_episodes(), its end)."""
        ep = track.ep
        if track.following:
            snap = self._view.snapshot
            assert snap is not None  # following starts from a snapshot
            ep.kernel_after = snap.capacity(ep.resource)
        return ep
