"""node_resize_exporter_web_auth_total and node_resize_exporter_web_auth_reviews_total: what the
endpoint decided about requests on the telemetry path, and the API reviews it made for that.
Families are always declared; series appear only once something was counted (a node without
authentication on its endpoint adds none)."""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from exporter.web.kubeauth import WebAuthStats


class WebAuthCollector(Collector):
    def __init__(self, stats: WebAuthStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        decisions, reviews = self.stats.snapshot()
        total = CounterMetricFamily(
            "node_resize_exporter_web_auth", "Requests to the telemetry path by what "
            "authentication decided (allowed, unauthenticated 401, denied 403, unavailable 503, "
            "throttled 429).", labels=["result"])
        for result, n in sorted(decisions.items()):
            total.add_metric([result], n)
        yield total
        calls = CounterMetricFamily(
            "node_resize_exporter_web_auth_reviews", "TokenReviews and SubjectAccessReviews "
            "sent to the API server for --web.auth=kubernetes, by outcome.",
            labels=["review", "result"])
        for (review, result), n in sorted(reviews.items()):
            calls.add_metric([review, result], n)
        yield calls
