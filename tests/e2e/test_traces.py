"""Traces: one per ended episode, sent over real OTLP (HTTP and gRPC) to a receiver we run."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from exporter.clock import FakeClock
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.sinks.journal.sink import JournalSink
from exporter.sinks.traces.env import trace_config_from_env, trace_resource
from exporter.sinks.traces.sink import TraceSink
from testkit.exporter_proc import REPO, free_port
from testkit.fakes.otlp import GrpcReceiver, HttpReceiver
from testkit.postmortem_samples import T0, cpu_offline_episode, memory_failed_episode

MS = 1_000_000  # ns


@pytest.fixture
def otel_env(monkeypatch):
    """Set OTEL_* variables in os.environ (the SDK reads them there), none left from outside."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)

    def set_env(env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
    return set_env


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


def test_http_trace_tree_times_and_attributes(otel_env):
    ep = cpu_offline_episode()
    with HttpReceiver() as rx:
        # A base endpoint: the SDK's exporter appends /v1/traces itself.
        otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                  "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=ops%20team"})
        sink = TraceSink.from_env(node_name="node-a", host_name="test-host")
        for kind in (UpdateKind.OPENED, UpdateKind.KERNEL_DONE):  # only ENDED makes a trace
            sink.on_update(EpisodeUpdate(kind=kind, episode=ep, time=ep.opened))
        sink.on_update(ended(ep))
        sink.close()
        spans = rx.received.wait_spans(4)
    assert len(spans) == 4
    assert_cpu_offline_tree(spans, ep)
    assert rx.received.headers[0]["x-tenant"] == "ops team"
    assert rx.received.headers[0]["content-type"] == "application/x-protobuf"


def test_failed_kernel_transition_span(otel_env):
    ep = memory_failed_episode()
    with HttpReceiver() as rx:
        otel_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.endpoint + "/v1/traces"})
        sink = TraceSink.from_env()
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


def test_grpc_export(otel_env):
    ep = cpu_offline_episode()
    with GrpcReceiver() as rx:
        otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                  "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                  "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=ops"})
        sink = TraceSink.from_env(node_name="node-a", host_name="test-host")
        assert sink.config.protocol == "grpc"
        sink.on_update(ended(ep))
        sink.close()
        spans = rx.received.wait_spans(4)
    assert_cpu_offline_tree(spans, ep)
    assert rx.received.headers[0]["x-tenant"] == "ops"


def test_exported_once_across_a_restart_with_the_journal(tmp_path, otel_env):
    ep = cpu_offline_episode()
    other = memory_failed_episode()
    path = tmp_path / "j.db"
    with HttpReceiver() as rx:
        otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})
        journal = JournalSink(path, clock=FakeClock(T0))
        sink = TraceSink.from_env(journal=journal)
        sink.on_update(ended(ep))
        sink.on_update(ended(ep))  # the same episode again in this process
        sink.close()
        journal.close()
        # "Restart": a new journal and sink see the resumed episode end again.
        journal = JournalSink(path, clock=FakeClock(T0))
        sink = TraceSink.from_env(journal=journal)
        sink.on_update(ended(ep))
        sink.on_update(ended(other))
        sink.close()
        journal.close()
        spans = rx.received.wait_spans(4 + 3)
    roots = [s for s in spans if s.parent_span_id == b""]
    assert sorted(r.attributes["node_resize.episode.id"] for r in roots) == [ep.id, other.id]
    assert len(spans) == 7


def test_undeliverable_batches_are_counted(otel_env):
    with HttpReceiver() as rx:
        endpoint = rx.endpoint  # a port that was just ours and is closed now
    otel_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    sink = TraceSink.from_env()
    sink.on_update(ended(cpu_offline_episode()))
    sink.close()  # must return, not raise, with the collector gone
    assert sink.exported == 1
    assert sink.errors >= 1


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "-5"}, None),  # traces off: nothing reads it, nothing to say
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/custom"}, "http/protobuf"),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, "http/protobuf"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
      "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096", "OTEL_BSP_SCHEDULE_DELAY": "200",
      "OTEL_BSP_EXPORT_TIMEOUT": "0", "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
      "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}, "http/protobuf"),
])
def test_config_from_env(otel_env, env, expected):
    otel_env(env)
    config = trace_config_from_env()
    if expected is None:
        assert config is None
    else:
        assert config.protocol == expected
        assert config.exporters == ("otlp",)
        TraceSink(config).close()  # the SDK takes what was accepted without complaint


def test_console_only(otel_env):
    otel_env({"OTEL_TRACES_EXPORTER": "console"})
    assert trace_config_from_env().exporters == ("console",)


BAD_ENV = [
    ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger': accepted values are "
                                         "otlp, console, none"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': accepted values are http/protobuf, grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT='c:4318'"),
    # These two were a traceback and exit 1 (the SDK's bare ValueError).
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_MAX_QUEUE_SIZE": "-5"},
     "OTEL_BSP_MAX_QUEUE_SIZE='-5': accepted values are whole numbers of at least 1"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0"},
     "OTEL_BSP_MAX_EXPORT_BATCH_SIZE='0': accepted values are whole numbers of at least 1"),
    # The SDK would log a traceback and quietly use its default for these.
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "5s"},
     "OTEL_BSP_SCHEDULE_DELAY='5s': accepted values are whole numbers of at least 1"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_MAX_QUEUE_SIZE": "1.5"},
     "OTEL_BSP_MAX_QUEUE_SIZE='1.5'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_EXPORT_TIMEOUT": "-1"},
     "OTEL_BSP_EXPORT_TIMEOUT='-1': accepted values are whole numbers of at least 0"),
    # Past threading.TIMEOUT_MAX the worker thread dies of OverflowError: traces stop.
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_SCHEDULE_DELAY": "1" + "0" * 20},
     "OTEL_BSP_SCHEDULE_DELAY='100000000000000000000': accepted values are whole numbers of "
     "at least 1 and at most"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"},
     "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=4096: must be at most OTEL_BSP_MAX_QUEUE_SIZE (2048)"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": "nan"},
     "OTEL_EXPORTER_OTLP_TIMEOUT='nan': accepted values are a number of seconds more than 0"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "10ms"},
     "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='10ms'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
     "OTEL_EXPORTER_OTLP_COMPRESSION='zstd': accepted values with protocol http/protobuf are "
     "none, gzip, deflate"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"},
     "accepted values with protocol grpc are gzip"),
]


@pytest.mark.parametrize("env, words", BAD_ENV)
def test_bad_config_names_the_variable(otel_env, env, words):
    otel_env(env)
    with pytest.raises(ValueError) as e:
        trace_config_from_env()
    assert words in str(e.value)


@pytest.mark.parametrize("name, value", [("OTEL_BSP_MAX_QUEUE_SIZE", "-5"),
                                         ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0")])
def test_run_exits_2_with_the_fix_not_a_traceback(name, value):
    # The real command: exit 2 and one line naming the variable.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", name: value})
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "exporter", "run", "--no-journal",
                        "--source", "sysfs", "--web.listen-address", f"127.0.0.1:{port}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"{name}={value!r}: accepted values are whole numbers of at least 1" in r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- resource


def test_resource_defaults(otel_env):
    attrs = trace_resource(node_name="node-a", host_name="test-host").attributes
    assert attrs["service.name"] == "node-resize-exporter"
    assert attrs["service.version"]
    assert attrs["host.name"] == "test-host"
    assert attrs["k8s.node.name"] == "node-a"
    assert attrs["telemetry.sdk.name"] == "opentelemetry"  # the SDK's own, from create()


@pytest.mark.parametrize("env, service, extra", [
    ({"OTEL_SERVICE_NAME": "resize-agent"}, "resize-agent", {}),
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment.name=prod"},
     "from-attrs", {"deployment.environment.name": "prod"}),
    # OTEL_SERVICE_NAME wins over service.name in the attributes (the spec's order).
    ({"OTEL_SERVICE_NAME": "resize-agent", "OTEL_RESOURCE_ATTRIBUTES": "service.name=x"},
     "resize-agent", {}),
    # The user's attributes win over what the process says of itself.
    ({"OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=from-env,host.name=h2"}, "node-resize-exporter",
     {"k8s.node.name": "from-env", "host.name": "h2"}),
])
def test_resource_from_the_environment(otel_env, env, service, extra):
    otel_env(env)
    attrs = trace_resource(node_name="node-a", host_name="test-host").attributes
    assert attrs["service.name"] == service
    for key, value in extra.items():
        assert attrs[key] == value


def test_otel_service_name_reaches_the_collector(otel_env):
    ep = cpu_offline_episode()
    with HttpReceiver() as rx:
        otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                  "OTEL_SERVICE_NAME": "resize-agent",
                  "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=lab"})
        sink = TraceSink.from_env(node_name="node-a", host_name="test-host")
        sink.on_update(ended(ep))
        sink.close()
        spans = rx.received.wait_spans(4)
    res = spans[0].resource
    assert res["service.name"] == "resize-agent"
    assert res["deployment.environment.name"] == "lab"
    assert res["k8s.node.name"] == "node-a" and res["service.version"]


# ---------------------------------------------------------------- hostile OTEL_* (second round)


@pytest.mark.parametrize("name, value, words", [
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/dev/zero", "not a regular file"),  # 2.5 GiB RSS
    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "FIFO", "not a regular file"),  # start-up hung
    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/nonexistent.pem", "No such file"),
    ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "BIG", "more than 1048576"),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-1", "whole numbers from 0"),  # a traceback
    ("OTEL_SPAN_EVENT_COUNT_LIMIT", "", "whole numbers from 0"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%0d%0aInjected: 1", "control or non-ASCII"),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "no equals sign", "is not a key=value header"),
])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_hostile_otel_files_limits_and_headers_exit_2_naming_the_variable(
        tmp_path, name, value, words, protocol):
    if value == "FIFO":
        value = str(tmp_path / "fifo")
        os.mkfifo(value)
    elif value == "BIG":
        value = str(tmp_path / "big.pem")
        with open(value, "wb") as f:
            f.truncate((1 << 20) + 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, name: value})
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "exporter", "run", "--no-journal",
                        "--source", "sysfs", "--web.listen-address", f"127.0.0.1:{port}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert name in r.stderr and words in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value, words", [
    ("Authorization: Bearer SEKRIT-token-0123456789", "item 1 is not a key=value header"),
    ("x-tenant=ops,Authorization=Bearer \"SEKRIT-token\"", "the value of 'Authorization'"),
    ("x-tenant=ops, Bearer SEKRIT-token=", "item 2 is not a key=value header"),
    ("api-key=SEKRIT%0d%0a", "the value of 'api-key'"),
])
def test_a_malformed_header_names_the_key_never_the_credential(value, words):
    from exporter.sinks.traces.env import _check_headers
    with pytest.raises(ValueError) as raised:
        _check_headers({"OTEL_EXPORTER_OTLP_HEADERS": value}, "OTEL_EXPORTER_OTLP_HEADERS")
    message = str(raised.value)
    assert words in message, message
    assert "SEKRIT" not in message, message


def test_close_is_bounded_when_the_collector_never_answers(otel_env):
    """A collector that accepts and never answers, with a 30 s OTLP timeout: close() gives up
    after its bound, with the request still unanswered, and counts the trace not sent."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)  # read nothing, answer nothing

    import threading
    threading.Thread(target=accept, daemon=True).start()
    try:
        otel_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "30", "OTEL_BSP_SCHEDULE_DELAY": "600000",
                  "OTEL_EXPORTER_OTLP_ENDPOINT":
                      f"http://127.0.0.1:{listener.getsockname()[1]}"})
        sink = TraceSink.from_env()
        sink.on_update(ended(cpu_offline_episode()))
        sink.close(timeout=2)
        assert accepted, "the export never reached the collector"
        conn = accepted[-1]  # the export is still waiting on it: close() did not wait it out
        conn.setblocking(False)
        with pytest.raises(BlockingIOError):
            while conn.recv(65536):  # the request; b"" would mean the client gave up first
                pass
            raise AssertionError("the exporter closed the connection before close() returned")
        assert sink.errors >= 1
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_a_junk_header_on_the_collectors_200_is_an_error_and_one_line(otel_env, caplog):
    """A collector (or a proxy before it) answering 200 with a header line that is not one:
    urllib3 logged a traceback per export and the SDK counted it delivered. Now each such
    export is counted in errors, and logged once an interval, without a traceback."""
    from exporter.sinks.traces import sink as sink_module
    with HttpReceiver(junk_header=True) as rx:
        otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                  "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
        caplog.set_level("DEBUG")
        sink_module._SDK_FILTER.reset()
        caplog.clear()
        sink = TraceSink.from_env()
        for _ in range(3):
            sink.on_update(ended(cpu_offline_episode()))
            sink._seen.clear()
            sink.flush()
        sink.close()
        assert rx.received.requests >= 3  # delivered, as far as the collector knows
    defects = [r for r in caplog.records if "Failed to parse headers" in str(r.msg)]
    assert len(defects) == 1, [r.getMessage() for r in defects]
    assert not any(r.exc_info for r in defects) and "Traceback" not in caplog.text
    assert sink.errors >= 3


def test_sdk_warnings_are_logged_once_per_interval(otel_env, caplog):
    """A collector that resets every connection: one warning for the flap, not one a try."""
    from exporter.sinks.traces import sink as sink_module
    with HttpReceiver() as rx:
        endpoint = rx.endpoint  # closed now: every export is refused
    otel_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    caplog.set_level("DEBUG")
    sink_module._SDK_FILTER.reset()
    caplog.clear()  # an earlier test's export thread may still be retrying: from here on
    sink = TraceSink.from_env()
    for _ in range(5):
        sink.on_update(ended(cpu_offline_episode()))
        sink._seen.clear()
        sink.flush()
    sink.close()
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry")
           and r.levelno >= 30]
    messages = [str(r.msg) for r in sdk]
    assert len(messages) == len(set(messages)), messages  # each message once
    assert not any(r.exc_info for r in sdk)
    assert sink.errors >= 5
