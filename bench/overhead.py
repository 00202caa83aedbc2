"""Overhead: start-up to the first valid scrape, idle CPU, memory.

Idle means no hotplug (the hotplug lock is held, so no other test on the machine flaps) while
each exporter is scraped every 15 s as a Prometheus would: node_exporter's cost is per scrape,
so leaving it unscraped would flatter it. Memory comes from /proc/PID/smaps_rollup; bcc's LLVM
code is file-backed and counted apart from the anonymous memory the target is about.
"""
from __future__ import annotations

import contextlib
import time

from bench.observe import PeriodicScraper
from bench.procs import NodeExporter, ResizeExporter, thread_cpu_seconds
from bench.stats import Summary
from testkit import kernel

MiB = 2**20
IDLE_SCRAPE_INTERVAL = 15.0


def startup(repeats: int = 5, peer: bool = True) -> dict:
    """Seconds from exec to the first valid scrape (for ours: BPF programs attached)."""
    kinds = [("node-resize-exporter", lambda: ResizeExporter("auto"))]
    if peer:
        kinds.append(("node_exporter", NodeExporter))
    out = {}
    for name, make in kinds:
        times = []
        for _ in range(repeats):
            with make() as exporter:
                times.append(exporter.startup_seconds)
        out[name] = Summary.of(times).as_dict()
    return out


def idle(seconds: float = 60.0, peer: bool = True, hold_lock=kernel.hotplug_lock) -> dict:
    """CPU seconds per minute and memory of both exporters, side by side, over one window."""
    with contextlib.ExitStack() as stack:
        exporters = {"node-resize-exporter": stack.enter_context(ResizeExporter("auto"))}
        if peer:
            exporters["node_exporter"] = stack.enter_context(NodeExporter())
        time.sleep(1.0)  # past start-up work (the first sysfs read, BPF attach)
        stack.enter_context(hold_lock())
        scrapers = [PeriodicScraper(e.port, IDLE_SCRAPE_INTERVAL, len, seed=k)
                    for k, e in enumerate(exporters.values())]
        for s in scrapers:
            s.start()
        before = {name: e.stats() for name, e in exporters.items()}
        precise0 = {name: thread_cpu_seconds(e.pid) for name, e in exporters.items()}
        t0 = time.monotonic()
        time.sleep(seconds)
        window = time.monotonic() - t0
        after = {name: e.stats() for name, e in exporters.items()}
        precise1 = {name: thread_cpu_seconds(e.pid) for name, e in exporters.items()}
        for s in scrapers:
            s.finish()
    return {name: {
        "window_s": window,
        "cpu_s_per_min": (after[name].cpu_seconds - before[name].cpu_seconds) / window * 60,
        "cpu_percent_of_core": (after[name].cpu_seconds - before[name].cpu_seconds)
        / window * 100,
        "cpu_s_per_min_schedstat": (precise1[name] - precise0[name]) / window * 60,
        "rss_mib": after[name].rss_bytes / MiB,
        "anon_mib": after[name].anon_bytes / MiB,
        "file_backed_mib": (after[name].rss_bytes - after[name].anon_bytes) / MiB,
    } for name in exporters}
