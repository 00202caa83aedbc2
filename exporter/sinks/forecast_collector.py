"""The readmission forecast as Prometheus gauges: which pods a kubelet restart now would reject.

A Collector beside the exporter's own (exporter/sinks/metrics.py): it reads the Correlator's
ReadmissionForecast (exporter/correlate/readmission_forecast.py) at scrape time under the
agent's lock, the lock the Correlator writes it under. The composition root wires it:

    registry.register(ForecastCollector(agent.lock, agent.correlator.forecast))

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

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.correlate.forecast_validity import ForecastValidity
from exporter.correlate.readmission_forecast import (
    LISTED_MAX,
    REASON_RESOURCE,
    Forecast,
    ReadmissionForecast,
)


class ForecastCollector(Collector):
    def __init__(self, lock: threading.Lock | threading.RLock,
                 forecast: ReadmissionForecast, validity: ForecastValidity | None = None) -> None:
        self._lock = lock
        self._forecast = forecast
        self._validity = validity

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            forecast: Forecast | None = self._forecast.result()
            validity = self._validity.current if self._validity is not None else None
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
