"""Detection latency and CPU per change of the resizes hypervisors do, in the lab guest.

    nice .venv/bin/python bench/paravirt_latency.py [--rounds 5] [--out bench/results/paravirt.json]

One QEMU TCG guest (lab/), the exporter from this checkout running in it as in the lab. For each
mechanism, `rounds` changes each way, alternating, each a QMP command:

- ACPI DIMM: a 128 MiB pc-dimm added (one block, onlined movable) and removed;
- virtio-mem sub-block: vmem0 between 192 and 160 MiB (32 MiB of sub-blocks in an online block);
- virtio-mem big-block: vmem1 between 0 and 256 MiB (two blocks in, fake-offlined and out);
- virtio-balloon: the balloon (no deflate-on-oom) inflated by 64 MiB and deflated.

Latency: from just before the QMP command to the first scrape (polled every 50 ms through the
hostfwd) whose node_resize_kernel_capacity{resource="memory"} equals the guest's MemTotal once
the change is done (read through the guest agent). It includes the guest doing the change under
TCG: the guest's own time to MemTotal is reported beside it (`guest`), read the same way.
CPU per change: the exporter process's utime+stime (/proc/PID/stat in the guest) over a second
round of changes made without scraping, minus the same process's CPU over an idle stretch of
the same length: what a change costs the exporter, nothing else. Both under TCG, where guest
code runs ~10-50x slower than on a VM with KVM: the numbers compare mechanisms, they are no
production latency.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.control import LabGuest  # noqa: E402
from lab.qemu import VIRTIO_MEM_BBM, VIRTIO_MEM_SBM, MiB  # noqa: E402
from lab.scenarios import LabRun  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
GUEST_SETTLE = 1.0  # MemTotal unchanged this long: the guest is done


def guest_mem_kb(lab: LabGuest) -> int:
    return lab.state()["mem_total_kb"]


def exporter_cpu(lab: LabGuest, pid: int) -> float:
    fields = lab.call("read", path=f"/proc/{pid}/stat")["value"].rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Changes:
    """The four mechanisms, each a pair of QMP commands that undo each other."""

    def __init__(self, lab: LabGuest):
        self.lab = lab
        self.qmp = lab.guest.qmp
        self.ram = self.qmp.query_balloon()
        self.dimm = 0

    def do(self, mechanism: str, forth: bool) -> None:
        q = self.qmp
        if mechanism == "ACPI DIMM":
            if forth:
                self.dimm += 1
                q.add_dimm(f"bench{self.dimm}", 128 * MiB)
            else:
                q.remove_dimm(f"bench{self.dimm}")
        elif mechanism == "virtio-mem sub-block":
            q.set_virtio_mem_size(VIRTIO_MEM_SBM, (160 if forth else 192) * MiB)
        elif mechanism == "virtio-mem big-block":
            q.set_virtio_mem_size(VIRTIO_MEM_BBM, (256 if forth else 0) * MiB)
        elif mechanism == "virtio-balloon":
            q.balloon(self.ram - 64 * MiB if forth else self.ram)


MECHANISMS = ("ACPI DIMM", "virtio-mem sub-block", "virtio-mem big-block", "virtio-balloon")


def settle_guest(lab: LabGuest, before_kb: int, t0: float) -> tuple[int, float]:
    """Wait until MemTotal moved and then stood still; (MemTotal kB, seconds to its last move)."""
    last, moved_at = before_kb, None
    while True:
        kb = guest_mem_kb(lab)
        now = time.monotonic()
        if kb != last:
            last, moved_at = kb, now
        elif moved_at is not None and now - moved_at >= GUEST_SETTLE:
            return kb, moved_at - t0
        if now - t0 > 120:
            raise TimeoutError(f"MemTotal never moved from {before_kb} kB")
        time.sleep(0.05)


def one(lab: LabGuest, changes: Changes, mechanism: str, forth: bool,
        scrape: bool) -> dict:
    before = guest_mem_kb(lab)
    t0 = time.monotonic()
    changes.do(mechanism, forth)
    if not scrape:
        kb, guest_s = settle_guest(lab, before, t0)
        return {"guest_s": guest_s}
    seen = None
    kb = None
    while True:
        s = lab.scrape()
        cap = s.value("node_resize_kernel_capacity", None, resource="memory", unit="byte")
        now = time.monotonic()
        if kb is None:
            current = guest_mem_kb(lab)
            if current != before:
                kb, guest_s = settle_guest(lab, before, t0)
        if kb is not None and cap == kb * 1024:
            seen = now - t0 if seen is None else seen
            return {"latency_s": seen, "guest_s": guest_s}
        if cap is not None and kb is None and cap != before * 1024:
            seen = now - t0  # the exporter saw it before our own MemTotal read did
        if now - t0 > 120:
            raise TimeoutError(f"{mechanism}: the exporter never showed MemTotal")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out_dir = Path(__file__).resolve().parent.parent / "lab" / "out" / \
        f"bench-paravirt-{time.strftime('%Y%m%d-%H%M%S')}"
    lab = LabGuest.boot(out_dir)
    results: dict = {"rounds": args.rounds, "mechanisms": {}}
    try:
        run = LabRun(lab, started=time.monotonic() + 3600)  # no lab budget here
        run.lab.start_exporter(600)
        s = run.lab.wait_scrape(
            lambda s: s.value("node_resize_exporter_source_up", None, source="bpf") is not None
            and s.value("node_resize_exporter_source_up", None, source="managed_pages") == 1,
            120, "the bpf and managed_pages sources' status")
        # The kprobes (bpf source) when bcc could compile in the guest in time, else the
        # MemTotal poll (managed_pages): which one saw the changes is in the results.
        attached = s.value("node_resize_exporter_bpf_program_attached", 0.0,
                           program="managed_adjust_enter") == 1
        results["detector"] = "kprobes (bpf)" if attached else "MemTotal poll (managed_pages)"
        print(f"detector: {results['detector']}", flush=True)
        pid = lab.exporter_pid  # the guest agent's child: a pid in the guest
        assert pid is not None
        changes = Changes(lab)
        start_kb, t0 = guest_mem_kb(lab), time.monotonic()
        changes.qmp.set_virtio_mem_size(VIRTIO_MEM_SBM, 192 * MiB)
        settle_guest(lab, start_kb, t0)
        for mechanism in MECHANISMS:
            lat, guest, cpu = [], [], []
            for i in range(args.rounds):  # latency, scraped
                for forth in (True, False):
                    r = one(lab, changes, mechanism, forth, scrape=True)
                    lat.append(r["latency_s"])
                    guest.append(r["guest_s"])
                    time.sleep(2.5)  # one episode per change
            for i in range(args.rounds):  # CPU, not scraped
                for forth in (True, False):
                    c0, t0 = exporter_cpu(lab, pid), time.monotonic()
                    one(lab, changes, mechanism, forth, scrape=False)
                    time.sleep(2.5)
                    busy = exporter_cpu(lab, pid) - c0
                    span = time.monotonic() - t0
                    i0 = exporter_cpu(lab, pid)
                    time.sleep(span)
                    cpu.append(busy - (exporter_cpu(lab, pid) - i0))
            results["mechanisms"][mechanism] = {
                "latency_ms": [round(x * 1000) for x in lat],
                "guest_ms": [round(x * 1000) for x in guest],
                "cpu_ms": [round(x * 1000) for x in cpu],
            }
            print(f"{mechanism}: latency p50 {statistics.median(lat) * 1000:.0f} ms, max "
                  f"{max(lat) * 1000:.0f} ms (guest to MemTotal p50 "
                  f"{statistics.median(guest) * 1000:.0f} ms); CPU per change p50 "
                  f"{statistics.median(cpu) * 1000:.0f} ms", flush=True)
    finally:
        lab.shutdown()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
