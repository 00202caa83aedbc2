"""The episode statistics, counted from the correlator's updates (and, for balloon resizes, from
the pod events themselves), as the metrics sink renders them.

    OPENED           -> node_resize_resync_request_total / node_hot_unplug_request_total
    RESYNCED         -> node_resize_resync_duration_seconds
    ENDED            -> *_errors_total (by outcome; readmission_rejected when a settled
                        readmission rejected pods), node_resize_readmission_duration_seconds,
                        node_resize_readmission_pods_total
    PodStatus events -> node_resize_balloon_resize_total,
                        node_resize_balloon_resize_duration_seconds

Errors are counted per episode at its end, requests when it opens, and not again when it is
resumed after a restart (51 requests for 50 unplugs over a SIGKILL): the process
that opened it counted it, and Prometheus sums both processes' counters across the reset. So
within one process an error can be counted for a request its predecessor counted.

The histograms are kept for every key from the start (tests and the report read them), but the
metrics sink renders only those with an observation: a combination that never occurred (most
resource x direction x resynced_by) costs no series.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from exporter.correlate.histogram import (
    BALLOON_BUCKETS,
    READMISSION_BUCKETS,
    RESYNC_BUCKETS,
    Histogram,
)
from exporter.correlate.kube_view import BalloonResizes
from exporter.correlate.model import (
    RESYNCED_BY,
    EpisodeUpdate,
    Outcome,
    PodVerdict,
    ResyncedBy,
    UpdateKind,
)
from exporter.events import Change, Event, PodsRelisted, PodStatus, Resource

EPISODE_RESOURCES = (Resource.CPU, Resource.MEMORY)

ERROR_REASON = {
    Outcome.KERNEL_FAILED: "kernel_failed",
    Outcome.RESYNC_TIMEOUT: "resync_timeout",
    Outcome.MISMATCH: "mismatch",
}


# A rejected pod's reason is its status.reason ("OutOf" + any extended resource name passes):
# the label keeps the first few distinct reasons as they are, then counts the rest as "other",
# so a hostile or unusual reason cannot grow the page.
MAX_READMISSION_REASONS = 8
MAX_REASON_LENGTH = 64


def _resync_histograms() -> dict[tuple[Resource, Change], Histogram]:
    return {(r, c): Histogram(RESYNC_BUCKETS) for r in EPISODE_RESOURCES for c in Change}


def _resync_histograms_by() -> dict[tuple[Resource, Change, str], Histogram]:
    return {
        (r, c, by): Histogram(RESYNC_BUCKETS)
        for r in EPISODE_RESOURCES
        for c in Change
        for by in RESYNCED_BY
    }


def _readmission_histograms() -> dict[Resource, Histogram]:
    return {r: Histogram(READMISSION_BUCKETS) for r in EPISODE_RESOURCES}


@dataclass
class EpisodeStats:
    resync_requests: Counter[Resource] = field(default_factory=Counter)
    resync_errors: Counter[tuple[Resource, str]] = field(default_factory=Counter)
    resync_duration: dict[tuple[Resource, Change], Histogram] = field(
        default_factory=_resync_histograms
    )
    # The same durations by what resynced the episode (the rendered series)
    resync_duration_by: dict[tuple[Resource, Change, str], Histogram] = field(
        default_factory=_resync_histograms_by
    )
    unplug_requests: Counter[Resource] = field(default_factory=Counter)
    unplug_errors: Counter[tuple[Resource, str]] = field(default_factory=Counter)
    readmission_duration: dict[Resource, Histogram] = field(default_factory=_readmission_histograms)
    readmission_pods: Counter[tuple[str, str]] = field(default_factory=Counter)  # (outcome, reason)
    balloon_resizes: Counter[str] = field(default_factory=Counter)  # applied|deferred|...
    # The same by (result, reason), the rendered series
    balloon_resize_reasons: Counter[tuple[str, str]] = field(default_factory=Counter)
    balloon_resize_duration: Histogram = field(
        default_factory=lambda: Histogram(BALLOON_BUCKETS)
    )
    episodes_open: int = 0
    # Not in the metric catalogue; for logs and tests.
    episodes_ended: Counter[Outcome] = field(default_factory=Counter)
    _resizes: BalloonResizes = field(default_factory=BalloonResizes, repr=False)

    def count_update(self, update: EpisodeUpdate) -> None:
        ep, kind = update.episode, update.kind
        increase = ep.change is Change.INCREASE
        if kind is UpdateKind.OPENED or kind is UpdateKind.RESUMED:
            if kind is UpdateKind.OPENED:  # a resumed one was counted by the process before
                (self.resync_requests if increase else self.unplug_requests)[ep.resource] += 1
            self.episodes_open += 1
        elif kind is UpdateKind.RESYNCED:
            if ep.resynced is not None and ep.kernel_done is not None:
                self.resync_duration[(ep.resource, ep.change)].observe(ep.resynced - ep.kernel_done)
                by = ep.resynced_by if ep.resynced_by in RESYNCED_BY else ResyncedBy.UNKNOWN
                self.resync_duration_by[(ep.resource, ep.change, by)].observe(
                    ep.resynced - ep.kernel_done
                )
        elif kind is UpdateKind.ENDED and ep.outcome is not None:
            self.episodes_open -= 1
            self.episodes_ended[ep.outcome] += 1
            errors = self.resync_errors if increase else self.unplug_errors
            reason = ERROR_REASON.get(ep.outcome)
            if reason is not None:
                errors[(ep.resource, reason)] += 1
            if ep.readmission_settled is not None and ep.kernel_done is not None:
                self._count_readmission(update)

    def _count_readmission(self, update: EpisodeUpdate) -> None:
        ep = update.episode
        assert ep.readmission_settled is not None and ep.kernel_done is not None
        self.readmission_duration[ep.resource].observe(ep.readmission_settled - ep.kernel_done)
        rejected = False
        for p in ep.pods:
            self.readmission_pods[(p.outcome.value, self._bounded_reason(p.outcome.value,
                                                                         p.reason))] += 1
            rejected = rejected or p.outcome is PodVerdict.REJECTED
        if rejected:
            self.unplug_errors[(ep.resource, "readmission_rejected")] += 1

    def _bounded_reason(self, outcome: str, reason: str) -> str:
        key = (outcome, reason)
        if key in self.readmission_pods:
            return reason
        if len(reason) > MAX_REASON_LENGTH or sum(
                1 for o, _ in self.readmission_pods if o == outcome) >= MAX_READMISSION_REASONS:
            return "other"
        return reason

    def count_event(self, event: Event) -> None:
        """Balloon resizes: not episodes, so counted from the pod events themselves, once per
        attempt (watch re-deliveries and relists repeat them)."""
        if isinstance(event, PodStatus):
            if not _finite(event.time):  # the correlator skips it too
                return
            for result, reason, duration in self._resizes.observe(event):
                self.balloon_resizes[result] += 1
                self.balloon_resize_reasons[(result, reason)] += 1
                if duration is not None:
                    self.balloon_resize_duration.observe(duration)
        elif isinstance(event, PodsRelisted) and _finite(event.time):
            for uid in [uid for uid in self._resizes.attempts if uid not in event.uids]:
                self._resizes.forget(uid)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
