"""What the metrics sink renders, series by series (docs/metrics.md, "Series budget"): no bucket
before an observation, only the combinations that occurred, only the error reasons that can
occur, and a bounded readmission reason."""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, generate_latest

from exporter.correlate.histogram import (
    BALLOON_BUCKETS,
    KERNEL_BUCKETS,
    READMISSION_BUCKETS,
    RESYNC_BUCKETS,
)
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.model import (
    Episode,
    EpisodeUpdate,
    Outcome,
    PodOutcome,
    PodVerdict,
    UpdateKind,
)
from exporter.events import Change, Direction, KubeletProcess, Resource
from exporter.sinks.metrics import MetricsSink
from exporter.sinks.stats import MAX_READMISSION_REASONS
from testkit.correlator_stream import T0, Stream


def lines(sink: MetricsSink) -> list[str]:
    registry = CollectorRegistry()
    registry.register(sink)
    return [line for line in generate_latest(registry).decode().splitlines()
            if line and not line.startswith("#")]


def named(rendered: list[str], prefix: str) -> list[str]:
    return [line for line in rendered if line.startswith(prefix)]


def test_at_most_ten_buckets_each():
    for bounds in (KERNEL_BUCKETS, RESYNC_BUCKETS, READMISSION_BUCKETS, BALLOON_BUCKETS):
        assert len(bounds) + 1 <= 10 and list(bounds) == sorted(set(bounds))
    # The alerts and their tests read these boundaries (mixin/alerts, alerts/tests).
    assert {1.0, 300.0, 600.0} <= set(RESYNC_BUCKETS)


def test_no_bucket_until_an_observation_then_only_what_occurred():
    s = Stream(kubernetes=True, readmission_settle=1.0)
    before = lines(s.metrics)
    assert not named(before, "node_resize_resync_duration_seconds")
    assert not named(before, "node_resize_readmission_duration_seconds")
    assert not named(before, "node_resize_balloon_resize_duration_seconds")
    s.snapshot(0, cpus=2)
    s.feed(0.25, KubeletProcess(T0 + 0.25, T0 - 3600, 100))  # the kubelet, watched
    s.node(0.5, cpu=2)
    s.transition(1.0, Resource.CPU, 1, Direction.OFFLINE)
    s.snapshot(1.05, cpus=1)
    s.tick(3.5)
    s.node(6.0, cpu=1)  # resynced by the running kubelet
    after = named(lines(s.metrics), "node_resize_resync_duration_seconds")
    # One combination (cpu, decrease, kubelet_live): its buckets, +Inf, sum and count.
    assert len(after) == len(RESYNC_BUCKETS) + 3, after
    assert all('resynced_by="kubelet_live"' in line and 'direction="decrease"' in line
               for line in after)


def test_without_kubernetes_only_the_kernel_failed_reason_and_no_join_families():
    s = Stream(kubernetes=False)
    kernel_only = MetricsSink(threading.Lock(), KernelLedger(), s.view, kubernetes=False)
    rendered = lines(kernel_only)
    errors = named(rendered, "node_hot_unplug_errors_total") + named(
        rendered, "node_resize_resync_errors_total")
    assert len(errors) == 4 and all('reason="kernel_failed"' in line for line in errors)
    assert not named(rendered, "node_resize_balloon_")
    assert not named(rendered, "node_resize_readmission_")
    joined = lines(s.metrics)  # the same with Kubernetes: every reason at 0
    assert len(named(joined, "node_hot_unplug_errors_total")) == 8
    assert len(named(joined, "node_resize_resync_errors_total")) == 6


def test_readmission_reasons_are_bounded():
    s = Stream(kubernetes=True)
    for i in range(50):
        ep = Episode(id=f"e{i}", resource=Resource.CPU, change=Change.DECREASE, opened=0.0,
                     kernel_done=1.0, readmission_settled=2.0, outcome=Outcome.CONVERGED,
                     pods=[PodOutcome(2.0, "ns", "p", "uid", PodVerdict.REJECTED,
                                      f"OutOfexample.com/device-{i}")])
        s.metrics.on_update(EpisodeUpdate(UpdateKind.ENDED, ep, 2.0))
    rejected = named(lines(s.metrics), 'node_resize_readmission_pods_total{outcome="rejected"')
    assert len(rejected) == MAX_READMISSION_REASONS + 1  # the first ones, then "other"
    assert sum(float(line.split()[-1]) for line in rejected) == 50  # none lost
    assert any('reason="other"' in line for line in rejected)


def test_a_storm_and_a_node_flood_do_not_grow_the_page_and_lose_no_count():
    """10,000 CPU transitions and 10,000 Node updates: the page after them has the series it had
    after the first hundred (label sets are bounded, not per event), and every transition is
    in the counter."""
    s = Stream(kubernetes=True)
    s.snapshot(0, cpus=2)
    s.node(0.01, cpu=2)

    def flap(first: int, n: int) -> None:
        for i in range(first, first + n):
            t = 1.0 + i * 0.035
            s.transition(t, Resource.CPU, 1, Direction.OFFLINE if i % 2 == 0 else Direction.ONLINE)
            s.node(t + 0.01, cpu=1 if i % 2 == 0 else 2)  # the kubelet following every step

    flap(0, 100)
    early = len(lines(s.metrics))
    flap(100, 9_900)
    rendered = lines(s.metrics)
    assert len(rendered) == early
    total = sum(float(line.split()[-1])
                for line in named(rendered, 'node_resize_kernel_transitions_total{')
                if 'result="success"' in line)
    assert total == 10_000
