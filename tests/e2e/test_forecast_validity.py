"""Issue 36 M1: a list or relist of this node's pods makes the readmission forecast valid only
once its pods are in it. The real pod source against the protocol-true fake API server, its
events replayed in the order the agent's queue hands them on into a real Correlator: at no
point is the forecast valid with fewer pods than the list holds."""
from __future__ import annotations

import pytest

from exporter.clock import FakeClock, MonotonicWallClock
from exporter.correlate.correlator import Correlator
from exporter.events import NodeStatus, PodsRelisted, SourceStatus
from exporter.kube.convert import node_status
from exporter.sources.apiserver.kube_pods import BALLOON_SELECTOR, KubePodsSource
from testkit.correlator import config
from testkit.event_log import EventLog
from testkit.fakes.apiserver import FakeApiServer
from testkit.forecast import T, node, snapshot

PODS = 300


def _valid_counts(events: list[object]) -> list[int]:
    """The pods the forecast held at every event after which it said it was valid."""
    correlator = Correlator(config(kubernetes=True), FakeClock(T))
    correlator.handle(snapshot(16), "sysfs")
    converted = node_status(node(cpu="16", allocatable_cpu="16"), T).event
    assert isinstance(converted, NodeStatus)
    correlator.handle(converted, "kube_node")
    out = []
    for event in events:
        correlator.handle(event, "kube_pods")  # type: ignore[arg-type]
        if correlator.forecast_validity.current.valid:
            result = correlator.forecast.result()
            assert result is not None
            out.append(result.pods)
    return out


@pytest.mark.parametrize("forbidden_first", [False, True], ids=["fresh-start", "403-relist"])
def test_the_forecast_is_valid_only_once_the_listed_pods_are_in_it(forbidden_first):
    with FakeApiServer() as api:
        for i in range(PODS):
            api.put_pod(f"p{i}", node="n1", requests={"cpu": "10m"})
        api.set_forbidden(forbidden_first)
        log = EventLog()
        source = KubePodsSource(MonotonicWallClock(), node_name="n1",
                                kubeconfig=api.kubeconfig_path,
                                balloon_selector=BALLOON_SELECTOR.default,
                                backoff_initial=0.05, backoff_max=0.2)
        source.open()
        source.start(log.emit)
        try:
            if forbidden_first:
                assert not log.wait_for(SourceStatus).up
            api.set_forbidden(False)  # the relist after a 403, every pod bound meanwhile
            log.wait_for(PodsRelisted)
            log.wait_for(SourceStatus, lambda s: s.up)
        finally:
            source.stop()
        counts = _valid_counts(list(log.events))
        assert counts and all(n == PODS for n in counts), counts[:5]
