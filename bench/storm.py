"""Fidelity under flapping and the CPU both exporters spend in the storm.

cpu1 goes offline and online `cycles` times as fast as the kernel allows, `repeats` times. The
true count is the number of sysfs writes the kernel accepted. The exporter runs with its
defaults (`--source auto`: BPF, uevent and sysfs, each transition counted once); node_exporter
is scraped every 1 s and every 15 s, and what it shows is the number of state changes between
its consecutive scrapes. The minimal Python and C uevent listeners (bench/listeners.py) run
through the same storms: the exporter's CPU per transition is compared with theirs.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import time

from bench.listeners import Listener, Listeners
from bench.observe import PeriodicScraper
from bench.procs import (
    NodeExporter,
    ResizeExporter,
    Scraper,
    cpu_visible,
    parse_samples,
    thread_cpu_seconds,
    voluntary_switches,
)
from bench.stats import Summary
from testkit import kernel

SETTLE_TIMEOUT = 10.0
SETTLE_JOURNAL = 3.0  # > the default --coalesce-window (2 s): the last episode's kernel phase


def _journal_rows(path: str) -> dict:
    """Episode rows the storms left in the journal: how many, their largest JSON."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        count, largest = conn.execute(
            "SELECT count(*), max(length(json)) FROM episodes").fetchone()
    finally:
        conn.close()
    return {"episode_rows": count, "largest_row_bytes": largest or 0}
SETTLE_POLL = 0.25


def _counts(text: str) -> dict[str, float]:
    out = {"offline": 0.0, "online": 0.0}
    for labels, v in parse_samples(text, "node_resize_kernel_transitions_total").items():
        d = dict(labels)
        if d.get("resource") == "cpu" and d.get("result") == "success":
            out[d["direction"]] += v
    return out


def _events(text: str) -> dict[str, float]:
    return {dict(k).get("source", ""): v
            for k, v in parse_samples(text, "node_resize_exporter_events_total").items()}


def _changes_seen(samples, initial: bool) -> int:
    seen, state = 0, initial
    for s in samples:
        if s.state != state:
            seen += 1
            state = s.state
    return seen


def _cpu(ours: ResizeExporter, peer, listeners: dict[str, Listener]) -> dict[str, float]:
    """CPU seconds so far of every process measured, from schedstat (nanoseconds, every
    thread): /proc/PID/stat's 10 ms ticks are 5% of a 200-transition storm's figure."""
    out = {"ours": thread_cpu_seconds(ours.pid)}
    if peer:
        out["node_exporter"] = thread_cpu_seconds(peer.pid)
    out.update({name: lst.cpu_seconds() for name, lst in listeners.items()})
    return out


def _wakeups(ours: ResizeExporter, listeners: dict[str, Listener]) -> dict[str, int]:
    out = {"ours": voluntary_switches(ours.pid)}
    out.update({name: voluntary_switches(lst.proc.pid) for name, lst in listeners.items()
                if lst.proc is not None})
    return out


def _one_storm(cpu: kernel.Cpu, cycles: int, ours: ResizeExporter, peer,
               listeners: dict[str, Listener] | None = None) -> dict:
    scraper = Scraper(ours.port, keepalive=False)
    text = scraper.get()
    before, events_before = _counts(text), _events(text)
    bpf_up = any(dict(k).get("source") == "bpf" and v == 1 for k, v in
                 parse_samples(text, "node_resize_exporter_source_up").items())
    scrapers = [PeriodicScraper(peer.port, iv, cpu_visible, seed=k)
                for k, iv in enumerate((1.0, 15.0))] if peer else []
    # Ours is scraped every 1 s too, as node_exporter is: the CPU compared includes scrapes.
    own_scraper = PeriodicScraper(ours.port, 1.0, len, seed=7)
    for s in [*scrapers, own_scraper]:
        s.start()
    listeners = listeners or {}
    cpu_before = _cpu(ours, peer, listeners)
    woken_before = _wakeups(ours, listeners)
    true = {"offline": 0, "online": 0}
    refused = 0
    t0 = time.monotonic()
    try:
        for _ in range(cycles):
            for direction in ("offline", "online"):
                if cpu.try_set_online(direction == "online"):
                    refused += 1
                else:
                    true[direction] += 1
    finally:
        cpu.set_online(True)
    storm_s = time.monotonic() - t0
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:  # the exporter may still be working through the burst
        text = scraper.get()
        counted = {d: _counts(text)[d] - before[d] for d in true}
        # The uevent or sysfs copy can complete the count while the BPF source is still
        # reading its last batch of records (storms are read in 100 ms batches): wait for
        # the BPF copies too, so events_by_source is the whole storm.
        bpf_seen = _events(text).get("bpf", 0.0) - events_before.get("bpf", 0.0)
        settled = all(counted[d] >= true[d] for d in true) and (
            not bpf_up or bpf_seen >= sum(true.values()))
        if settled or time.monotonic() > deadline:
            break
        # Every poll is a scrape whose CPU counts as the exporter's (node_exporter's peer is
        # not polled here): a few a second, not twenty.
        time.sleep(SETTLE_POLL)
    window = time.monotonic() - t0
    cpu_after = _cpu(ours, peer, listeners)
    woken = {k: v - woken_before[k] for k, v in _wakeups(ours, listeners).items()}
    events = {src: v - events_before.get(src, 0.0) for src, v in _events(text).items()}
    scraper.close()
    own_scraper.finish()
    peer_seen = {f"{s.interval:g}s": _changes_seen(s.finish(), True) for s in scrapers}
    return {
        "true": sum(true.values()), "refused": refused, "storm_s": storm_s,
        "counted": sum(counted.values()),
        "events_by_source": {k: v for k, v in events.items() if k in ("bpf", "uevent", "sysfs")},
        "node_exporter_seen": peer_seen,
        "cpu_s_per_min": {k: (cpu_after[k] - cpu_before[k]) / window * 60 for k in cpu_before},
        "cpu_ms_per_transition": {
            k: (cpu_after[k] - cpu_before[k]) * 1e3 / max(1, sum(true.values()))
            for k in cpu_before},
        # Thread wake-ups (voluntary context switches) per transition, scrapes included.
        "wakeups_per_transition": {k: v / max(1, sum(true.values())) for k, v in woken.items()},
        "window_s": window,
    }


def flap_storm(cycles: int = 100, repeats: int = 3, peer: bool = True,
               hold_lock=kernel.hotplug_lock, listeners: bool = True) -> dict:
    """`listeners`: the minimal Python and C uevent listeners (bench/listeners.py) run in the
    same storms, the floor the exporter's CPU per transition is compared with."""
    cpu = kernel.Cpu(1)
    if not cpu.hotpluggable():
        raise RuntimeError("cpu1 is not hot-pluggable here (needs root and a second CPU)")
    with contextlib.ExitStack() as stack:
        # A journal, to see what the storms leave in it (a flap storm is one episode).
        journal = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "j.db")
        ours = stack.enter_context(ResizeExporter("auto", journal=journal))
        node_exporter = stack.enter_context(NodeExporter()) if peer else None
        floor = stack.enter_context(Listeners()) if listeners else {}
        with hold_lock():
            cpu.set_online(True)
            runs = [_one_storm(cpu, cycles, ours, node_exporter, floor)
                    for _ in range(repeats)]
        # Let the last storm's episode end (its window), then stop ours: the journal is final.
        time.sleep(SETTLE_JOURNAL)
        ours.stop()
        rows = _journal_rows(journal)
    fidelity = [r["counted"] / r["true"] for r in runs if r["true"]]
    summary = {
        "cycles": cycles, "repeats": repeats, "runs": runs, "journal": rows,
        "fidelity": Summary.of(fidelity).as_dict(),
        "storm_s": Summary.of([r["storm_s"] for r in runs]).as_dict(),
        "cpu_s_per_min": {k: Summary.of([r["cpu_s_per_min"][k] for r in runs]).as_dict()
                          for k in runs[0]["cpu_s_per_min"]} if runs else {},
        "cpu_ms_per_transition": {
            k: Summary.of([r["cpu_ms_per_transition"][k] for r in runs]).as_dict()
            for k in runs[0]["cpu_ms_per_transition"]} if runs else {},
    }
    if "python_listener" in summary["cpu_ms_per_transition"]:
        # The target: per transition, at most 2.5x what the minimal Python listener pays in
        # the same storm (each run's own ratio, so the other load on the machine cancels).
        summary["vs_python_listener"] = Summary.of([
            r["cpu_ms_per_transition"]["ours"] / r["cpu_ms_per_transition"]["python_listener"]
            for r in runs if r["cpu_ms_per_transition"]["python_listener"] > 0]).as_dict()
    if peer and runs:
        summary["node_exporter_fraction"] = {
            iv: Summary.of([r["node_exporter_seen"][iv] / r["true"] for r in runs
                            if r["true"]]).as_dict()
            for iv in runs[0]["node_exporter_seen"]}
    return summary
