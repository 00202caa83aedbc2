"""The collectors are named by client_python's own registry (auto_describe), so a family
registered twice is refused at register(); the `sink` label is each sink's declared name, and
takes only the values docs/metrics.md lists."""
from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.correlate.ledger import KernelLedger
from exporter.correlate.readmission_forecast import ReadmissionForecast
from exporter.sinks.forecast_collector import ForecastCollector
from exporter.sinks.journal.sink import JournalSink
from exporter.sinks.kube_events import KubeEventsSink
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.metrics import MetricsSink
from exporter.sinks.running_pods_collector import RunningPodsSink
from exporter.sinks.traces.env import TraceConfig
from exporter.sinks.traces.sink import TraceSink
from exporter.web.authmetrics import WebAuthCollector
from exporter.web.kubeauth import WebAuthStats
from testkit import metrics_doc

# What the composition root registers (exporter/app.py `serve`), one of each.
COLLECTORS = {
    "metrics": lambda: MetricsSink(threading.Lock(), KernelLedger()),
    "kubelet": KubeletSink,
    "running_pods": RunningPodsSink,
    "forecast": lambda: ForecastCollector(threading.Lock(), ReadmissionForecast()),
    "web_auth": lambda: WebAuthCollector(WebAuthStats()),
}


@pytest.mark.parametrize("name", list(COLLECTORS))
def test_the_registry_names_each_collector_and_refuses_it_twice(name):
    make = COLLECTORS[name]
    first = make()
    assert not hasattr(first, "describe"), "a hand-made describe(): let the registry do it"
    registry = CollectorRegistry(auto_describe=True)
    registry.register(first)
    known = {n for n, c in registry._names_to_collectors.items() if c is first}
    rendered = {m.name for m in first.collect()}
    assert rendered and rendered <= known  # what it renders is what the registry knows
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(make())


class _Api:
    def create(self, obj):
        return obj

    def patch(self, name, patch):
        return patch


def test_the_sink_label_is_each_sinks_declared_name_and_documented(tmp_path):
    journal = JournalSink(tmp_path / "j.db", start=False)
    events = KubeEventsSink("n1", _Api())
    traces = TraceSink(TraceConfig(exporters=("console",)))
    try:
        sinks = [journal, traces, events, KubeletSink(), RunningPodsSink()]
        metrics = MetricsSink(threading.Lock(), KernelLedger(), sinks=sinks)
        sinks.append(metrics)
        registry = CollectorRegistry(auto_describe=True)
        registry.register(metrics)
        scraped: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                if "sink" in sample.labels:
                    scraped.setdefault(family.name, set()).add(sample.labels["sink"])
    finally:
        events.close()
        traces.close()
        journal.close()
    rows = metrics_doc.rows()
    assert scraped["node_resize_exporter_sink_errors"] == {"journal", "trace", "kubeevents"} \
        == rows["node_resize_exporter_sink_errors_total"].values["sink"]
    assert scraped["node_resize_exporter_sink_up"] == {"journal"} \
        == rows["node_resize_exporter_sink_up"].values["sink"]
