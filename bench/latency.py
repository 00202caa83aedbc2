"""Detection latency: real cpu1 and memory-block transitions, three observers.

For each transition, in one run:
- hook: the real agent in this process (bench.observe); kernel end -> correlator state. Kernel
  end is the BPF record's end stamp for CPUs; for memory blocks on kernels where BPF cannot see
  them (no kprobes here) it is the moment the sysfs write returned.
- scrape: a separate `node-resize-exporter run` process, polled right after the sysfs write
  returned until its node_resize_kernel_transitions_total moved. An upper bound: it includes the
  HTTP round trip (a fresh connection each poll), and its resolution is one scrape.
- node_exporter: scraped every 1 s and every 15 s from a random phase; a transition counts as
  shown when a scrape before the next transition shows the new state.
Transitions are held for a random time in `hold` (seconds) so the peer's scrapes do not alias.
"""
from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.observe import Arrival, InProcessAgent, PeriodicScraper, Sample
from bench.procs import NodeExporter, ResizeExporter, Scraper, cpu_visible, mem_total, value
from bench.stats import Summary
from testkit import kernel

PEER_INTERVALS = (1.0, 15.0)
# How long a transition may take to reach the in-process agent or /metrics before it counts
# as missed (test_bench_smoke asserts none is): generous for a loaded 2-vCPU CI VM. Both waits
# end as soon as it arrives.
POLL_TIMEOUT = 15.0


@dataclass
class Mark:
    """One sysfs write: what was asked, when it returned, and what the observers saw."""

    resource: str  # "cpu" or "memory"
    direction: str  # "online" or "offline"
    w0_wall: float  # agent clock just before the write
    w1_wall: float  # ... and just after it returned
    w1_mono: float  # time.monotonic() just after (the peer scrapers' clock)
    errno: int
    truth: object  # the state after: cpu1 online (bool) or MemTotal bytes
    scrape_ms: float | None = None  # write returned -> scrape showing it (upper bound)
    scrape_resolution_ms: float | None = None  # duration of that scrape


def meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemTotal in /proc/meminfo")


def _counter(text: str, resource: str, direction: str) -> float:
    return value(text, "node_resize_kernel_transitions_total", resource=resource,
                 direction=direction, result="success") or 0.0


def _poll_until_counted(scraper: Scraper, mark: Mark, before: float) -> float:
    """Scrape back to back until the counter passes `before`; returns the new count."""
    deadline = time.monotonic() + POLL_TIMEOUT
    while True:
        t0 = time.monotonic()
        count = _counter(scraper.get(), mark.resource, mark.direction)
        t1 = time.monotonic()
        if count > before:
            mark.scrape_ms = (t1 - mark.w1_mono) * 1e3
            mark.scrape_resolution_ms = (t1 - t0) * 1e3
            return count
        if t1 > deadline:
            return count
        time.sleep(0.0005)  # leave the GIL to the in-process agent between scrapes


def match_arrivals(marks: list[Mark], arrivals: list[Arrival]
                   ) -> tuple[list[tuple[Mark, Arrival]], int]:
    """Each accepted write paired with the first later arrival of its resource and direction;
    and how many writes no arrival matched."""
    used: set[int] = set()
    pairs: list[tuple[Mark, Arrival]] = []
    missed = 0
    for mark in marks:
        if mark.errno:
            continue
        match = next((i for i, a in enumerate(arrivals) if i not in used
                      and a.transition.direction.value == mark.direction
                      and a.transition.resource.value == mark.resource
                      and a.wall >= mark.w0_wall), None)
        if match is None:
            missed += 1
            continue
        used.add(match)
        pairs.append((mark, arrivals[match]))
    return pairs, missed


def kernel_end_ms(mark: Mark, a: Arrival) -> float:
    """Kernel end -> state, ms. BPF records carry the kernel's end stamp; uevents only when
    they were received, so for them the end is the write's return."""
    kernel_end = a.transition.end if a.transition.start is not None else mark.w1_wall
    return (a.wall - kernel_end) * 1e3


def after_write_ms(mark: Mark, a: Arrival) -> float:
    """Write returned -> state, ms (negative when the state had it before the write returned)."""
    return (a.wall - mark.w1_wall) * 1e3


def peer_view(marks: list[Mark], samples: list[Sample], run_end: float) -> dict:
    """Which transitions the peer's scrapes showed before the next one, and how late."""
    done = [m for m in marks if not m.errno]
    shown, latencies = 0, []
    for i, mark in enumerate(done):
        until = done[i + 1].w1_mono if i + 1 < len(done) else run_end
        seen = next((s for s in samples if mark.w1_mono < s.t1 <= until
                     and s.state == mark.truth), None)
        if seen is not None:
            shown += 1
            latencies.append((seen.t1 - mark.w1_mono) * 1e3)
    return {"scrapes": len(samples), "transitions": len(done), "shown": shown,
            "shown_fraction": shown / len(done) if done else 0.0,
            "latency_ms": Summary.of(latencies).as_dict()}


def _drive(resource: str, n: int, hold: tuple[float, float], seed: int,
           write: Callable[[str], int], truth: Callable[[], object],
           first_direction: str, ours: ResizeExporter, agent: InProcessAgent) -> list[Mark]:
    rng = random.Random(seed)
    # A fresh connection per poll: on a kept-alive one, the exporter's two writes per response
    # (headers, then body) meet Nagle and delayed ACK, and each scrape waits ~40 ms.
    scraper = Scraper(ours.port, keepalive=False)
    marks: list[Mark] = []
    direction = first_direction
    try:
        for _ in range(n):
            before = _counter(scraper.get(), resource, direction)
            arrived = agent.sink.count()
            w0 = agent.clock.now()
            err = write(direction)
            w1, w1_mono = agent.clock.now(), time.monotonic()
            if not err:
                # Let the in-process agent take the transition before this thread polls
                # /metrics: both share this process's GIL, and a polling loop holding it
                # delayed the agent's thread by up to a switch interval (1 ms), which a real
                # exporter process, with a GIL of its own, never sees. The first poll starts
                # later by as much; the /metrics figure stays an upper bound.
                agent.sink.wait_beyond(arrived, timeout=POLL_TIMEOUT)
            mark = Mark(resource, direction, w0, w1, w1_mono, err, truth())
            marks.append(mark)
            if not err:
                _poll_until_counted(scraper, mark, before)
                direction = "online" if direction == "offline" else "offline"
            time.sleep(rng.uniform(*hold))
    finally:
        scraper.close()
    return marks


def _run(resource: str, source: str, n: int, hold: tuple[float, float], seed: int,
         write, truth, first_direction: str, peer_extract, peer: bool) -> dict:
    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(ResizeExporter(source))
        agent = stack.enter_context(InProcessAgent((source,)))
        scrapers: list[PeriodicScraper] = []
        if peer:
            node_exporter = stack.enter_context(NodeExporter())
            for k, interval in enumerate(PEER_INTERVALS):
                s = PeriodicScraper(node_exporter.port, interval, peer_extract, seed + k)
                s.start()
                scrapers.append(s)
        marks = _drive(resource, n, hold, seed, write, truth, first_direction, ours, agent)
        time.sleep(0.2)  # a last arrival still in flight
        run_end = time.monotonic()
        peer_samples = [s.finish() for s in scrapers]
        arrivals = agent.sink.snapshot()
    pairs, hook_missed = match_arrivals(marks, arrivals)
    hook = [kernel_end_ms(m, a) for m, a in pairs]
    after_write = [after_write_ms(m, a) for m, a in pairs]
    by_direction = {d: [after_write_ms(m, a) for m, a in pairs if m.direction == d]
                    for d in ("offline", "online")}
    ok = [m for m in marks if not m.errno]
    scrape = [m.scrape_ms for m in ok if m.scrape_ms is not None]
    result = {
        "resource": resource, "source": source, "hold_s": list(hold),
        "writes": len(marks), "transitions": len(ok),
        "refused": sum(1 for m in marks if m.errno),
        "hook_ms": Summary.of(hook).as_dict(), "hook_missed": hook_missed,
        "hook_after_write_ms": Summary.of(after_write).as_dict(),
        # Onlines and offlines apart: code run just after a CPU online is slow on some
        # hypervisors (bench/README.md, profile), offlines are not.
        "hook_after_write_by_direction_ms": {d: Summary.of(v).as_dict()
                                             for d, v in by_direction.items()},
        "scrape_ms": Summary.of(scrape).as_dict(),
        "scrape_missed": len(ok) - len(scrape),
        "scrape_resolution_ms": Summary.of(
            [m.scrape_resolution_ms for m in ok if m.scrape_resolution_ms is not None]).as_dict(),
        "node_exporter": {f"{iv:g}s": peer_view(marks, samples, run_end)
                          for iv, samples in zip(PEER_INTERVALS, peer_samples)},
    }
    return result


def cpu_latency(n: int = 200, hold: tuple[float, float] = (0.1, 1.0), seed: int = 7,
                peer: bool = True, hold_lock=kernel.hotplug_lock) -> dict:
    """cpu1 offline/online n times, seen by the BPF source."""
    cpu = kernel.Cpu(1)
    if not cpu.hotpluggable():
        raise RuntimeError("cpu1 is not hot-pluggable here (needs root and a second CPU)")

    def write(direction: str) -> int:
        return cpu.try_set_online(direction == "online")

    with hold_lock():
        cpu.set_online(True)
        try:
            return _run("cpu", "bpf", n, hold, seed, write, cpu.online, "offline",
                        cpu_visible, peer)
        finally:
            cpu.set_online(True)


def memory_latency(n: int = 60, hold: tuple[float, float] = (0.1, 1.0), seed: int = 11,
                   peer: bool = True, hold_lock=kernel.hotplug_lock,
                   block: kernel.MemoryBlock | None = None) -> dict:
    """An offlinable memory block offline/online n times, seen by the uevent source.

    A block that offlined fine can be refused (EBUSY) a few cycles later, once the kernel put
    unmovable pages in it: the refusal is recorded and the next offlinable block takes over.
    """
    with hold_lock():
        current = block or kernel.find_offlinable_memory_block()
        if current is None:
            raise RuntimeError("no memory block here can be offlined")
        used = [current]

        def write(direction: str) -> int:
            nonlocal current
            err = kernel.write_sysfs(current.path, direction)
            if err and direction == "offline" and block is None:
                fresh = kernel.find_offlinable_memory_block()
                if fresh is not None:
                    current = fresh
                    used.append(fresh)
            return err

        try:
            result = _run("memory", "uevent", n, hold, seed, write, meminfo_total, "offline",
                          mem_total, peer)
        finally:
            for b in used:
                b.set_online(True)
        result["block"] = ",".join(str(n) for n in sorted({b.n for b in used}))
        return result
