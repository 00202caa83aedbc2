"""Whether the readmission forecast saw the pods it judges.

The forecast (exporter/correlate/readmission_forecast.py) counts what a kubelet restart would
reject among the pods it was told of. While the pod source (kube_pods) has not listed this
node's pods, is down, was forbidden by RBAC, or gave up on a list past its bound
(LIST_MAX_OBJECTS), the forecast would judge none or a stale subset and say "nothing
rejected": a zero it did not compute. This says so instead, from the pod source's
SourceStatus events: the metrics leave the forecast's series out and show why
(`node_resize_readmission_forecast_valid`), an episode stores no forecast, an alert fires.

Pure: events in, a Validity out; no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass

from exporter.events import DownCause, SourceStatus
from exporter.kube.bounds import LIST_MAX_OBJECTS

POD_SOURCE = "kube_pods"

# Why a forecast is not valid: the `reason` label of node_resize_readmission_forecast_valid
# (a closed set), with the fix for each.
VALID = "ok"
NOT_LISTED = "pods_not_listed"
TRUNCATED = "pods_truncated"
FORBIDDEN = "pods_forbidden"
DOWN = "pods_source_down"
REASONS = (VALID, NOT_LISTED, TRUNCATED, FORBIDDEN, DOWN)
FIXES = {
    NOT_LISTED: "run with the Kubernetes sources on (--kubernetes) and wait for the first list "
                "of this node's pods",
    TRUNCATED: "the API server listed more pods for this node than the exporter reads "
               f"({LIST_MAX_OBJECTS:,}): check --node-name and the field selector spec.nodeName",
    FORBIDDEN: "let the exporter's service account list and watch pods (deploy/ has the "
               "ClusterRole)",
    DOWN: "see node_resize_exporter_source_up{source=\"kube_pods\"} and the exporter's log for "
          "why the API server does not answer",
}


@dataclass(frozen=True)
class Validity:
    valid: bool
    reason: str  # one of REASONS
    detail: str = ""  # the pod source's own words, when it said why

    @property
    def fix(self) -> str:
        return FIXES.get(self.reason, "")

    def describe(self) -> str:
        """One line: why the forecast cannot be made ("" when it can)."""
        if self.valid:
            return ""
        what = {NOT_LISTED: "this node's pods have not been listed yet",
                TRUNCATED: "the list of this node's pods was cut at its bound",
                FORBIDDEN: "listing this node's pods is forbidden",
                DOWN: "the pod source is down"}[self.reason]
        return f"{what} ({self.detail})" if self.detail else what


# The pod source's typed cause (events.DownCause) -> the Validity reason; any other: DOWN.
_BY_CAUSE: dict[str, str] = {DownCause.FORBIDDEN: FORBIDDEN, DownCause.TRUNCATED: TRUNCATED}


def classify(status: SourceStatus) -> str:
    """The Validity reason for a pod source that went down: from the cause it gave, a typed
    value, never from the words of its reason (an API server's message is in them)."""
    return _BY_CAUSE.get(status.cause, DOWN)


class ForecastValidity:
    """Fed SourceStatus events (the Correlator does); `current` says whether the forecast may
    be shown."""

    def __init__(self) -> None:
        self.current = Validity(False, NOT_LISTED)

    def on_source_status(self, status: SourceStatus) -> None:
        if status.source != POD_SOURCE:
            return
        if status.up:
            self.current = Validity(True, VALID)
        else:
            self.current = Validity(False, classify(status), status.reason[:200])
