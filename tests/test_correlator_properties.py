"""Episode correlator invariants under random event streams (hypothesis)."""
from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.correlate import CorrelatorConfig
from testkit.correlator import config as correlator_config
from exporter.correlate.model import Outcome, Phase, UpdateKind
from exporter.events import (Change, ContainerResize, Direction, KernelSnapshot, NodeStatus,
                             PodResourcesAllocatable, PodsRelisted, PodStatus, Resource, Result,
                             SourceStatus, Transition)
from tests.correlator_stream import BLOCK, GiB, Stream

CPU, MEM = Resource.CPU, Resource.MEMORY
UIDS = ("a", "b", "c", "bal")
# Repeats weight the draw towards pods that run and pods that admission rejects.
PHASES = ("Pending", "Running", "Running", "Succeeded", "Failed", "Failed")
REASONS = ("", "OutOfcpu", "OutOfcpu", "OutOfmemory", "OutOfpods", "UnexpectedAdmissionError",
           "Evicted")

configs = st.builds(
    correlator_config,
    coalesce_window=st.sampled_from([0.5, 2.0]),
    resync_deadline=st.sampled_from([5.0, 60.0]),
    readmission_settle=st.sampled_from([1.0, 10.0]),
    kubernetes=st.booleans())

# Each step: (seconds to advance the clock, how far in the past the event is stamped, event).
transitions = st.tuples(st.just("transition"), st.sampled_from([CPU, MEM]),
                        st.integers(0, 3), st.sampled_from(list(Direction)),
                        st.sampled_from([Result.SUCCESS] * 3 + [Result.FAILED]),
                        st.sampled_from([None, 0.03125]))
# Narrow value ranges, so that kernel and Node often agree and episodes reach every phase.
snapshots = st.tuples(st.just("snapshot"), st.integers(1, 3), st.integers(191, 193))
nodes = st.tuples(st.just("node"), st.integers(1, 3), st.integers(191, 193))
# A kubelet restart: the Node reports what the kernel has (both events, same values).
restarts = st.tuples(st.just("restart"), st.integers(1, 3), st.integers(191, 193))
pods = st.tuples(st.just("pod"), st.sampled_from(UIDS), st.sampled_from(PHASES),
                 st.sampled_from(REASONS), st.booleans(), st.booleans(),
                 st.sampled_from(["", "Deferred", "Infeasible"]), st.booleans(),
                 st.integers(1, 3), st.integers(1, 3))
relists = st.tuples(st.just("relist"), st.frozensets(st.sampled_from(UIDS)))
podresources = st.tuples(st.just("podresources"),
                         st.one_of(st.none(), st.frozensets(st.integers(0, 4))))
others = st.tuples(st.just("other"))
ticks = st.tuples(st.just("tick"))
steps = st.lists(st.tuples(
    st.sampled_from([0.0, 0.25, 0.25, 1.0, 1.0, 3.0, 20.0]), st.sampled_from([0.0, 0.0, 0.5]),
    # Listed twice: drawn more often.
    st.one_of(transitions, transitions, snapshots, nodes, restarts, restarts, pods, pods, pods,
              relists, podresources, others, ticks)),
    min_size=20, max_size=80)


def build(step: tuple, t: float):
    kind = step[0]
    if kind == "transition":
        _, resource, unit, direction, result, duration = step
        return Transition(source="bpf", resource=resource, unit=unit, direction=direction,
                          result=result, end=t, start=None if duration is None else t - duration,
                          error=None if result is Result.SUCCESS else "EBUSY")
    if kind == "snapshot":
        _, cpus, blocks = step
        online, possible = frozenset(range(cpus)), frozenset(range(4))
        return KernelSnapshot(time=t, cpus_online=online, cpus_offline=possible - online,
                              cpus_present=possible, cpus_possible=possible,
                              memory_block_size=BLOCK,
                              memory_blocks_online=frozenset(range(blocks)),
                              memory_blocks_offline=frozenset(), mem_total_bytes=blocks * BLOCK,
                              swap_total_bytes=0)
    if kind == "node":
        _, cpus, blocks = step
        capacity = {CPU: float(cpus), MEM: float(blocks * BLOCK)}
        return NodeStatus(time=t, node="n1", capacity=capacity, allocatable=capacity)
    if kind == "pod":
        _, uid, phase, reason, ready, deleted, pending, error, desired, applied = step
        balloon = uid == "bal"
        return PodStatus(time=t, uid=uid, namespace="ns", name=uid, phase=phase, reason=reason,
                         ready=ready, deleted=deleted, balloon=balloon,
                         requests={CPU: float(applied), MEM: 1.0 * GiB},
                         resize=ContainerResize(pending_reason=pending, in_progress_error=error,
                                                desired={CPU: float(desired)},
                                                applied={CPU: float(applied)}))
    if kind == "relist":
        return PodsRelisted(time=t, uids=step[1])
    if kind == "podresources":
        return PodResourcesAllocatable(time=t, cpu_ids=step[1])
    if kind == "other":
        return SourceStatus(source="bpf", up=True, time=t)
    return None  # tick


def run(config: CorrelatorConfig, plan: list) -> Stream:
    s = Stream(config)
    for advance, lag, step in plan:
        s.clock.advance(advance)
        if step[0] == "restart":
            events = [build(("snapshot", *step[1:]), s.clock.now() - lag),
                      build(("node", *step[1:]), s.clock.now())]
        else:
            events = [build(step, s.clock.now() - lag)]
        for event in events:
            s.push_tick() if event is None else s.push(event)
            check(s)
    s.clock.advance(10_000.0)  # past every deadline and settle window
    s.push_tick()
    check(s)
    return s


def check(s: Stream) -> None:
    stats, updates, view = s.stats, s.updates, s.view
    for resource in (CPU, MEM):
        resync_errors = sum(n for (r, _), n in stats.resync_errors.items() if r is resource)
        unplug_errors = sum(n for (r, _), n in stats.unplug_errors.items() if r is resource)
        assert 0 <= resync_errors <= stats.resync_requests[resource]
        assert 0 <= unplug_errors <= stats.unplug_requests[resource]
        for change in Change:
            hist = stats.resync_duration[(resource, change)]
            requests = stats.resync_requests if change is Change.INCREASE else stats.unplug_requests
            assert hist.n <= requests[resource] and hist.total >= 0
        assert stats.readmission_duration[resource].n <= stats.unplug_requests[resource]
    open_eps = s.open_episodes()
    assert len(open_eps) == s.correlator.episodes_open() == stats.episodes_open
    assert all(ep.outcome is None and ep.phase is not Phase.ENDED for ep in open_eps)

    ended = [u.episode for u in updates if u.kind is UpdateKind.ENDED]
    ended_ids = Counter(ep.id for ep in ended)
    assert all(n == 1 for n in ended_ids.values()), "an episode ended twice"
    assert not set(ended_ids) & {ep.id for ep in open_eps}
    for ep in ended:
        assert isinstance(ep.outcome, Outcome) and ep.phase is Phase.ENDED
        assert ep.ended is not None and ep.ended >= ep.opened
        if ep.outcome is Outcome.KERNEL_ONLY:
            assert not s.config.kubernetes or ep.resynced is None
    # Every request is one episode, open or ended exactly once.
    requests = sum(stats.resync_requests.values()) + sum(stats.unplug_requests.values())
    assert requests == len(ended) + len(open_eps)
    assert sum(stats.episodes_ended.values()) == len(ended)

    # Gauges never fail and never go negative where they cannot.
    assert all(v >= 0 for v in view.drift_seconds().values())
    view.drift(), view.effective(), view.kubelet_capacity()
    view.kubelet_allocatable(), view.balloon_requests()
    assert view.balloon_pods() >= 0
    offline = view.podresources_offline_cpus()
    allocatable = view.podresources_allocatable_cpus()
    assert offline is None or (allocatable is not None and 0 <= offline <= allocatable)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, plan=steps)
def test_random_streams_keep_the_invariants(config, plan):
    s = run(config, plan)
    assert s.correlator.episodes_open() == 0  # every deadline passed: nothing stays open forever


@settings(max_examples=100, deadline=None)
@given(config=configs, plan=steps)
def test_random_streams_replay_identically(config, plan):
    def summary(updates):
        return [(u.kind, u.episode.id, u.episode.outcome, u.time, len(u.episode.pods))
                for u in updates]

    first = run(config, plan).updates
    second = run(config, plan).updates
    assert summary(first) == summary(second)
