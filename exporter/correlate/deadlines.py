"""When each open episode's next decision falls due, kept current as the node view moves.

The tracker decides an episode only when its deadline entry pops (index.OpenEpisodes), so an
entry must never be later than the decision it stands for. Both read next_decision(), the one
statement of when each decision falls due. Most decisions depend on the
episode alone (coalescing window, resync deadline, readmission settle) and only move later.
A mismatch (the kubelet settled on a value that is not the kernel's) also depends on the view,
and comes forward only when the kubelet's value moves, when the Node and the kernel come apart,
or for an episode the latest snapshot is the first to postdate: view_moved() reschedules those,
and only those, so a Node heartbeat or a snapshot that changes nothing costs nothing per open
episode. Pure, like the rest of the correlator.
"""
from __future__ import annotations

import enum
import math
from typing import NamedTuple

from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.index import OpenEpisodes, Track, by_seq
from exporter.correlate.model import Episode, Phase
from exporter.correlate.node_view import NodeView
from exporter.events import Resource

# Resources a kernel Transition can be about (per CPU, per memory block).
EPISODE_RESOURCES = (Resource.CPU, Resource.MEMORY)


class Decide(enum.Enum):
    """What an open episode has to decide next, once its time comes."""

    CLOSE_KERNEL = "close_kernel"  # the coalescing window ran out: the kernel phase is done
    KERNEL_ONLY = "kernel_only"  # no Node source any more: end it without judging a resync
    MISMATCH = "mismatch"  # the kubelet settled on a value that is not the kernel's
    RESYNC_TIMEOUT = "resync_timeout"  # no resync within the deadline
    SETTLE = "settle"  # readmission: no pod changed for the settle window
    NOTHING = "nothing"  # ended


class Decision(NamedTuple):
    due: float  # when it falls due: the heap's key (-inf: at once, inf: never)
    decide: Decide
    at: float  # the instant it is recorded at (a settle: the last pod change)


_NOTHING = Decision(math.inf, Decide.NOTHING, math.inf)


class Deadlines:
    def __init__(self, config: CorrelatorConfig, view: NodeView, open_: OpenEpisodes) -> None:
        self._config = config
        self._view = view
        self._open = open_
        # What the view said per resource when last looked at.
        self._seen_since: dict[Resource, float | None] = {}
        self._seen_apart: dict[Resource, bool] = {}
        # How many times an episode's next decision was worked out: an event that changes
        # nothing for an episode must not add to it (tests count it, the bench times it).
        self.looked_at = 0

    def schedule(self, track: Track) -> None:
        self._open.schedule(track, self.next_decision(track).due)

    def _forget_seen(self, resource: Resource | None = None) -> None:
        """Forget what was seen of one resource (None: of all) while nothing of it waits, so
        that the next episode to wait is looked at again on the next change (an extra look,
        never a missed one)."""
        if resource is None:
            self._seen_since.clear()
            self._seen_apart.clear()
        else:
            self._seen_since.pop(resource, None)
            self._seen_apart.pop(resource, None)

    def entered_resync(self, track: Track) -> None:
        """The track is now waiting for a resync: if no snapshot postdates its kernel phase
        yet, the first that does must look at it again."""
        if self._open.waiting == 1:
            # The first to wait: the tracker does not call view_moved() while nothing waits.
            self._forget_seen()
        if self.kernel_now(track.ep) is None:
            self._open.kernel_unknown(track)

    def next_decision(self, track: Track) -> Decision:
        """The track's next timed decision, given the state now: the one rule both the heap
        (schedule) and the tracker (EpisodeTracker.advance) read, so that a window changed
        here moves both."""
        ep, cfg = track.ep, self._config
        self.looked_at += 1
        if ep.phase is Phase.KERNEL:
            due = track.last_end + cfg.coalesce_window
            return Decision(due, Decide.CLOSE_KERNEL, due)
        if ep.phase is Phase.ENDED:
            return _NOTHING
        if not cfg.kubernetes:
            # A resumed episode from a run that had a Node source: at once.
            return Decision(-math.inf, Decide.KERNEL_ONLY, ep.kernel_done or ep.opened)
        if ep.phase is Phase.RESYNC:
            assert ep.kernel_done is not None
            deadline = ep.kernel_done + cfg.resync_deadline
            moved = self.mismatch_since(track)
            if moved is None:
                return Decision(deadline, Decide.RESYNC_TIMEOUT, deadline)
            settled = min(max(moved + cfg.readmission_settle, ep.kernel_done), deadline)
            return Decision(settled, Decide.MISMATCH, settled)
        assert ep.resynced is not None
        # Settled when no pod changed for readmission_settle: decided then, dated at the
        # last change.
        since = max(ep.resynced, track.last_change or ep.resynced)
        return Decision(since + cfg.readmission_settle, Decide.SETTLE, since)

    def view_moved(self, regressed: bool = False) -> list[Track]:
        """After a Node update or a kernel snapshot: reschedule what the new view may bring
        forward, and return the episodes waiting for a resync of a resource on which Node and
        kernel now agree, in opening order (each of them resyncs, bar the few the latest
        snapshot predates). `regressed`: a snapshot stamped before the one it replaced."""
        snap = self._view.snapshot
        if not self._open.waiting:
            self._forget_seen()
            return []
        agreeing: list[Track] = []
        for r in EPISODE_RESOURCES:
            waiting = self._open.resyncing(r)
            if not waiting:
                self._forget_seen(r)
                continue
            kubelet = self._view.kubelet(r)
            kernel = None if snap is None else snap.capacity(r)
            known = kubelet is not None and kernel is not None
            apart = kubelet is not None and kernel is not None and \
                not self._config.within(r, kubelet, kernel)
            since = self._view.node.since.get(r) if kubelet is not None else None
            moved = since != self._seen_since.get(r) or (apart and not self._seen_apart.get(r))
            self._seen_since[r], self._seen_apart[r] = since, apart
            if regressed:  # stamped before the last snapshot: some lose their kernel value
                for track in waiting:
                    if self.kernel_now(track.ep) is None:
                        self._open.kernel_unknown(track)
            for track in self._open.kernel_unknown_of(r):
                if self.kernel_now(track.ep) is not None:
                    self._open.kernel_known(track)
                    self.schedule(track)
            if known and not apart:
                agreeing += waiting
            elif moved:
                for track in waiting:
                    self.schedule(track)
        return by_seq(agreeing) if agreeing else agreeing

    def mismatch_since(self, track: Track) -> float | None:
        """When the kubelet moved to a value that is not the kernel's, if it did."""
        ep = track.ep
        kubelet, kernel = self._view.kubelet(ep.resource), self.kernel_now(ep)
        within = self._config.within
        if kubelet is None or kernel is None or within(ep.resource, kubelet, kernel):
            return None
        if ep.kubelet_before is None or within(ep.resource, kubelet, ep.kubelet_before):
            return None  # it never moved: that is a (pending) timeout, not a mismatch
        return max(self._view.kubelet_since(ep.resource), ep.opened)

    def kernel_now(self, ep: Episode) -> float | None:
        """The kernel's capacity, from a snapshot taken after the kernel phase (else unknown).

        A snapshot older than kernel_done does not show the change yet and would match the
        Node's stale value: the very thing this exporter exists to catch.
        """
        snap = self._view.snapshot
        if snap is None or ep.kernel_done is None or snap.time < ep.kernel_done:
            return None
        return snap.capacity(ep.resource)
