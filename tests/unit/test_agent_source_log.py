"""A source's state change is logged once, by the agent (the sources only emit it), with the
fields a JSON log indexes: source, up, reason."""
from __future__ import annotations

import logging

from exporter.agent import Agent
from exporter.clock import FakeClock
from exporter.config.decide import correlator_config
from exporter.config.options import Options
from exporter.correlate.correlator import Correlator
from exporter.events import SourceStatus


def test_down_is_logged_once_with_fields_and_up_again_once(caplog):
    clock = FakeClock()
    agent = Agent(Correlator(correlator_config(Options(), True), clock), [], [], clock)
    caplog.set_level(logging.INFO, logger="exporter.agent")
    agent._process("kube_pods", SourceStatus("kube_pods", True, clock.now(), "listed"))
    agent._process("kube_pods", SourceStatus("kube_pods", False, clock.now(), "forbidden"))
    agent._process("kube_pods", SourceStatus("kube_pods", True, clock.now(), "listed"))
    lines = [r for r in caplog.records if r.name == "exporter.agent"]
    assert [r.getMessage() for r in lines] == ["source kube_pods down: forbidden",
                                               "source kube_pods up again"]
    down, up = lines
    assert (down.source, down.up, down.reason) == ("kube_pods", False, "forbidden")
    assert (up.source, up.up) == ("kube_pods", True)
