"""What a plan costs with many pods and memory blocks.

    .venv/bin/python -m bench.plan_cost [--pods 10000] [--blocks 4096] [--containers 1000]
                                        [--budgets 10000]

10,000 pods (bench/forecast.py's, with 5m CPU and 16 MiB each) on a 64-CPU, 512 GiB node of 4,096
memory blocks of 128 MiB (a quarter in ZONE_MOVABLE, the rest in Normal with their page flags
already read: the planner's part, not the kernel's), and the running containers of the first
`--containers` pods. Prints the median of repeats, in milliseconds, of:
- a plan that hurts nothing (-1 CPU, -4 GiB): the forecast's O(1) path;
- a plan that rejects pods (-40 CPUs): one pass over every pod in readmission order;
- the same with `--budgets` PodDisruptionBudgets read (10,000: 2,000 select 5 pods each, the
  rest select none, 200 a namespace): each eviction listed (the first 20 rejected pods) judged
  against its namespace's budgets;
- a plan that takes 2,000 blocks (-250 GiB: 250 whole 1 GiB DIMMs), with every block judged;
- the unpluggable gauges (the largest safe removal, by bisection over plans).
Reading the page flags is the kernel's part: bench/plan_kernel.py times it (about 8 ms a block).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import Counter

from bench.forecast import T0, node, pods
from exporter.correlate.readmission_forecast import ReadmissionForecast
from exporter.correlate.running_pods_view import RunningPodsView
from exporter.events import (
    ContainerCgroup,
    CpuManagerCheckpoint,
    KernelSnapshot,
    MemoryManagerCheckpoint,
    PdbStatus,
    Resource,
    RunningContainers,
)
from exporter.plan.eviction import Budgets
from exporter.plan.model import Change
from exporter.plan.pages import KPF_BUDDY, KPF_LRU, KPF_SLAB
from exporter.plan.planner import Inputs, judge_blocks, plan, unpluggable
from exporter.sources.kernel.memory_blocks import HotplugHardware, MemoryBlock
from exporter.sources.kernel.memory_devices import (
    KIND_BOOT,
    KIND_DIMM,
    MemoryDevice,
    MemoryDevices,
)

GiB = 2**30
BLOCK = 128 * 2**20


def ms(f, repeat: int = 9) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def budgets(n: int) -> Budgets:
    """`n` budgets over bench/forecast.py's 50 namespaces: one per app label (pods i with the
    same i % 2,000, so one namespace; every third allows no disruption, the others 2), the
    rest selecting nothing."""
    apps = min(n, 2000)
    return Budgets.of(PdbStatus(
        T0, f"ns{k % 50}", f"pdb-{k:05d}", "set",
        (("app", f"a{k}" if k < apps else f"other-{k}"),),
        disruptions_allowed=0 if k % 3 == 0 else 2, current_healthy=5, desired_healthy=3)
        for k in range(n))


def build(n_pods: int, n_blocks: int, n_containers: int) -> Inputs:
    cpus = 64
    online = frozenset(range(cpus))
    snap = KernelSnapshot(time=T0, cpus_online=online, cpus_offline=frozenset(),
                          cpus_present=online, cpus_possible=online,
                          memory_block_size=BLOCK, memory_blocks_online=frozenset(
                              range(n_blocks)), memory_blocks_offline=frozenset(),
                          mem_total_bytes=n_blocks * BLOCK, swap_total_bytes=0)
    free = Counter({KPF_BUDDY: 30000, KPF_LRU: 2768})
    busy = Counter({KPF_BUDDY: 30000, KPF_LRU: 2000, KPF_SLAB: 768})
    blocks = tuple(MemoryBlock(n, True, ("Movable",)) if n >= n_blocks * 3 // 4 else
                   MemoryBlock(n, True, ("Normal",), True, free if (n // 8) % 2 else busy)
                   for n in range(n_blocks))
    # Memory in the hypervisor's units: the first 4 GiB boot memory, the rest 1 GiB DIMMs
    # (8 blocks each), every other one in Normal holding slab pages (kept whole).
    boot = [n for n in range(n_blocks) if n * BLOCK < 4 * GiB]
    dimms = [MemoryDevice(f"PNP0C80:{i:02X}", KIND_DIMM, tuple(range(n, n + 8)), n * BLOCK,
                          8 * BLOCK, 8 * BLOCK, slot=i)
             for i, n in enumerate(range(len(boot), n_blocks, 8))]
    devices = MemoryDevices((*dimms, MemoryDevice("boot", KIND_BOOT, tuple(boot))),
                            {b: d.id for d in dimms for b in d.blocks}, {}, BLOCK)
    hw = HotplugHardware(frozenset(range(1, cpus)), BLOCK, blocks, "online_movable",
                         devices=devices, mem_available=n_blocks * BLOCK * 3 // 4)
    forecast = ReadmissionForecast()
    forecast.on_snapshot(snap)
    forecast.on_node(dataclasses.replace(
        node(float(cpus)), capacity={Resource.CPU: float(cpus), Resource.MEMORY: float(
            n_blocks * BLOCK)}, allocatable={Resource.CPU: cpus - 1.0, Resource.MEMORY: float(
                n_blocks * BLOCK - 8 * GiB)}))
    events = [dataclasses.replace(p, admission_requests={Resource.CPU: 0.005,
                                                         Resource.MEMORY: 16.0 * 2**20},
                                  labels=(("app", f"a{i % 2000}"),))
              for i, p in enumerate(pods(n_pods))]
    for p in events:
        forecast.on_pod(p)
    forecast.result()
    view = RunningPodsView()
    view.handle(snap)
    view.handle(RunningContainers(T0, 2, tuple(
        ContainerCgroup(p.uid, f"{i:064x}", "burstable", cpus=online, cpu_limit=1.0)
        for i, p in enumerate(events[:n_containers]))))
    return Inputs(snap, hw, forecast, view,
                  CpuManagerCheckpoint(T0, "/var/lib/kubelet/cpu_manager_state", False),
                  MemoryManagerCheckpoint(T0, "/var/lib/kubelet/memory_manager_state", False),
                  pods={p.uid: p for p in events})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--containers", type=int, default=1000)
    ap.add_argument("--budgets", type=int, default=10_000)
    args = ap.parse_args()
    inputs = build(args.pods, args.blocks, args.containers)
    t0 = time.perf_counter()
    read = budgets(args.budgets)
    snapshot_ms = (time.perf_counter() - t0) * 1000
    with_budgets = dataclasses.replace(inputs, budgets=read)
    judged = plan(Change(-40, 0), with_budgets)
    blocked = sum(1 for v in judged.pdb.values() if v.blocked)
    assert judged.pdb and judged.inputs.get("pod_disruption_budgets") == "read" and blocked, \
        (judged.inputs, blocked)
    verdicts = judge_blocks(inputs.hardware, None, 0)
    safe = plan(Change(-1, -4 * GiB), inputs)
    hurt = plan(Change(-40, 0), inputs)
    big = plan(Change(0, -250 * GiB), inputs)
    assert safe.safe and hurt.rejected_total > 0 and len(big.memory_take) == 2000, \
        (safe.verdict, safe.harm, safe.unjudged, hurt.rejected_total, len(big.memory_take))
    rows = [
        ("plan -1 CPU -4 GiB (hurts nothing)", ms(lambda: plan(Change(-1, -4 * GiB), inputs))),
        ("plan -40 CPUs (pods rejected)", ms(lambda: plan(Change(-40, 0), inputs))),
        (f"the same, {len(read):,} budgets read", ms(lambda: plan(Change(-40, 0), with_budgets))),
        (f"{len(read):,} budgets made a snapshot", snapshot_ms),
        ("plan -250 GiB (2,000 blocks)", ms(lambda: plan(Change(0, -250 * GiB), inputs))),
        ("judge every block", ms(lambda: judge_blocks(inputs.hardware, None, 0))),
        ("unpluggable gauges", ms(lambda: unpluggable(inputs, verdicts), repeat=3)),
    ]
    print(f"{args.pods} pods, {args.blocks} blocks, {args.containers} running containers, "
          f"{len(read)} budgets ({len(judged.pdb)} evictions judged, {blocked} refused)")
    for name, value in rows:
        print(f"  {name:40s} {value:8.1f} ms")


if __name__ == "__main__":
    main()
