"""The collectors are named by client_python's own registry (auto_describe), so a family
registered twice is refused at register(); the `sink` label is each sink's declared name, and
takes only the values docs/metrics.md lists."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.correlate.ledger import KernelLedger
from exporter.sinks.collectors import COLLECTORS as TABLE
from exporter.sinks.collectors import Wiring
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
from testkit.plan import fake_host, plan_agent


def _wiring(root: Path) -> Wiring:
    """An agent without sources, wired as exporter/app.py serve wires it."""
    root.mkdir()
    agent, plan = plan_agent(*fake_host(root))
    return Wiring(agent, MetricsSink(agent.lock, KernelLedger()), plan.shared.running,
                  plan.shared.kubelet, plan)


# What the composition root registers: the collectors' table (exporter/sinks/collectors.py),
# and the web endpoint's own.
MAKERS = {spec.name: spec.build for spec in TABLE}
MAKERS["web_auth"] = lambda _: WebAuthCollector(WebAuthStats())


def test_serve_and_check_read_the_collectors_from_the_table_alone():
    import inspect

    from exporter import app
    from exporter.cli import check
    for module in (app, check):
        source = inspect.getsource(module)
        for cls in ("ForecastCollector", "KubeletSink", "MetricsSink(", "PlanSink.check"):
            assert f"register({cls}" not in source and f"{cls}.check" not in source, \
                (module.__name__, cls)
    assert [s.name for s in TABLE] == ["metrics", "kubelet", "running_pods", "forecast",
                                       "plan", "memory_zones"]


@pytest.mark.parametrize("name", list(MAKERS))
def test_the_registry_names_each_collector_and_refuses_it_twice(name, tmp_path):
    def make():
        return MAKERS[name](_wiring(tmp_path / str(len(list(tmp_path.iterdir())))))
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
