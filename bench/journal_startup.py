"""What a start costs on a large journal (issue 36 M6): opening it, the kernel state the last
process counted (last_kernel_events + state_at_stop) and the counters carried from this boot's
row (JournalSink.carry), on a journal of `--rows` transitions.

Two shapes: all the rows journaled by the last process (the most last_kernel_events reads),
and the same rows spread over 100 processes of this boot (a start marker and a snapshot
each). The carried counters are one row whatever the journal holds, so `carry` costs the
same in both. Not part of `run.py all`:
`nice .venv/bin/python bench/journal_startup.py --rows 100000 --dir /var/tmp`.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from exporter.clock import FakeClock
from exporter.correlate.down_changes import changes_while_down, state_at_stop
from exporter.events import (
    Direction,
    KernelSnapshot,
    Resource,
    Result,
    SourceStatus,
    Transition,
)
from exporter.sinks.journal.sink import JournalSink

T0 = 1_800_000_000.0
BOOT = str(uuid.uuid4())


def _snap(t: float) -> KernelSnapshot:
    cpus = frozenset({0, 1})
    return KernelSnapshot(t, cpus, frozenset(), cpus, cpus, 128 << 20, frozenset({0}),
                          frozenset(), 1 << 30, 0)


def build(path: Path, rows: int, processes: int) -> None:
    j = JournalSink(path, clock=FakeClock(T0), start=False)
    j.carry(BOOT, {})
    t = T0
    per = rows // processes
    for p in range(processes):
        j.on_event(SourceStatus("sysfs", True, t))
        j.on_event(_snap(t))
        for i in range(per):
            t += 0.001
            j.on_event(Transition("uevent", Resource.CPU, 1,
                                  Direction.OFFLINE if i % 2 == 0 else Direction.ONLINE,
                                  Result.SUCCESS, end=t))
            if len(j._events) >= 10_000:  # noqa: SLF001 - a bench: keep the queue bounded
                j.flush()
        j.flush()
    j.close()


def start(path: Path) -> dict[str, float]:
    """One start's journal work, timed by step (ms)."""
    out = {}
    t0 = time.perf_counter()
    j = JournalSink(path, clock=FakeClock(T0 + 10 ** 6), start=False)
    t1 = time.perf_counter()
    changes = changes_while_down(state_at_stop(j.last_kernel_events()), _snap(T0 + 10 ** 6))
    t2 = time.perf_counter()
    j.carry(BOOT, changes)
    t3 = time.perf_counter()
    j.close()
    out["open"], out["last_state"], out["carry"] = \
        (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for processes in (1, 100):
            path = Path(d) / f"j{processes}.db"
            build(path, args.rows, processes)
            runs = [start(path) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{args.rows} transitions over {processes} process(es), "
                  f"{path.stat().st_size / 2**20:.1f} MiB: median of {args.repeat} starts: "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()))


if __name__ == "__main__":
    main()
