"""The online window: what a CPU coming online costs code that runs next to it, on
this machine, whoever that code belongs to. `bench/profile.py window`, as root.

Two measurements, neither of them the exporter:
- **floor**: the smallest Python program that could notice a transition (a thread blocked on
  the kernel's uevent socket; per datagram one recv and one split) in a subprocess, through
  100 offline/online cycles of cpu1, then 100 of a memory block. Its CPU per transition is the
  least any Python process that wakes for a CPU transition pays here.
- **touch**: a thread that wakes every 0.5 ms and times, separately, a fixed compute loop and
  one read from each of 4,096 pages of a buffer it touched before, sorted by when it ran
  relative to the end of an online write (the write returns when the CPU is up).
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time

from testkit import kernel

LISTENER = r"""
import resource, select, socket, sys, time
s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)
s.bind((0, 1))
print("ready", flush=True)
n = 0
while select.select([s, sys.stdin], [], [])[0] != [sys.stdin]:
    n += 1
    s.recv(65536).split(b"\0")
r = resource.getrusage(resource.RUSAGE_SELF)
print(n, r.ru_utime + r.ru_stime, flush=True)
"""


def _listener_cost(flap) -> tuple[int, float, int]:
    """(datagrams, CPU s spent while flapping, transitions) for one run of the listener."""
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()  # "ready": start-up is not counted below
        before = _cpu_seconds(proc.pid)
        transitions = flap()
        time.sleep(0.5)
        cpu = _cpu_seconds(proc.pid) - before
        proc.stdin.write("\n")
        proc.stdin.flush()
        count = int(proc.stdout.readline().split()[0])
    finally:
        proc.kill()
        proc.wait()
    return count, cpu, transitions


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def _flap_cpu(cycles: int):
    def flap() -> int:
        cpu, n = kernel.Cpu(1), 0
        try:
            for _ in range(cycles):
                for on in (False, True):
                    n += cpu.try_set_online(on) == 0
        finally:
            cpu.set_online(True)
        return n
    return flap


def _flap_memory(block: kernel.MemoryBlock, cycles: int):
    def flap() -> int:
        n = 0
        try:
            for _ in range(cycles):
                if block.try_offline() == 0:
                    n += 1
                    block.set_online(True)
                    n += 1
        finally:
            block.set_online(True)
        return n
    return flap


def floor(cycles: int) -> None:
    with kernel.hotplug_lock():
        block = kernel.find_offlinable_memory_block()
        runs = [("cpu1", _flap_cpu(cycles))]
        if block is not None:
            runs.append((f"memory{block.n}", _flap_memory(block, cycles)))
        for name, flap in runs:
            count, cpu, n = _listener_cost(flap)
            print(f"floor, {name}: a minimal Python uevent listener used {cpu * 1e3:.0f} ms of "
                  f"CPU for {n} transitions ({count} datagrams): "
                  f"{cpu / max(n, 1) * 1e3:.3f} ms per transition")


def touch(cycles: int) -> None:
    buf = bytearray(4096 * 4096)  # 16 MiB: 4,096 pages, touched once here
    pages = range(0, len(buf), 4096)
    for i in pages:
        buf[i] = 1
    rows: list[tuple[float, float, float]] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            x = 0
            for i in range(2000):
                x += i * i
            t1 = time.monotonic()
            for i in pages:
                x += buf[i]
            rows.append((t0, t1 - t0, time.monotonic() - t1))
            time.sleep(0.0005)

    marks: list[float] = []
    cpu = kernel.Cpu(1)
    thread = threading.Thread(target=probe)
    with kernel.hotplug_lock():
        thread.start()
        try:
            for _ in range(cycles):
                cpu.set_online(False)
                time.sleep(0.15)
                cpu.set_online(True)
                marks.append(time.monotonic())
                time.sleep(0.15)
        finally:
            stop.set()
            thread.join()
            cpu.set_online(True)
    for lo, hi in ((-0.05, 0.0), (0.0, 0.01), (0.01, 0.03), (0.03, 0.1), (0.1, 0.15)):
        sel = [r for r in rows for m in marks if lo <= r[0] - m < hi]
        if sel:
            print(f"touch, {lo * 1e3:+4.0f}..{hi * 1e3:+4.0f} ms from an online write's return: "
                  f"compute {statistics.median(r[1] for r in sel) * 1e6:.0f} us, 4,096 pages "
                  f"{statistics.median(r[2] for r in sel) * 1e6:.0f} us, p95 "
                  f"{_p95([r[2] for r in sel]) * 1e6:.0f}, max {max(r[2] for r in sel) * 1e6:.0f}"
                  f" (n={len(sel)})")


def _p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]
