"""How long a kernel event waits for the agent while scrapes and plans run (issue 34).

    nice .venv/bin/python -m bench.lock_wait [--pods 1000 10000] [--containers 1000 4096]
                                             [--events 400] [--json PATH]

An agent wired as exporter/app.py serve wires it (no sources): the Correlator, the
running-pods sink, the plan sink (its gauges' thread started) and the Collectors /metrics
renders, on a fake sysfs tree of 64 CPUs and 64 memory blocks. It is fed a Node of 64 CPUs,
`--pods` pods (bench/forecast.py's, 10m CPU and 64 MiB each, listed: the forecast is valid) and
a scan of `--containers` running containers; then the main thread hands the agent a kernel
snapshot every 20 ms (one CPU fewer, then back), as the agent's loop hands an event on
(every sink, then the Correlator under the agent's lock), and times each: the time from the
kernel event to the state /metrics serves. Twice:
- quiet: nothing else runs (no scrape, no plan, the gauges' thread not started);
- loaded: one thread scrapes /metrics back to back through the endpoint's Exposition (which
  renders every Collector again whenever the agent's state changed: here after every event,
  50 a second), another asks GET /plan?cpu=-8 at the route's rate limit (PLAN_RATE a second),
  and the plan sink's thread works the gauges out after each change.
Prints p50/p99/max of both, of which the time spent waiting for the agent's lock and the two
sinks' (the rest is the work and, loaded, waiting for the GIL: three more threads run Python),
and the difference of the p99s (target: at most 2 ms).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bench.forecast import T0, node, pods
from exporter.agent import SWITCH_INTERVAL, Agent
from exporter.clock import FakeClock
from exporter.correlate.correlator import Correlator
from exporter.events import (
    ContainerCgroup,
    KernelSnapshot,
    PodsRelisted,
    RunningContainers,
    SourceStatus,
)
from exporter.sinks.forecast_collector import ForecastCollector
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.plan_collector import PlanSink, SharedViews
from exporter.sinks.running_pods_collector import RunningPodsSink
from exporter.web.exposition import Exposition
from exporter.web.routes import PLAN_RATE
from testkit.correlator import config
from testkit.plan import fake_host

CPUS = 64
GiB = 2**30


def snapshot(online: int, when: float) -> KernelSnapshot:
    cpus = frozenset(range(online))
    return KernelSnapshot(time=when, cpus_online=cpus,
                          cpus_offline=frozenset(range(CPUS)) - cpus,
                          cpus_present=frozenset(range(CPUS)),
                          cpus_possible=frozenset(range(CPUS)), memory_block_size=128 << 20,
                          memory_blocks_online=frozenset(range(64)),
                          memory_blocks_offline=frozenset(), mem_total_bytes=1024 * GiB,
                          swap_total_bytes=0)


class TimedLock:
    """A threading.Lock that adds up how long the measuring thread waited to take it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner = threading.get_ident()  # the thread whose waits count
        self.waited = 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.get_ident() != self.owner:
            return self._lock.acquire(blocking, timeout)
        began = time.perf_counter()
        got = self._lock.acquire(blocking, timeout)
        self.waited += time.perf_counter() - began
        return got

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()


@dataclasses.dataclass
class World:
    agent: Agent
    plan: PlanSink
    registry: CollectorRegistry
    locks: list[TimedLock]

    def waited(self) -> float:
        return sum(lock.waited for lock in self.locks)


def build(root: Path, n_pods: int, n_containers: int) -> World:
    sysfs, procfs = fake_host(root, cpus=CPUS, blocks={
        n: ("online", "Movable" if n >= 32 else "Normal") for n in range(64)})
    clock = FakeClock(T0)
    agent = Agent(Correlator(config(kubernetes=True), clock), [], [], clock)
    locks = [TimedLock(), TimedLock(), TimedLock()]  # the agent's, the two sinks'
    agent.lock = locks[0]  # type: ignore[assignment]
    running = RunningPodsSink.attach(agent)
    running.lock = locks[1]  # type: ignore[assignment]
    plan = PlanSink.attach(agent, SharedViews.of(agent, running, KubeletSink.attach(agent)),
                           sysfs, procfs, kubernetes=True)
    plan.lock = locks[2]  # type: ignore[assignment]
    registry = CollectorRegistry(auto_describe=True)
    registry.register(running)
    registry.register(plan)
    registry.register(ForecastCollector(agent.lock, agent.correlator.forecast,
                                        agent.correlator.forecast_validity))
    listed = pods(n_pods)
    agent._process("sysfs", snapshot(CPUS, T0))
    agent._process("kube_node", node(float(CPUS)))
    for pod in listed:
        agent._process("kube_pods", pod)
    agent._process("kube_pods", PodsRelisted(T0, frozenset(p.uid for p in listed)))
    agent._process("kube_pods", SourceStatus("kube_pods", True, T0, "listed pods"))
    agent._process("running_pods", RunningContainers(T0, 2, tuple(
        ContainerCgroup(listed[i % n_pods].uid, f"{i:064x}", "burstable",
                        cpus=frozenset(range(CPUS)), cpu_limit=1.0)
        for i in range(n_containers))))
    return World(agent, plan, registry, locks)


def run(world: World, events: int, loaded: bool) -> tuple[list[float], list[float]]:
    stop = threading.Event()
    threads: list[threading.Thread] = []
    counts = {"scrapes": 0, "plans": 0}

    exposition = Exposition(world.registry, world.agent.state_version)

    def scrape() -> None:
        while not stop.is_set():
            exposition.get()
            counts["scrapes"] += 1
            time.sleep(0.001)  # scrapers back to back, each a request of its own

    def plans() -> None:
        while not stop.wait(1.0 / PLAN_RATE):
            status, _ = world.plan.http("cpu=-8")
            assert status == 200, status
            counts["plans"] += 1

    if loaded:
        world.plan.start()
        threads = [threading.Thread(target=f, daemon=True) for f in (scrape, plans)]
        for t in threads:
            t.start()
    took, waits = [], []
    try:
        for i in range(events):
            event = snapshot(CPUS - 1 if i % 2 == 0 else CPUS, T0 + 1 + i)
            waited = world.waited()
            began = time.perf_counter()
            world.agent._process("sysfs", event)
            took.append((time.perf_counter() - began) * 1000)
            waits.append((world.waited() - waited) * 1000)
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        if loaded:
            world.plan.close()
    if loaded:
        print(f"    ({counts['scrapes']} scrapes, {exposition.renderings} renderings, "
              f"{counts['plans']} plans, "
              f"{world.plan.gauge_runs} gauge computations)", flush=True)
    return took, waits


def summary(waits: list[float]) -> dict[str, float]:
    ordered = sorted(waits)
    return {"p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max": ordered[-1]}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--containers", type=int, nargs="+", default=[1000, 4096])
    ap.add_argument("--events", type=int, default=400)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    sys.setswitchinterval(SWITCH_INTERVAL)  # as Agent.run sets it
    results: list[dict[str, Any]] = []
    for n_pods in args.pods:
        for n_containers in args.containers:
            with tempfile.TemporaryDirectory() as tmp:
                world = build(Path(tmp), n_pods, n_containers)
                gc.collect()  # as Agent.run does once started: what exists now is frozen
                gc.freeze()
                print(f"{n_pods} pods, {n_containers} running containers", flush=True)
                quiet_took, quiet_waits = run(world, args.events, loaded=False)
                loaded_took, loaded_waits = run(world, args.events, loaded=True)
            quiet, loaded = summary(quiet_took), summary(loaded_took)
            row = {"pods": n_pods, "containers": n_containers, "quiet": quiet,
                   "loaded": loaded, "p99_more_ms": loaded["p99"] - quiet["p99"],
                   "lock_wait_quiet": summary(quiet_waits),
                   "lock_wait_loaded": summary(loaded_waits)}
            results.append(row)
            for name, took, waits in (("quiet", quiet, row["lock_wait_quiet"]),
                                      ("loaded", loaded, row["lock_wait_loaded"])):
                print(f"  {name:6s} event to served state: p50 {took['p50']:.3f} p99 "
                      f"{took['p99']:.3f} max {took['max']:.2f} ms; of which waiting for "
                      f"locks: p99 {waits['p99']:.3f} max {waits['max']:.2f} ms", flush=True)
            print(f"  p99 +{row['p99_more_ms']:.3f} ms with the plan traffic", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
