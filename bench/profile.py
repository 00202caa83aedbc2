"""Where the exporter's CPU goes: py-spy (and perf, if installed) on a running
`node-resize-exporter run` during a flap storm or while idle. Run as root:

    .venv/bin/python bench/profile.py storm [--cycles 100] [--perf]
    .venv/bin/python bench/profile.py idle [--seconds 60]
    .venv/bin/python bench/profile.py wake [--cycles 50]
    .venv/bin/python bench/profile.py window [--cycles 100]   (bench/window.py)

`wake` times one fixed piece of the exporter's own work (decoding a BPF record into a
Transition, the 64-byte copy included) in the BPF source's thread right after each record woke
it, by direction, against the same call in a quiet thread: what a CPU transition costs the
code that runs next to it, whoever that code belongs to.

Prints the CPU seconds the process used, its thread count, and py-spy's samples grouped by
thread and by the innermost exporter/library function (self time), most first. With --perf,
also `perf record` of the whole process summarised by shared object (where native time goes:
the kernel, libpython, libbpf, sqlite...). Both exporters are scraped every 1 s meanwhile.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.observe import PeriodicScraper  # noqa: E402
from bench.procs import ResizeExporter  # noqa: E402
from testkit import kernel  # noqa: E402


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy missing: run scripts/setup.sh bench (the test extra has it)")
    return found


def thread_names(pid: int) -> dict[str, str]:
    """tid -> Python thread name, from py-spy dump (Python 3.11 leaves comm as "python")."""
    import re
    dump = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True,
                          text=True).stdout
    return {m.group(1): m.group(2)
            for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]+)"', dump)}


def thread_cpu(pid: int) -> dict[str, float]:
    """tid -> seconds on a CPU (schedstat: nanoseconds, not /proc/stat's 10 ms ticks)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            continue
    return out


def summarize(raw: str, top: int = 25) -> str:
    """py-spy --format raw (collapsed stacks "thread;frame;frame N") -> two tables."""
    by_thread: collections.Counter = collections.Counter()
    by_leaf: collections.Counter = collections.Counter()
    by_frame: collections.Counter = collections.Counter()  # inclusive
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        total += count
        by_thread[frames[0]] += count
        by_leaf[frames[-1]] += count
        for f in set(frames[1:]):
            by_frame[f] += count
    out = [f"samples: {total}", "", "by thread:"]
    out += [f"  {n / total:6.1%}  {t}" for t, n in by_thread.most_common(top)]
    out += ["", "self (innermost frame):"]
    out += [f"  {n / total:6.1%}  {f}" for f, n in by_leaf.most_common(top)]
    out += ["", "inclusive:"]
    out += [f"  {n / total:6.1%}  {f}" for f, n in by_frame.most_common(top)]
    return "\n".join(out)


def storm(cycles: int) -> None:
    cpu = kernel.Cpu(1)
    with kernel.hotplug_lock():
        try:
            for _ in range(cycles):
                for on in (False, True):
                    cpu.try_set_online(on)
        finally:
            cpu.set_online(True)


def wake(cycles: int) -> None:
    """Thread CPU of RecordDecoder work per record, woken by real transitions vs quiet."""
    import ctypes
    import statistics
    import threading

    from exporter.clock import MonotonicWallClock
    from exporter.sources.kernel.bpf import record
    from exporter.sources.kernel.bpf import source as bpf

    source = bpf.BpfSource(MonotonicWallClock())
    source.open()
    rows: list[tuple[str, float]] = []
    events: list = []
    decode = source._on_sample

    def timed(data: int, size: int) -> None:
        t = time.thread_time()
        decode(data, size)
        rows.append((source._batch[-1].direction.value, time.thread_time() - t))

    source.ring._on_sample = timed  # the same callback, timed: nothing else changes
    source.start(events.append)
    quiet = record.HotplugRecord(start_ns=1, end_ns=2, kind=record.KIND_CPU, cpu=1, online=1)
    quiet_costs = []

    def quiet_run() -> None:
        for _ in range(200):
            t = time.thread_time()
            decode(ctypes.addressof(quiet), record.RECORD_SIZE)
            quiet_costs.append(time.thread_time() - t)
            time.sleep(0.002)

    try:
        q = threading.Thread(target=quiet_run)
        q.start()
        q.join()
        storm(cycles)
        time.sleep(0.3)
    finally:
        source.stop()
    print(f"quiet: median {statistics.median(quiet_costs) * 1e6:.0f} us (n={len(quiet_costs)})")
    for direction in ("offline", "online"):
        xs = [c for d, c in rows if d == direction]
        if xs:
            print(f"woken by a cpu1 {direction} record: median "
                  f"{statistics.median(xs) * 1e6:.0f} us, max {max(xs) * 1e6:.0f} us "
                  f"(n={len(xs)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["storm", "idle", "wake", "window"])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=997, help="py-spy samples per second")
    parser.add_argument("--perf", action="store_true", help="also perf record, by DSO")
    parser.add_argument("--no-spy", action="store_true",
                        help="no py-spy: CPU per thread only (what before/after comparisons use)")
    parser.add_argument("--sources", default="auto")
    args = parser.parse_args()
    if args.what == "wake":
        wake(args.cycles if args.cycles != 100 else 50)
        return 0
    if args.what == "window":
        from bench import window
        window.floor(args.cycles)
        window.touch(20)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="nre-profile-"))
    with ResizeExporter(args.sources) as ours:
        time.sleep(1.0)  # past start-up
        scraper = PeriodicScraper(ours.port, 1.0, len)
        scraper.start()
        raw = tmp / "spy.txt"
        names = thread_names(ours.pid)
        spy = None if args.no_spy else subprocess.Popen(
            [py_spy(), "record", "--pid", str(ours.pid), "--format", "raw", "--threads",
             "--rate", str(args.rate), "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        perf = None
        if args.perf and shutil.which("perf"):
            perf = subprocess.Popen(["perf", "record", "-F", "999", "-g", "-p", str(ours.pid),
                                     "-o", str(tmp / "perf.data")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # both profilers attached
        before, t0 = ours.stats().cpu_seconds, time.monotonic()
        threads_before = thread_cpu(ours.pid)
        if args.what == "storm":
            storm(args.cycles)
            time.sleep(1.0)  # the tail of the burst
        else:
            time.sleep(args.seconds)
        cpu, window = ours.stats().cpu_seconds - before, time.monotonic() - t0
        threads_after = thread_cpu(ours.pid)
        threads = len(list(Path(f"/proc/{ours.pid}/task").iterdir()))
        for p in (spy, perf):
            if p is not None:
                p.send_signal(2)  # SIGINT: both write their output and exit
                p.wait(60)
        scraper.finish()
    print(f"{args.what}: {cpu:.3f} CPU s in {window:.1f} s ({cpu / window * 60:.2f} CPU s/min); "
          f"{threads} threads")
    if args.what == "storm":
        print(f"per transition: {cpu / (2 * args.cycles) * 1e3:.2f} ms of CPU")
    print("CPU per thread (schedstat):", ", ".join(
        f"{names.get(t, t)} {threads_after[t] - threads_before.get(t, 0.0):.3f} s"
        for t in threads_after))
    if raw.exists():
        print(summarize(raw.read_text()))
    if perf is not None:
        report = subprocess.run(["perf", "report", "-i", str(tmp / "perf.data"), "--stdio",
                                 "--sort", "dso", "--no-children", "-g", "none",
                                 "--percent-limit", "1"], capture_output=True,
                                text=True).stdout
        print("\nperf, by shared object:")
        print("\n".join(line for line in report.splitlines()
                        if line.strip() and not line.startswith("#")))
    print(f"(raw profiles in {tmp})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
