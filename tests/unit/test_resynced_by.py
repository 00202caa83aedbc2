"""What resynced an episode (kubelet_restart, kubelet_live, or unknown when no kubelet is
watched), on the episode, in the resync histogram's label, in the trace and in the journal."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from exporter import codec
from exporter.correlate.model import Outcome, UpdateKind
from exporter.events import Change, Direction, KubeletProcess, Resource, SourceStatus
from testkit.correlator_stream import T0, Stream

CPU = Resource.CPU


def unplug_cpu1(s: Stream, kubelet_started: float | None = None) -> None:
    s.snapshot(0, cpus=2)
    if kubelet_started is not None:  # the kubelet as the exporter first finds it
        s.feed(0.2, KubeletProcess(T0 + 0.2, kubelet_started, 100))
    s.node(0.5, cpu=2)
    s.transition(1.0, CPU, 1, Direction.OFFLINE)
    s.snapshot(1.05, cpus=1)
    s.tick(3.5)  # the coalescing window closed: kernel done at T0 + 1.0


def resync_duration(s: Stream, by: str) -> float | None:
    """The _count of that resync_duration series; None when it has no series (a combination
    that never occurred is not rendered)."""
    registry = CollectorRegistry()
    registry.register(s.metrics)
    text = generate_latest(registry).decode()
    want = (f'node_resize_resync_duration_seconds_count{{direction="decrease",resource="cpu",'
            f'resynced_by="{by}"}} ')
    lines = [line for line in text.splitlines() if line.startswith(want)]
    assert len(lines) <= 1, lines
    return float(lines[0].split()[-1]) if lines else None


def test_a_kubelet_started_after_the_kernel_resynced_it():
    s = Stream(kubernetes=True, readmission_settle=1.0)
    unplug_cpu1(s, kubelet_started=T0 - 3600)  # running for an hour
    s.feed(4.0, KubeletProcess(T0 + 4.0, T0 + 3.8, 200))  # restarted by the operator
    [resynced] = [u for u in s.node(6.0, cpu=1) if u.kind is UpdateKind.RESYNCED]
    assert resynced.episode.resynced_by == "kubelet_restart"
    [ended] = [u for u in s.tick(8.0) if u.kind is UpdateKind.ENDED]
    assert ended.episode.outcome is Outcome.CONVERGED
    assert ended.episode.resynced_by == "kubelet_restart"
    assert codec.loads(codec.dumps(ended.episode)).resynced_by == "kubelet_restart"  # journal
    assert resync_duration(s, "kubelet_restart") == 1
    assert resync_duration(s, "kubelet_live") is None


def test_the_running_kubelet_resynced_it():
    s = Stream(kubernetes=True, readmission_settle=1.0)
    unplug_cpu1(s, kubelet_started=T0 - 3600)
    [resynced] = [u for u in s.node(6.0, cpu=1) if u.kind is UpdateKind.RESYNCED]
    assert resynced.episode.resynced_by == "kubelet_live"
    assert resynced.episode.change is Change.DECREASE
    assert resync_duration(s, "kubelet_live") == 1


def test_without_a_kubelet_watched_it_is_unknown():
    """The default DaemonSet: no hostPID, no --kubelet-metrics-url. Nothing shows whether the
    kubelet restarted, so the label does not guess kubelet_live."""
    s = Stream(kubernetes=True, readmission_settle=1.0)
    unplug_cpu1(s)
    [resynced] = [u for u in s.node(6.0, cpu=1) if u.kind is UpdateKind.RESYNCED]
    assert resynced.episode.resynced_by == "unknown"
    assert resync_duration(s, "unknown") == 1 and resync_duration(s, "kubelet_live") is None


def test_a_source_that_no_longer_sees_the_kubelet_no_longer_vouches_for_it():
    s = Stream(kubernetes=True, readmission_settle=1.0)
    s.correlator.handle(KubeletProcess(T0, T0 - 3600, 100))
    s.correlator.handle(KubeletProcess(T0, T0 - 60, 7), "kubelet_metrics")
    unplug_cpu1(s)
    s.correlator.handle(KubeletProcess(T0 + 4.0, None, None))  # the process source lost it
    s.correlator.handle(SourceStatus("kubelet_metrics", False, T0 + 4.5, "unreachable"),
                        "kubelet_metrics")
    [resynced] = [u for u in s.node(6.0, cpu=1) if u.kind is UpdateKind.RESYNCED]
    assert resynced.episode.resynced_by == "unknown"


def test_a_restart_after_the_resync_does_not_unmake_kubelet_live():
    s = Stream(kubernetes=True, readmission_settle=1.0)
    unplug_cpu1(s, kubelet_started=T0 - 3600)
    [resynced] = [u for u in s.node(6.0, cpu=1) if u.kind is UpdateKind.RESYNCED]
    assert resynced.episode.resynced_by == "kubelet_live"
    s.feed(6.5, KubeletProcess(T0 + 6.5, None, None))  # stopped: no kubelet seen now
    s.feed(6.75, KubeletProcess(T0 + 6.75, T0 + 6.6, 300))  # and started after the resync
    [ended] = [u for u in s.tick(8.0) if u.kind is UpdateKind.ENDED]
    assert ended.episode.resynced_by == "kubelet_live"


def test_an_episode_never_resynced_says_nothing():
    s = Stream(kubernetes=True, resync_deadline=5.0)
    unplug_cpu1(s)
    [ended] = [u for u in s.tick(20.0) if u.kind is UpdateKind.ENDED]
    assert ended.episode.outcome is Outcome.RESYNC_TIMEOUT and ended.episode.resynced_by == ""


def test_the_resync_span_carries_it():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from exporter.sinks.traces.spans import build_trace

    s = Stream(kubernetes=True, readmission_settle=1.0)
    unplug_cpu1(s, kubelet_started=T0 - 3600)
    s.feed(4.0, KubeletProcess(T0 + 4.0, T0 + 3.8, 200))
    s.node(6.0, cpu=1)
    [ended] = [u for u in s.tick(8.0) if u.kind is UpdateKind.ENDED]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build_trace(provider.get_tracer("test"), ended.episode)
    [resync] = [span for span in exporter.get_finished_spans() if span.name == "kubelet.resync"]
    assert resync.attributes["node_resize.resynced_by"] == "kubelet_restart"
