"""A synthetic event stream for the episode correlator: a fake clock and event builders.

Offsets are seconds after T0 and chosen as binary fractions (0.25, 0.0078125, ...) so that the
sums and differences the tests assert are exact in floating point.
"""
from __future__ import annotations

import threading

from exporter.clock import FakeClock
from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.correlator import Correlator
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.model import Episode, EpisodeUpdate, UpdateKind
from exporter.correlate.node_view import NodeView
from exporter.events import (
    ContainerResize,
    Direction,
    KernelSnapshot,
    NodeStatus,
    PodResourcesAllocatable,
    PodsRelisted,
    PodStatus,
    Resource,
    Result,
    Transition,
)
from exporter.sources import registry
from testkit.correlator import config as correlator_config

T0 = 1_700_000_000.0
GiB = 2**30
MiB = 2**20
BLOCK = 128 * MiB


class Stream:
    """The correlator as the agent drives it: each event to the metrics sink (on_event), then
    to the correlator; every update it returns to the metrics sink (on_update)."""

    def __init__(self, config: CorrelatorConfig | None = None, **settings) -> None:
        from exporter.sinks.metrics import MetricsSink

        self.clock = FakeClock(T0)
        self.config = config if config is not None else correlator_config(**settings)
        ledger = KernelLedger()
        self.view = NodeView(self.config, self.clock)
        self.correlator = Correlator(self.config, self.clock, ledger=ledger, view=self.view)
        self.metrics = MetricsSink(threading.Lock(), ledger, self.view,
                                   lossy=registry.lossy_names())
        self.stats = self.metrics.stats
        self.updates: list[EpisodeUpdate] = []

    def _take(self, new: list[EpisodeUpdate]) -> list[EpisodeUpdate]:
        for update in new:
            self.metrics.on_update(update)
        self.updates += new
        return new

    def open_episodes(self) -> list[Episode]:
        return self.correlator.open_episodes()

    def resume(self, episodes: list[Episode]) -> list[EpisodeUpdate]:
        return self._take(self.correlator.resume(episodes))

    # ---------------------------------------------------------------- driving

    def at(self, offset: float) -> float:
        t = T0 + offset
        assert t >= self.clock.t, "the clock never runs backwards"
        self.clock.t = t
        return t

    def feed(self, offset: float, event) -> list[EpisodeUpdate]:
        self.at(offset)
        return self.push(event)

    def push(self, event) -> list[EpisodeUpdate]:
        """Feed an event at the clock's current time."""
        self.metrics.on_event(event)
        return self._take(self.correlator.handle(event))

    def tick(self, offset: float) -> list[EpisodeUpdate]:
        self.at(offset)
        return self.push_tick()

    def push_tick(self) -> list[EpisodeUpdate]:
        return self._take(self.correlator.tick())

    def ended(self) -> list[Episode]:
        return [u.episode for u in self.updates if u.kind is UpdateKind.ENDED]

    def kinds(self, episode_id: str) -> list[UpdateKind]:
        return [u.kind for u in self.updates if u.episode.id == episode_id]

    # ---------------------------------------------------------------- kernel events

    def transition(self, offset: float, resource: Resource, unit: int, direction: Direction,
                   result: Result = Result.SUCCESS, duration: float = 0.0078125,
                   **extra) -> list[EpisodeUpdate]:
        """A transition that ended at `offset` (fed at that time)."""
        end = T0 + offset
        return self.feed(offset, Transition(
            source="bpf", resource=resource, unit=unit, direction=direction, result=result,
            end=end, start=end - duration, **extra))

    def snapshot(self, offset: float, cpus: int = 2, mem: float = 24 * GiB,
                 cpus_possible: int = 16) -> list[EpisodeUpdate]:
        online = frozenset(range(cpus))
        possible = frozenset(range(max(cpus, cpus_possible)))
        return self.feed(offset, KernelSnapshot(
            time=T0 + offset, cpus_online=online, cpus_offline=possible - online,
            cpus_present=possible, cpus_possible=possible, memory_block_size=BLOCK,
            memory_blocks_online=frozenset(range(int(mem) // BLOCK)),
            memory_blocks_offline=frozenset(), mem_total_bytes=int(mem), swap_total_bytes=0))

    # ---------------------------------------------------------------- Kubernetes events

    def node(self, offset: float, cpu: float = 2, mem: float = 24 * GiB,
             alloc_cpu: float | None = None, alloc_mem: float | None = None,
             ) -> list[EpisodeUpdate]:
        return self.feed(offset, NodeStatus(
            time=T0 + offset, node="n1",
            capacity={Resource.CPU: float(cpu), Resource.MEMORY: float(mem)},
            allocatable={Resource.CPU: float(cpu if alloc_cpu is None else alloc_cpu),
                         Resource.MEMORY: float(mem if alloc_mem is None else alloc_mem)}))

    def pod(self, offset: float, uid: str, phase: str = "Running", reason: str = "",
            ready: bool = True, **extra) -> list[EpisodeUpdate]:
        return self.feed(offset, PodStatus(
            time=T0 + offset, uid=uid, namespace="default", name=f"pod-{uid}", phase=phase,
            reason=reason, ready=ready, **extra))

    def balloon(self, offset: float, uid: str, requests: dict, desired: dict | None = None,
                applied: dict | None = None, pending: str = "", error: bool = False,
                ) -> list[EpisodeUpdate]:
        resize = None if desired is None else ContainerResize(
            pending_reason=pending, in_progress=bool(error), in_progress_error=error,
            desired=desired, applied=applied or {})
        return self.pod(offset, uid, balloon=True, requests=requests, resize=resize)

    def relist(self, offset: float, *uids: str) -> list[EpisodeUpdate]:
        return self.feed(offset, PodsRelisted(time=T0 + offset, uids=frozenset(uids)))

    def podresources(self, offset: float, cpu_ids) -> list[EpisodeUpdate]:
        return self.feed(offset, PodResourcesAllocatable(
            time=T0 + offset, cpu_ids=None if cpu_ids is None else frozenset(cpu_ids)))
