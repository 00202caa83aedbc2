"""What one scan of the running containers costs: `scan()` over a constructed cgroup v1 tree
(cgroupfs names, every value file written, one process per container) of N containers, and
the judge's findings over the same containers with their pods, median of 5 each.

    .venv/bin/python bench/running_pods_scan.py [N ...]     # default 128 1024 4096

A constructed tree is on the filesystem of the temporary directory (tmpfs or ext4), not
cgroupfs: the kernel's cgroup files are generated on read, so real numbers differ a little;
the scan's cost is the number of files opened.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/x.py` puts bench/ first, not the repository
    sys.path.insert(0, str(REPO))

from exporter.correlate.running_pods_view import RunningPodsView  # noqa: E402
from exporter.events import ContainerSizing, PodStatus  # noqa: E402
from exporter.sources.kernel.sysfs import SysfsReader  # noqa: E402
from exporter.sources.kubelet.running_pods import scan  # noqa: E402
from testkit.container_cgroups import construct, procfs  # noqa: E402

FILES = {"cpuset.cpus": "0-1\n", "cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n",
         "memory.limit_in_bytes": "4294967296\n",
         "memory.memsw.limit_in_bytes": "4294967296\n"}


def one(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="nre-bench-rp-") as tmp:
        containers = [("burstable", f"00000000-0000-0000-0000-{i:012x}", f"{i:064x}",
                       {**FILES, "cgroup.procs": f"{100000 + i}\n"}) for i in range(n)]
        root = construct(Path(tmp) / "cg", 1, "cgroupfs", containers)
        proc = procfs(Path(tmp) / "proc", {100000 + i: 900 for i in range(n)})
        scans = []
        for _ in range(5):
            start = time.perf_counter()
            event = scan(root, proc, 1.0, max_containers=n, seconds=60.0)
            scans.append(time.perf_counter() - start)
        assert len(event.containers) == n and not event.truncated
        view = RunningPodsView()
        snap = SysfsReader().read(1.0)
        view.handle(snap)
        view.handle(event)
        for _, uid, cid, _files in containers:
            view.handle(PodStatus(1.0, uid, "ns", uid, "Running", "", True,
                                  qos_class="Burstable",
                                  containers=(ContainerSizing("c", cid, 2**30, 2**32),)))
        judges = []
        for _ in range(5):
            view.handle(snap)  # a new kernel snapshot: judged afresh, not from the cache
            start = time.perf_counter()
            view.counts()
            judges.append(time.perf_counter() - start)
        return statistics.median(scans), statistics.median(judges)


def main(argv: list[str]) -> None:
    for n in [int(a) for a in argv] or [128, 1024, 4096]:
        s, j = one(n)
        print(f"{n:5d} containers: scan {s * 1000:7.1f} ms ({s / n * 1e6:5.1f} us each), "
              f"judge {j * 1000:6.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
