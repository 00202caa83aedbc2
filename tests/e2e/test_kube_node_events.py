"""KEP-3953's Warning Events EmergencyCapacityReduced on this Node: listed and watched with a
field selector the API server applies, summed by occurrence, shown as gauges."""
from __future__ import annotations

import time

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import MalformedInput, NodeWarningEvents
from exporter.sources.apiserver.kube_node_events import REASON, KubeNodeEventsSource
from testkit.event_log import EventLog
from testkit.exporter_proc import RunningExporter
from testkit.fakes.apiserver import serving_node

NODE = "n1"


@pytest.fixture
def api(tmp_path):
    with serving_node(str(tmp_path), NODE) as server:
        yield server


def test_events_are_listed_watched_and_summed(api):
    api.put_event(NODE, REASON, count=2, last="2026-11-23T08:00:00Z")
    api.put_event("other-node", REASON, count=5)  # another node's: not ours
    api.put_event(NODE, "NodeNotReady")  # another reason: not this one
    log = EventLog()
    source = KubeNodeEventsSource(MonotonicWallClock(), node_name=NODE,
                                  kubeconfig=api.kubeconfig)
    source.open()
    source.start(log.emit)
    try:
        first = log.wait_for(NodeWarningEvents)
        assert (first.reason, first.occurrences) == (REASON, 2)
        assert first.last_seen == 1795420800.0  # 2026-11-23T08:00:00Z
        api.put_event(NODE, REASON, count=1, last="2026-11-23T09:00:00Z")
        second = log.wait_for(NodeWarningEvents, lambda e: e.occurrences == 3)
        assert second.last_seen == 1795424400.0
        # The API server filtered: only this node's Events of this reason were asked for.
        watch = api.requests_for("events", watch=True)[-1]
        assert watch["fieldSelector"] == (f"involvedObject.kind=Node,involvedObject.name={NODE},"
                                          f"reason={REASON}")
    finally:
        source.stop()


def test_a_running_exporter_shows_them(api):
    with RunningExporter("--kubeconfig", api.kubeconfig, "--node-name", NODE,
                         "--podresources-socket", "", "--source", "sysfs") as exp:
        exp.wait_for(lambda s: s.value("node_resize_kubelet_warning_events", reason=REASON) == 0)
        api.put_event(NODE, REASON, count=4,
                      last=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        s = exp.wait_for(
            lambda s: s.value("node_resize_kubelet_warning_events", reason=REASON) == 4
        )
        last = s.value("node_resize_kubelet_warning_event_last_timestamp_seconds", reason=REASON)
        assert abs(last - time.time()) < 60
        assert s.value("node_resize_exporter_source_up", source="kube_node_events") == 1


def test_events_of_other_nodes_are_counted_and_skipped_whatever_the_server_applied(api):
    api.ignore_field_selector = True
    api.put_event(NODE, REASON, count=2)
    api.put_event("other-node", REASON, count=5)
    log = EventLog()
    source = KubeNodeEventsSource(MonotonicWallClock(), node_name=NODE,
                                  kubeconfig=api.kubeconfig)
    source.open()
    source.start(log.emit)
    try:
        assert log.wait_for(NodeWarningEvents).occurrences == 2
        log.wait_for(MalformedInput, lambda m: "not asked for" in m.detail)
    finally:
        source.stop()
