"""Episodes: one capacity change of one resource, as the kernel saw it, followed to its end.

Plain dataclasses, shared by the correlator (which builds them) and the sinks (traces, journal,
metrics) that read them. The README's "Episodes and the Kubernetes join" describes them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from exporter.correlate.readmission_forecast import Forecast
from exporter.events import Change, Resource, Transition


class Phase(str, enum.Enum):
    KERNEL = "kernel"  # transitions may still join (coalescing window open)
    RESYNC = "resync"  # kernel done; waiting for the Node capacity to match the kernel
    READMISSION = "readmission"  # hot-unplug only: resynced; watching pod admission settle
    ENDED = "ended"


class Outcome(str, enum.Enum):
    CONVERGED = "converged"
    KERNEL_FAILED = "kernel_failed"
    RESYNC_TIMEOUT = "resync_timeout"
    MISMATCH = "mismatch"
    SUPERSEDED = "superseded"
    # No Kubernetes source configured: the episode ends with its kernel phase, no resync judged.
    KERNEL_ONLY = "kernel_only"


class ResyncedBy(enum.StrEnum):
    """What resynced an episode: on the episode, its resync span, in the journal, and the
    `resynced_by` label of the resync histogram (the Correlator decides it)."""

    NOT_YET = ""  # not resynced (yet)
    LIVE = "kubelet_live"  # the kubelet that was already running (no released kubelet does)
    RESTART = "kubelet_restart"  # a kubelet (re)started after the kernel was done
    # Neither can be told: no kubelet process (hostPID) nor its metrics
    # (--kubelet-metrics-url) watched when it resynced.
    UNKNOWN = "unknown"


# The values the resync histogram's `resynced_by` label takes.
RESYNCED_BY = (ResyncedBy.LIVE, ResyncedBy.RESTART, ResyncedBy.UNKNOWN)


class PodVerdict(str, enum.Enum):
    KEPT = "kept"
    REJECTED = "rejected"


@dataclass(frozen=True)
class PodOutcome:
    time: float
    namespace: str
    name: str
    uid: str
    outcome: PodVerdict
    reason: str  # status.reason of a rejected pod (OutOfcpu, ...), "NotReady", or "Running" kept


@dataclass
class Episode:
    id: str  # deterministic from the first transition, so a replay yields the same ids
    resource: Resource
    change: Change
    opened: float  # start of the first transition (its end when the start is unknown)
    transitions: list[Transition] = field(default_factory=list)
    kernel_done: float | None = None  # end of the last successful (or last) transition
    kernel_before: float | None = None  # kernel capacity before / after (cores or bytes)
    kernel_after: float | None = None
    kubelet_before: float | None = None  # Node status.capacity when the episode opened
    phase: Phase = Phase.KERNEL
    resynced: float | None = None  # watch delivery time of the matching Node update
    kubelet_after: float | None = None  # the Node capacity it settled on (match or mismatch)
    resynced_by: ResyncedBy = ResyncedBy.NOT_YET  # set by the Correlator once resynced
    readmission_settled: float | None = None
    pods: list[PodOutcome] = field(default_factory=list)
    outcome: Outcome | None = None
    ended: float | None = None
    detail: str = ""  # human words for the outcome: "cpuhp state 85 (ap:offline) ret=-16"
    # What a kubelet restart would have done with the node's pods, as last forecast before the
    # kubelet first acted on the episode: its resync or its first rejected pod
    # (readmission_forecast.py; the Correlator sets it). None: nothing to forecast from.
    forecast: Forecast | None = None
    # Every transition that joined, by direction (0 and 0 in journals from before they were
    # counted). `transitions` keeps a sample when there are more than index.TRANSITIONS_KEPT.
    offline_transitions: int = 0
    online_transitions: int = 0

    def copy(self) -> Episode:
        """A copy sinks may keep: the two lists are its only mutable parts. Every field in
        order, through the constructor (dataclasses.replace builds the same from a dict of
        every field, at twice the cost, on the path every update takes); the unit test
        test_episode_copy_keeps_every_field fails when a field is added and not copied here."""
        return Episode(self.id, self.resource, self.change, self.opened, list(self.transitions),
                       self.kernel_done, self.kernel_before, self.kernel_after,
                       self.kubelet_before, self.phase, self.resynced, self.kubelet_after,
                       self.resynced_by, self.readmission_settled, list(self.pods), self.outcome,
                       self.ended, self.detail, self.forecast, self.offline_transitions,
                       self.online_transitions)

    @property
    def flapping(self) -> bool:
        """Transitions both ways joined it: a flap storm, told as one episode (README)."""
        return self.offline_transitions > 0 and self.online_transitions > 0

    @property
    def transitions_seen(self) -> int:
        """Every transition that joined, including those the sample let go."""
        return max(self.offline_transitions + self.online_transitions, len(self.transitions))

    @property
    def kernel_seconds(self) -> float | None:
        return None if self.kernel_done is None else self.kernel_done - self.opened

    @property
    def resync_seconds(self) -> float | None:
        if self.resynced is None or self.kernel_done is None:
            return None
        return max(0.0, self.resynced - self.kernel_done)

    @property
    def readmission_seconds(self) -> float | None:
        if self.readmission_settled is None or self.kernel_done is None:
            return None
        return max(0.0, self.readmission_settled - self.kernel_done)


class UpdateKind(str, enum.Enum):
    OPENED = "opened"
    TRANSITION = "transition"
    KERNEL_DONE = "kernel_done"
    RESYNCED = "resynced"
    POD = "pod"
    ENDED = "ended"
    RESUMED = "resumed"  # re-opened from the journal after a restart (counted as a request again)


@dataclass(frozen=True)
class EpisodeUpdate:
    kind: UpdateKind
    episode: Episode  # a copy taken when the update was made: sinks may keep it
    time: float
