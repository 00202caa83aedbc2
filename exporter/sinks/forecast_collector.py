"""The readmission forecast as Prometheus gauges: which pods a kubelet restart now would reject.

A Collector beside the exporter's own (exporter/sinks/metrics.py): it takes a view of the
Correlator's ReadmissionForecast (exporter/correlate/readmission_forecast.py) at scrape time
under the agent's lock, the lock the Correlator writes it under, and judges it outside. The
composition root wires it:

    registry.register(ForecastCollector(agent.lock, agent.correlator.forecast,
                                        agent.correlator.forecast_validity))

Nothing is shown before the exporter has both a kernel snapshot and this node's Node (no
Kubernetes: no forecast). The per-pod series exist only for pods that would be rejected, at
most LISTED_MAX of them; the rest are counted. While the forecast has not seen the pods it
would judge (the pod source not listed yet, down, forbidden or cut at its list bound:
exporter/correlate/forecast_validity.py), none of its series is shown, never a zero it did not
compute; node_resize_readmission_forecast_valid says so and why.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.checks import Check
from exporter.config.options import Options
from exporter.correlate.forecast_validity import ForecastValidity, Validity
from exporter.correlate.kubelet_view import cpu_list
from exporter.correlate.readmission_forecast import (
    LISTED_MAX,
    REASON_RESOURCE,
    Forecast,
    ForecastView,
    ReadmissionForecast,
)
from exporter.events import CpuManagerCheckpoint, KernelSnapshot, PodStatus
from exporter.readnow import Reads, Unlisted
from exporter.words import count


def take_forecast(lock: threading.Lock | threading.RLock, forecast: ReadmissionForecast,
                  validity: ForecastValidity | None) -> tuple[ForecastView, Validity | None]:
    """The forecast's view and whether it saw the pods, consistent: the validity read first,
    then the view the forecast still holds as current (no lock: every pod noted before the
    pod source said it listed them is in it), else both under `lock` (the agent's, which the
    Correlator writes them under)."""
    said = validity.current if validity is not None else None
    view = forecast.current()
    if view is None:
        with lock:
            view = forecast.view()
            said = validity.current if validity is not None else None
    return view, said


class ForecastCollector(Collector):
    @staticmethod
    def check(reads: Reads) -> list[Check]:
        """Which pods a kubelet restart now would reject (`check`'s line)."""
        return [check_readmission_forecast(reads)]

    def __init__(self, lock: threading.Lock | threading.RLock,
                 forecast: ReadmissionForecast, validity: ForecastValidity | None = None) -> None:
        self._lock = lock
        self._forecast = forecast
        self._validity = validity

    def collect(self) -> Iterable[Metric]:
        # The forecast's view (taken under the agent's lock only when an input changed, O(1)),
        # judged outside it, once per change whoever asks first.
        view, validity = take_forecast(self._lock, self._forecast, self._validity)
        forecast: Forecast | None = view.result()
        valid = GaugeMetricFamily(
            "node_resize_readmission_forecast_valid",
            "1 when the readmission forecast saw the pods it judges; 0 when it cannot forecast, "
            "and the reason (pods_not_listed, pods_source_down, pods_forbidden, pods_truncated): "
            "the forecast's series are left out meanwhile.", labels=["reason"])
        if forecast is not None and validity is not None:
            valid.add_metric([validity.reason], 1 if validity.valid else 0)
            if not validity.valid:
                forecast = None  # not a zero it did not compute
        by_reason = GaugeMetricFamily(
            "node_resize_readmission_forecast_rejected_pods",
            "Pods a kubelet restart now would reject, by the reason it would give (the kernel's "
            "capacity now minus the kubelet's reservations, pods readmitted oldest first). "
            "Run `node-resize-exporter check` for their names.",
            labels=["resource", "reason"])
        pods = GaugeMetricFamily(
            "node_resize_readmission_forecast_rejected",
            f"1 for each pod a kubelet restart now would reject (the first {LISTED_MAX} in "
            "readmission order).", labels=["namespace", "pod", "reason"])
        unlisted = GaugeMetricFamily(
            "node_resize_readmission_forecast_rejected_unlisted_pods",
            f"Pods a kubelet restart now would reject beyond the {LISTED_MAX} named one by one.")
        considered = GaugeMetricFamily(
            "node_resize_readmission_forecast_pods",
            "Pods bound to this node a kubelet restart would readmit or reject (not finished).")
        skipped = GaugeMetricFamily(
            "node_resize_exporter_forecast_skipped_pods",
            "Pods the readmission forecast left out: their requests are not usable numbers.")
        if forecast is not None:
            for reason, n in forecast.by_reason.items():
                by_reason.add_metric([REASON_RESOURCE.get(reason, "other"), reason], n)
            for pod in forecast.rejected:
                pods.add_metric([pod.namespace, pod.name, pod.reason], 1)
            unlisted.add_metric([], forecast.unlisted)
            considered.add_metric([], forecast.pods)
            skipped.add_metric([], forecast.skipped)
        yield by_reason
        yield pods
        yield unlisted
        yield considered
        yield skipped
        yield valid


FORECAST_NAMED = 8  # pods named on the check line; the metrics name up to LISTED_MAX


@dataclass(frozen=True)
class Listed:
    forecast: ReadmissionForecast  # fed the kernel, the Node, the pods and the CPU manager
    pods: list[PodStatus]


def list_forecast(given: Options | Reads, node: str, snap: KernelSnapshot,
                  cpu_manager: CpuManagerCheckpoint | None) -> Listed | Unlisted:
    """The forecast of the one bounded list of this node's Node and pods (exporter/readnow),
    as `check` and `plan` make it (the running exporter's is fed by the watches instead).
    Never a forecast of pods it did not see: an API error, 403 or a list past its bound is
    Unlisted."""
    listed = Reads.of(given).node_and_pods(node)
    if isinstance(listed, Unlisted):
        return listed
    forecast = ReadmissionForecast()
    forecast.on_snapshot(snap)
    forecast.on_node(listed.node)
    if cpu_manager is not None:
        forecast.on_cpu_manager(cpu_manager)
    for pod in listed.pods:
        forecast.on_pod(pod)
    return Listed(forecast, listed.pods)


def check_readmission_forecast(given: Options | Reads) -> Check:
    """Which pods a kubelet restart now would reject: the exporter's own forecast
    (exporter/correlate/readmission_forecast.py), made from one list of this node's Node and
    pods, the kernel now, and the CPU manager's policy from its checkpoint."""

    name = "readmission forecast"
    reads = Reads.of(given)
    snap = reads.kernel_or_check(name)
    if isinstance(snap, Check):
        return snap
    cpu_manager = None
    if reads.kubelet_root:
        try:
            cpu_manager = reads.checkpoints()[0]
        except (OSError, ValueError):
            pass  # the kubelet restart line says why; judged without the CPU manager here
    listed = list_forecast(reads, reads.decisions.node, snap, cpu_manager)
    if isinstance(listed, Unlisted):
        return Check(name, "warn", f"{'cannot forecast' if listed.cannot else 'not checked'}: "
                     f"{listed.message}", listed.fix)
    return forecast_check(listed.forecast, snap.cpus_offline & snap.cpus_present)


def forecast_check(forecast: ReadmissionForecast, offline: frozenset[int]) -> Check:
    """The check line for a ReadmissionForecast: the pods it would reject and the fix."""
    name = "readmission forecast"
    result = forecast.result()
    if result is None:
        return Check(name, "warn", "not checked: no Node status or kernel snapshot", "")
    skipped = f" ({count(result.skipped, 'pod')} with unusable requests left out)" \
        if result.skipped else ""
    if not result.rejected_total:
        return Check(name, "ok", "a kubelet restart now would readmit "
                     + ("its 1 pod" if result.pods == 1 else f"all {result.pods} pods") + skipped)
    named = ", ".join(f"{r.namespace}/{r.name} ({r.reason})"
                      for r in result.rejected[:FORECAST_NAMED])
    more = result.rejected_total - min(FORECAST_NAMED, len(result.rejected))
    if more:
        named += f" and {more} more"
    resources = {REASON_RESOURCE.get(reason, "") for reason, n in result.by_reason.items() if n}
    restore = []
    if "cpu" in resources and offline:
        restore.append(f"restore {cpu_list(offline).replace('cpu', 'cpu ')}")
    if resources & {"memory", "hugepages-2Mi", "hugepages-1Gi"}:
        restore.append("restore the memory taken away")
    if "pods" in resources:
        restore.append("raise the kubelet's maxPods")
    fix = "drain these" + (", or " + " and ".join(restore) if restore else "") + \
        ", before restarting the kubelet (docs/runbooks.md: Before you restart the kubelet)"
    return Check(name, "fail", f"a kubelet restart now would reject {result.rejected_total} "
                 f"of {count(result.pods, 'pod')}: {named}" + skipped, fix)
