"""Each collector describes itself, so the registry refuses a family registered twice."""
from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from exporter.correlate.ledger import KernelLedger
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.metrics import MetricsSink
from exporter.sinks.running_pods import RunningPodsSink
from exporter.web.authmetrics import WebAuthCollector
from exporter.web.kubeauth import WebAuthStats


def _collectors():
    return {"metrics": lambda: MetricsSink(threading.Lock(), KernelLedger()),
            "kubelet": KubeletSink, "running_pods": RunningPodsSink,
            "web_auth": lambda: WebAuthCollector(WebAuthStats())}


@pytest.mark.parametrize("name", list(_collectors()))
def test_a_collector_registered_twice_is_refused(name):
    make = _collectors()[name]
    registry = CollectorRegistry()
    first = make()
    assert list(first.describe()), "nothing described: the registry could not compare names"
    registry.register(first)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(make())


def test_the_exporters_own_families_are_described():
    names = {m.name for m in MetricsSink(threading.Lock(), KernelLedger()).describe()}
    assert "node_resize_exporter_build_info" in names
