"""What one big memory hot-unplug costs the journal: bytes written and CPU per block.

One episode of N memory blocks going offline one after another (a BPF record each, 1 ms apart,
all within the coalescing window so they join one episode), through the real Correlator and the
real journal sink on a real file, the way the agent drives them: each event to the journal,
then to the correlator, then each update to the journal. Bytes are the process's write(2) bytes
(/proc/self/io `wchar`: the journal's WAL and database writes, every thread), CPU is the
process's user+system time (the agent's thread and the journal's writer), both over the run
and the journal's close.

    .venv/bin/python bench/journal_episode.py [--sizes 256,1024,4096] [--dir /var/tmp]

Before the episode rows were split (schema 1: every update rewrote the whole episode), the
same run measured 21 / 252 / 4,232 MiB and 0.51 / 1.94 / 8.50 ms per block.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.clock import FakeClock  # noqa: E402
from exporter.config.decide import correlator_config  # noqa: E402
from exporter.config.options import Options  # noqa: E402
from exporter.correlate.correlator import Correlator  # noqa: E402
from exporter.events import Direction, Resource, Result, Transition  # noqa: E402
from exporter.sinks.journal.sink import JournalSink  # noqa: E402

T0 = 1_795_000_000.0
BLOCK_PAGES = 32768  # 128 MiB blocks of 4 KiB pages


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def one_episode(blocks: int, directory: Path, each: bool = False) -> dict[str, float]:
    """`each`: a transaction per update (the writer never gets to batch: the worst case)."""
    clock = FakeClock(T0)
    # The default settings: blocks 1 ms apart all join one episode (the window slides).
    correlator = Correlator(correlator_config(Options(), kubernetes=False), clock)
    path = directory / f"journal-{blocks}.db"
    sink = JournalSink(path, clock=clock, start=not each)
    updates = 0
    before_io, before_cpu = _wchar(), time.process_time()
    for i in range(blocks):
        t = T0 + i * 0.001
        clock.t = t + 0.0005
        event = Transition("bpf", Resource.MEMORY, 1000 + i, Direction.OFFLINE, Result.SUCCESS,
                           end=t + 0.0005, start=t, pfn=(1000 + i) * BLOCK_PAGES,
                           nr_pages=BLOCK_PAGES)
        sink.on_event(event)
        for update in correlator.handle(event, "bpf"):
            sink.on_update(update)
            updates += 1
        if each:
            sink.flush()
    clock.advance(120.0)  # the window closes: the episode ends
    for update in correlator.tick():
        sink.on_update(update)
        updates += 1
    sink.close()
    written, cpu = _wchar() - before_io, time.process_time() - before_cpu
    size = sum(p.stat().st_size for p in directory.glob(f"journal-{blocks}.db*"))
    for p in directory.glob(f"journal-{blocks}.db*"):
        p.unlink()
    return {"blocks": blocks, "updates": updates, "mib_written": written / 2**20,
            "ms_cpu_per_block": cpu / blocks * 1000, "file_mib": size / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--dir", default=None, help="where the journals go (a real disk)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nre-bench-journal-", dir=args.dir) as tmp:
        print("| blocks | writes | MiB written | CPU per block | journal file |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for n in (int(s) for s in args.sizes.split(",")):
            for each in (True, False):
                r = one_episode(n, Path(tmp), each)
                how = "a transaction per update" if each else "writer thread (batched)"
                print(f"| {n:,} | {how} | {r['mib_written']:.1f} MiB | "
                      f"{r['ms_cpu_per_block']:.3f} ms | {r['file_mib']:.2f} MiB |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
