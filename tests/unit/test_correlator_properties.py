"""Episode correlator invariants under random event streams (hypothesis)."""
from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings

from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.model import Outcome, Phase, UpdateKind
from exporter.events import Change
from testkit.correlator_plans import CPU, MEM, build, configs, steps
from testkit.correlator_stream import Stream


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
