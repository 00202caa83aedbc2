"""The exporter's in-process pieces on a recorded kubelet sequence.

The real Node and Pod list/watch sources (lightkube, exporter/sources/kube_*.py) watch a
FakeApiServer that publishes a recording event by event; what they emit goes, as the agent
sends it, to the correlator and the metrics sink (testkit/correlator_stream.Stream), on an
injected clock the test sets to the recording's own times. The kernel side, where a recording
needs it, is injected too (a Transition and a KernelSnapshot): the recordings hold no kernel.
After each published event the test waits for the source to have handled it (its
resourceVersion), then reads /metrics as the sink renders it: exact values, no timing.
"""
from __future__ import annotations

import json
import threading
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from exporter.events import Direction, KernelSnapshot, Resource, Result, Transition
from exporter.sources.apiserver.kube_lease import KubeLeaseSource
from exporter.sources.apiserver.kube_node import KubeNodeSource
from exporter.sources.apiserver.kube_pods import BALLOON_SELECTOR, KubePodsSource
from testkit.correlator_stream import Stream
from testkit.exporter_proc import Scrape, poll_until
from testkit.fakes.apiserver import FakeApiServer

RECORDINGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kubelet-v1.36"
NODE = "vm"  # the recorded node's name
NODE_MEMORY = 24684084 * 1024  # the recorded Node's capacity.memory (24684084Ki)


def at(stamp: str) -> float:
    """'08:21:44' on the recording's day, or a full RFC 3339 time -> epoch seconds."""
    text = stamp if "T" in stamp else f"2026-11-23T{stamp}Z"
    return datetime.fromisoformat(text).timestamp()


def recording(name: str) -> list[dict]:
    with open(RECORDINGS / name) as f:
        return [json.loads(line) for line in f if line.strip()]


class Replay:
    def __init__(
        self,
        api: FakeApiServer,
        *,
        settle: float = 10.0,
        selector: str = BALLOON_SELECTOR.default,
        priority_classes: tuple[str, ...] = (),
        lease: bool = False,
    ):
        self.api = api
        self.stream = Stream(kubernetes=True, readmission_settle=settle)
        self.clock = self.stream.clock
        self.lock = threading.Lock()
        common = dict(node_name=NODE, kubeconfig=api.kubeconfig_path, backoff_initial=0.05)
        self.sources = {
            "nodes": KubeNodeSource(self.clock, **common),
            "pods": KubePodsSource(
                self.clock,
                balloon_selector=selector,
                balloon_priority_classes=priority_classes,
                **common,
            ),
        }
        if lease:  # the node's Lease in kube-node-lease (no recording has one)
            self.sources["leases"] = KubeLeaseSource(self.clock, **common)
        self.registry = CollectorRegistry()
        self.registry.register(self.stream.metrics)
        self.emitted: list = []  # every event the watch sources emitted, in order

    def __enter__(self) -> "Replay":
        for source in self.sources.values():
            source.open()
            source.start(self._emitter(source.name))
        self.api.wait_for_watches(len(self.sources))
        return self

    def __exit__(self, *exc) -> None:
        for source in self.sources.values():
            source.stop()

    def _emitter(self, name: str):
        def emit(event) -> None:
            with self.lock:
                self.emitted.append(event)
                self.stream.metrics.on_event(event)
                self.stream._take(self.stream.correlator.handle(event, name))

        return emit

    # ------------------------------------------------------------ driving

    def set_clock(self, when: float) -> None:
        assert when >= self.clock.t, "the clock never runs backwards"
        self.clock.t = when

    def publish(self, event: dict, when: float | None = None) -> dict:
        """Publish one recorded event at `when` and wait until its watch has handled it."""
        if when is not None:
            self.set_clock(when)
        return self.seen(self.api.publish_recorded(event))

    def seen(self, published: dict) -> dict:
        """Wait until the watch of `published`'s kind has handled it (its resourceVersion)."""
        collection = {"Node": "nodes", "Pod": "pods", "Lease": "leases"}[published["kind"]]
        source = self.sources[collection]
        rv = published["metadata"]["resourceVersion"]
        poll_until(
            lambda: source.resource_version,
            lambda v: v is not None and int(v) >= int(rv),
            10.0,
            0.005,
            lambda v: AssertionError(f"{collection} watch at RV {v}, never reached {rv}"),
        )
        return published

    def kernel(
        self, when: float, cpus: int, cpu: int = 1, direction: Direction | None = None
    ) -> None:
        """The kernel side at `when`: a CPU transition (when `direction`), then the snapshot
        with `cpus` CPUs online of 2, memory as the recorded Node's."""
        self.set_clock(when)
        with self.lock:
            if direction is not None:
                self._push(
                    Transition(
                        source="bpf",
                        resource=Resource.CPU,
                        unit=cpu,
                        direction=direction,
                        result=Result.SUCCESS,
                        end=when,
                        start=when - 0.0078125,
                    )
                )
            online = frozenset(range(cpus))
            self._push(
                KernelSnapshot(
                    time=when,
                    cpus_online=online,
                    cpus_offline=frozenset({0, 1}) - online,
                    cpus_present=frozenset({0, 1}),
                    cpus_possible=frozenset({0, 1}),
                    memory_block_size=128 * 2**20,
                    memory_blocks_online=frozenset(),
                    memory_blocks_offline=frozenset(),
                    mem_total_bytes=NODE_MEMORY,
                    swap_total_bytes=0,
                ),
                "sysfs",
            )

    def _push(self, event, source: str | None = None) -> None:
        self.stream.metrics.on_event(event)
        self.stream._take(self.stream.correlator.handle(event, source))

    def tick(self, when: float) -> None:
        self.set_clock(when)
        with self.lock:
            self.stream.push_tick()

    def scrape(self) -> Scrape:
        with self.lock:
            return Scrape(generate_latest(self.registry).decode())
