"""The open episodes, indexed so that an event costs the same with 10 or 10,000 of them open.

Every question the tracker asks of the open episodes is answered from an index kept here, not
by a scan: which episodes an opposite transition supersedes (by resource and change), which
one a transition joins (those still in their kernel phase), which may resync now (those
waiting for it, per resource), which a kernel snapshot still has to date (not yet fresh), and
which deadline falls due next (a heap). Each index is ordered by `seq`, the order episodes were
opened (or resumed) in, so that updates come out in the order a scan of all of them gave.

A deadline entry may be early, never late: the tracker pushes one whenever an episode's next
decision may have moved earlier; one that pops with nothing to decide is simply re-pushed.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from exporter.correlate.model import Episode, Phase, PodOutcome
from exporter.events import Change, Direction, Resource, Result, Transition

Kind = tuple[Resource, Change]
# An episode keeps at most this many of its transitions: the first half, and the latest ones
# (a flap storm of 10,000 transitions holds 128). Every one is counted in the episode's
# offline_transitions / online_transitions; its tallies (success_end, failed) cover all.
TRANSITIONS_KEPT = 128
# What a transition is, bar its times: the key a duplicate with the kernel's times is found by.
TransitionKey = tuple[Resource, int, Direction, Result]


@dataclass(eq=False, slots=True)
class Track:
    """An open episode plus what the tracker needs to move it on."""

    ep: Episode
    last_end: float  # latest transition end: the coalescing window runs from here
    kind: Kind  # (ep.resource, ep.change), kept: the indexes' key, asked for on every event
    seq: int = 0  # opening order (set by OpenEpisodes.add)
    rejected: dict[str, PodOutcome] = field(default_factory=dict)
    last_change: float | None = None  # latest new pod rejection (readmission settle)
    after_fresh: bool = False  # kernel_after read from a snapshot taken after kernel_done
    # In its kernel phase, kernel_after is the latest snapshot's: rather than rewritten on every
    # snapshot, it is filled in when the episode is shown (EpisodeTracker._shown).
    following: bool = False
    scheduled: float = math.inf  # due time of this track's live heap entry (inf: none)
    closed: bool = False
    # Kept by OpenEpisodes as transitions come (add, append, replace) rather than found by a
    # scan of them when asked (on every supersede and every end):
    success_end: float | None = None  # latest end of a transition the kernel completed
    failed: int = 0  # transitions the kernel refused


def by_seq(tracks: Iterable[Track]) -> list[Track]:
    return sorted(tracks, key=lambda t: t.seq)


def _key(t: Transition) -> TransitionKey:
    return (t.resource, t.unit, t.direction, t.result)


class OpenEpisodes:
    """The open episodes and every index over them. Only this class writes the indexes: the
    tracker and the deadlines ask questions and tell it what changed (add, remove, set_phase,
    follow, fresh, baseline_known, kernel_unknown, kernel_known, schedule), so the invariants
    live in one place."""

    def __init__(self) -> None:
        self._by_id: dict[str, Track] = {}
        self._seq = itertools.count()
        self._pushes = itertools.count()  # heap tie-break: tracks themselves are not ordered
        self._by_kind: dict[Kind, dict[int, Track]] = {}
        self._in_kernel: dict[Kind, dict[int, Track]] = {}  # phase KERNEL: may still be joined
        self._resync: dict[Resource, dict[int, Track]] = {}  # phase RESYNC
        self._waiting = 0  # how many are in phase RESYNC
        # RESYNC episodes the latest snapshot predates (no kernel capacity for them yet).
        self._unknown_kernel: dict[Resource, dict[int, Track]] = {}
        # kernel_after not yet from a snapshot after the kernel phase (and not following)
        self._stale: dict[int, Track] = {}
        self._no_baseline: dict[int, Track] = {}  # kubelet_before still unknown
        # Start-less records (uevent, sysfs) still in an episode's sample, keyed by
        # (seq, id(record)): the dict holds the record, so its id stays unique.
        self._startless: dict[TransitionKey, dict[tuple[int, int], tuple[Track, Transition]]] = {}
        self._heap: list[tuple[float, int, Track]] = []

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, ep_id: str) -> bool:
        return ep_id in self._by_id

    def tracks(self) -> list[Track]:
        return list(self._by_id.values())

    # ------------------------------------------------------------ membership

    def add(self, track: Track) -> None:
        track.seq = next(self._seq)
        ep = track.ep
        self._by_id[ep.id] = track
        self._by_kind.setdefault(track.kind, {})[track.seq] = track
        if not track.after_fresh and not track.following:
            self._stale[track.seq] = track
        if ep.kubelet_before is None:
            self._no_baseline[track.seq] = track
        for t in ep.transitions:
            self._take(track, t)
        self._enter(track, ep.phase)

    def remove(self, track: Track) -> None:
        """The episode ended: out of every index; its heap entries are skipped when they pop."""
        self._leave(track, track.ep.phase)
        track.closed = True
        ep, seq = track.ep, track.seq
        del self._by_id[ep.id]
        self._by_kind[track.kind].pop(seq, None)
        self._stale.pop(seq, None)
        self._no_baseline.pop(seq, None)
        for t in ep.transitions:
            if t.start is None:
                self._startless.get(_key(t), {}).pop((seq, id(t)), None)
        # Its heap entry stays until it pops (a heap cannot drop one from the middle); one at
        # the head goes now, or the next event would go through advance() only to skip it.
        heap = self._heap
        while heap and heap[0][2].closed:
            heapq.heappop(heap)

    def follow(self, track: Track, following: bool) -> None:
        """Whether the track's kernel_after follows the latest snapshot (or waits in `stale`
        for a snapshot to date it)."""
        if following:
            self._stale.pop(track.seq, None)
        elif track.following:
            self._stale[track.seq] = track
        track.following = following

    def fresh(self, track: Track) -> None:
        """The track's kernel_after is from a snapshot taken after its kernel phase: final, no
        later snapshot needs to look at it."""
        track.after_fresh = True
        track.following = False
        self._stale.pop(track.seq, None)

    def baseline_known(self, track: Track) -> None:
        """The track's kubelet_before is known now."""
        self._no_baseline.pop(track.seq, None)

    def kernel_unknown(self, track: Track) -> None:
        """A RESYNC track no snapshot postdates yet (the first that does must look at it)."""
        self._unknown_kernel.setdefault(track.ep.resource, {})[track.seq] = track

    def kernel_known(self, track: Track) -> None:
        self._unknown_kernel.get(track.ep.resource, {}).pop(track.seq, None)

    def set_phase(self, track: Track, phase: Phase) -> None:
        self._leave(track, track.ep.phase)
        track.ep.phase = phase
        self._enter(track, phase)

    def _enter(self, track: Track, phase: Phase) -> None:
        if phase is Phase.KERNEL:
            self._in_kernel.setdefault(track.kind, {})[track.seq] = track
        elif phase is Phase.RESYNC:
            self._resync.setdefault(track.ep.resource, {})[track.seq] = track
            self._waiting += 1

    def _leave(self, track: Track, phase: Phase) -> None:
        if phase is Phase.KERNEL:
            self._in_kernel.get(track.kind, {}).pop(track.seq, None)
        elif phase is Phase.RESYNC:
            del self._resync[track.ep.resource][track.seq]
            self._unknown_kernel.get(track.ep.resource, {}).pop(track.seq, None)
            self._waiting -= 1

    def append(self, track: Track, t: Transition) -> None:
        """A transition joins the track's episode: counted, and kept in its sample (the oldest
        of the latest ones makes room once the sample is full)."""
        ep = track.ep
        if t.direction is Direction.OFFLINE:
            ep.offline_transitions += 1
        else:
            ep.online_transitions += 1
        transitions = ep.transitions
        if len(transitions) >= TRANSITIONS_KEPT:
            dropped = transitions.pop(TRANSITIONS_KEPT // 2)
            if dropped.start is None:
                self._startless.get(_key(dropped), {}).pop((track.seq, id(dropped)), None)
        transitions.append(t)
        track.last_end = max(track.last_end, t.end)
        self._take(track, t)

    def _take(self, track: Track, t: Transition) -> None:
        """A transition of the track's episode: into its tallies and the start-less index."""
        if t.result is Result.SUCCESS:
            end = track.success_end
            track.success_end = t.end if end is None else max(end, t.end)
        elif t.result is Result.FAILED:
            track.failed += 1
        if t.start is None:
            self._startless.setdefault(_key(t), {})[(track.seq, id(t))] = (track, t)

    def replace(self, track: Track, old: Transition, t: Transition) -> None:
        """The start-less record `old` gives way to `t`, the same transition with the kernel's
        own times (found by startless(): same result, so `failed` stays)."""
        self._startless.get(_key(old), {}).pop((track.seq, id(old)), None)
        transitions = track.ep.transitions
        for i in range(len(transitions) - 1, -1, -1):  # a duplicate comes soon: from the end
            if transitions[i] is old:
                transitions[i] = t
                break
        ends = [x.end for x in transitions if x.result is Result.SUCCESS]
        # The sample may have let the latest success go; the tally covers every transition.
        track.success_end = max(ends) if ends else track.success_end

    # ------------------------------------------------------------ questions

    @property
    def waiting(self) -> int:
        """How many are in phase RESYNC."""
        return self._waiting

    def stale(self) -> list[Track]:
        """Tracks whose kernel_after no snapshot after their kernel phase has dated yet."""
        return list(self._stale.values())

    def without_baseline(self) -> list[Track]:
        """Tracks whose kubelet_before is still unknown."""
        return list(self._no_baseline.values())

    def resyncing(self, resource: Resource) -> Collection[Track]:
        """Tracks in phase RESYNC for `resource`: a live view, not a copy (asked on every Node
        update and snapshot, with thousands waiting); do not change phases while iterating."""
        tracks = self._resync.get(resource)
        return tracks.values() if tracks else ()

    def kernel_unknown_of(self, resource: Resource) -> list[Track]:
        """RESYNC tracks of `resource` the latest snapshot predates."""
        tracks = self._unknown_kernel.get(resource)
        return list(tracks.values()) if tracks else []

    def of_kind(self, kind: Kind) -> list[Track]:
        tracks = self._by_kind.get(kind)
        return list(tracks.values()) if tracks else []

    def joinable(self, kind: Kind, end: float, window: float) -> Track | None:
        """The latest-opened episode of this kind still in its kernel phase whose coalescing
        window a transition that ended at `end` falls in."""
        tracks = self._in_kernel.get(kind)
        if tracks:
            for track in reversed(tracks.values()):
                if end < track.last_end + window:
                    return track
        return None

    def startless(self, t: Transition) -> list[tuple[Track, Transition]]:
        """(track, record) of each start-less record of the same transition, in opening order
        (and within one episode in the order they came)."""
        entries = self._startless.get(_key(t))
        if not entries:
            return []
        return sorted(entries.values(), key=lambda entry: entry[0].seq)  # stable

    # ------------------------------------------------------------ deadlines

    def schedule(self, track: Track, due: float) -> None:
        """Make sure the track is looked at by `due` (an earlier entry already does)."""
        if due < track.scheduled and not track.closed:
            track.scheduled = due
            heapq.heappush(self._heap, (due, next(self._pushes), track))

    def next_due(self) -> float:
        """The earliest deadline entry (it may be early, never late); inf if none."""
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, upto: float) -> list[Track]:
        """Tracks with a decision due at or before `upto`, in opening order; their entries are
        consumed (the tracker schedules them again once it has moved them on)."""
        heap = self._heap
        due: list[Track] = []
        while heap and heap[0][0] <= upto:
            when, _, track = heapq.heappop(heap)
            if track.closed or when != track.scheduled:
                continue  # ended, or superseded by an earlier entry
            track.scheduled = math.inf
            due.append(track)
        return by_seq(due) if len(due) > 1 else due
