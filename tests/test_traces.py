"""Traces: one per ended episode, sent over real OTLP (HTTP and gRPC) to a receiver we run."""
from __future__ import annotations

import pytest

from exporter.clock import FakeClock
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.sinks.journal import Journal
from exporter.sinks.traces import TraceSink, trace_config_from_env
from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.postmortem_samples import T0, cpu_offline_episode, memory_failed_episode

MS = 1_000_000  # ns


def ended(ep) -> EpisodeUpdate:
    return EpisodeUpdate(kind=UpdateKind.ENDED, episode=ep, time=ep.ended)


def near(ns: int, seconds: float) -> bool:
    return abs(ns - seconds * 1e9) <= MS


def by_name(spans):
    out = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def assert_cpu_offline_tree(spans, ep):
    names = by_name(spans)
    (root,) = names["episode cpu decrease"]
    (kernel,) = names["kernel.transition"]
    (resync,) = names["kubelet.resync"]
    (readmission,) = names["kubelet.readmission"]
    assert root.parent_span_id == b""
    for child in (kernel, resync, readmission):
        assert child.parent_span_id == root.span_id
        assert child.trace_id == root.trace_id
    # Times are the episode's, not the export's (the episode is from 2026-11-18).
    assert near(root.start_ns, ep.opened) and near(root.end_ns, ep.ended)
    assert near(kernel.start_ns, ep.transitions[0].start)
    assert near(kernel.end_ns, ep.transitions[0].end)
    assert near(resync.start_ns, ep.kernel_done) and near(resync.end_ns, ep.resynced)
    assert near(readmission.start_ns, ep.resynced)
    assert near(readmission.end_ns, ep.readmission_settled)
    assert kernel.attributes["hotplug.cpu.id"] == 1
    assert kernel.attributes["hotplug.direction"] == "offline"
    assert kernel.attributes["hotplug.result"] == "success"
    assert kernel.attributes["hotplug.steps"] == 95
    assert abs(kernel.attributes["hotplug.duration_s"] - 0.030) < 1e-6
    assert root.attributes["node_resize.outcome"] == "converged"
    assert root.attributes["node_resize.episode.id"] == ep.id
    assert resync.attributes["kubelet.capacity.after"] == 1.0
    events = {e[0]: e for e in readmission.events}
    name, t, attrs = events["pod.rejected"]
    assert near(t, ep.pods[0].time)
    assert attrs["k8s.pod.name"] == "web-0" and attrs["k8s.namespace.name"] == "default"
    assert attrs["node_resize.pod.reason"] == "OutOfcpu"
    assert events["pod.kept"][2]["k8s.pod.name"] == "dns-1"
    assert readmission.status_code == 2  # STATUS_CODE_ERROR: a pod was rejected
    res = root.resource
    assert res["service.name"] == "node-resize-exporter"
    assert res["service.version"]
    assert res["host.name"] == "test-host" and res["k8s.node.name"] == "node-a"


def test_http_trace_tree_times_and_attributes(tmp_path):
    ep = cpu_offline_episode()
    with HttpReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
               "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=ops%20team"}
        sink = TraceSink.from_env(env, node_name="node-a", host_name="test-host")
        for kind in (UpdateKind.OPENED, UpdateKind.KERNEL_DONE):  # only ENDED makes a trace
            sink.on_update(EpisodeUpdate(kind=kind, episode=ep, time=ep.opened))
        sink.on_update(ended(ep))
        sink.close()
        spans = rx.received.wait_spans(4)
    assert len(spans) == 4
    assert_cpu_offline_tree(spans, ep)
    assert rx.received.headers[0]["x-tenant"] == "ops team"
    assert rx.received.headers[0]["content-type"] == "application/x-protobuf"


def test_failed_kernel_transition_span(tmp_path):
    ep = memory_failed_episode()
    with HttpReceiver() as rx:
        sink = TraceSink.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                                   rx.endpoint + "/v1/traces"})
        sink.on_update(ended(ep))
        sink.close()
        spans = rx.received.wait_spans(3)
    names = by_name(spans)
    (root,) = names["episode memory decrease"]
    assert root.status_code == 2 and "EBUSY" in root.status_message
    assert "kubelet.resync" not in names  # kernel_failed: the kubelet was never judged
    refused = [s for s in names["kernel.transition"] if s.attributes["hotplug.result"] == "failed"]
    (refused,) = refused
    assert refused.attributes["hotplug.memory.block"] == 150
    assert refused.attributes["hotplug.error"] == "EBUSY"
    assert refused.status_code == 2
    assert refused.start_ns == refused.end_ns and near(refused.end_ns, T0 + 100.5)
    ok = [s for s in names["kernel.transition"] if s.attributes["hotplug.result"] == "success"]
    assert ok[0].attributes["hotplug.memory.nr_pages"] == 32768


def test_grpc_export(tmp_path):
    ep = cpu_offline_episode()
    with GrpcReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
               "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=ops"}
        sink = TraceSink.from_env(env, node_name="node-a", host_name="test-host")
        assert sink.config.protocol == "grpc"
        sink.on_update(ended(ep))
        sink.close()
        spans = rx.received.wait_spans(4)
    assert_cpu_offline_tree(spans, ep)
    assert rx.received.headers[0]["x-tenant"] == "ops"


def test_exported_once_across_a_restart_with_the_journal(tmp_path):
    ep = cpu_offline_episode()
    other = memory_failed_episode()
    path = tmp_path / "j.db"
    with HttpReceiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint}
        journal = Journal(path, clock=FakeClock(T0))
        sink = TraceSink.from_env(env, journal=journal)
        sink.on_update(ended(ep))
        sink.on_update(ended(ep))  # the same episode again in this process
        sink.close()
        journal.close()
        # "Restart": a new journal and sink see the resumed episode end again.
        journal = Journal(path, clock=FakeClock(T0))
        sink = TraceSink.from_env(env, journal=journal)
        sink.on_update(ended(ep))
        sink.on_update(ended(other))
        sink.close()
        journal.close()
        spans = rx.received.wait_spans(4 + 3)
    roots = [s for s in spans if s.parent_span_id == b""]
    assert sorted(r.attributes["node_resize.episode.id"] for r in roots) == [ep.id, other.id]
    assert len(spans) == 7


def test_undeliverable_batches_are_counted(monkeypatch):
    with HttpReceiver() as rx:
        endpoint = rx.endpoint  # a port that was just ours and is closed now
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    sink = TraceSink.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    sink.on_update(ended(cpu_offline_episode()))
    sink.close()  # must return, not raise, with the collector gone
    assert sink.exported == 1
    assert sink.errors >= 1


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"},
     ("http/protobuf", "http://c:4318/v1/traces")),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/custom"},
     ("http/protobuf", "https://c/custom")),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ("http/protobuf", "http://localhost:4318/v1/traces")),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     ("grpc", "http://localhost:4317")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, ("grpc", "http://c:4317")),
])
def test_config_from_env(env, expected):
    config = trace_config_from_env(env)
    if expected is None:
        assert config is None
    else:
        assert (config.protocol, config.endpoint) == expected
        assert config.exporters == ("otlp",)


def test_console_only():
    config = trace_config_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert config.exporters == ("console",)


@pytest.mark.parametrize("env, words", [
    ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger': accepted values are "
                                         "otlp, console, none"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': accepted values are http/protobuf, grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT='c:4318'"),
])
def test_bad_config_names_the_variable(env, words):
    with pytest.raises(ValueError) as e:
        trace_config_from_env(env)
    assert words in str(e.value)
