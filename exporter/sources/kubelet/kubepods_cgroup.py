"""The kubepods cgroup's cpuset: which CPUs the pods may really run on.

The kubelet writes the kubepods cpuset once and does not follow hotplug. On cgroup v1 the
kernel removes an offlined CPU from `cpuset.cpus` for good: after cpu1 comes back online the
pods still cannot use it (measured on this project's CI machine: 0-1 -> 0 when offlined, still
0 after onlining). On cgroup v2 `cpuset.cpus.effective` follows the online CPUs. Re-read after
every CPU event (the kubelet sink pokes this source) and on a slow timer; a cgroup file
gives no inotify event when the kernel changes it.

Where: `<cgroup root>/cpuset/kubepods[.slice]/cpuset.cpus` (v1; cgroupfs and systemd
drivers), `<cgroup root>/kubepods[.slice]/cpuset.cpus.effective` (v2).
"""
from __future__ import annotations

from pathlib import Path

from exporter.clock import Clock
from exporter.config.options import Opt
from exporter.config.types import RootDir
from exporter.events import KubepodsCpuset, MalformedInput, Resource
from exporter.sources.base import Emit
from exporter.sources.kernel.sysfs import parse_cpu_list
from exporter.sources.registry import KUBERNETES, SourceSpec, register
from exporter.sources.wake import STATE_INTERVAL, PokedSource
from exporter.untrusted import read_text

KUBEPODS = ("kubepods.slice", "kubepods")  # systemd driver, cgroupfs driver
MAX_BYTES = 64 * 1024  # a cpulist of 8192 CPUs written one by one fits


def find_kubepods_cpuset(root: str | Path) -> Path | None:
    """The file holding the kubepods cpuset under a cgroup root, v2 first (a unified
    hierarchy at the root has cgroup.controllers there), else v1's cpuset controller."""
    root = Path(root)
    candidates: list[Path] = []
    if (root / "cgroup.controllers").exists():
        candidates += [root / name / "cpuset.cpus.effective" for name in KUBEPODS]
    candidates += [root / "cpuset" / name / "cpuset.cpus" for name in KUBEPODS]
    return next((c for c in candidates if c.is_file()), None)


def read_kubepods_cpuset(root: str | Path, now: float) -> KubepodsCpuset:
    """Raises ValueError (not a cpu list) or OSError; a missing cgroup is an empty path."""
    path = find_kubepods_cpuset(root)
    if path is None:
        return KubepodsCpuset(now, "")
    text = read_text(path, MAX_BYTES)  # ValueError past the bound, or not a regular file
    return KubepodsCpuset(now, str(path), parse_cpu_list(text))


class KubepodsCgroupSource(PokedSource):
    name = "kubepods_cgroup"

    def __init__(self, clock: Clock, root: str, interval: float = STATE_INTERVAL):
        super().__init__(clock)
        self.root = root
        self.interval = interval
        self._last: KubepodsCpuset | None = None

    def up_reason(self) -> str:
        return f"reading {self.root}"

    def read(self, emit: Emit) -> None:
        now = self.clock.now()
        try:
            event = read_kubepods_cpuset(self.root, now)
        except (OSError, ValueError) as e:
            emit(MalformedInput(self.name, f"kubepods cpuset: {e}", now))
            return
        last = self._last
        if last is None or (last.path, last.cpus) != (event.path, event.cpus):
            self._last = event
            emit(event)


CGROUP_ROOT: Opt[str] = Opt(
    "cgroup_root", ("--cgroup-root",), "/sys/fs/cgroup",
    "Where the host's cgroup hierarchy is mounted (the kubepods cpuset is read there; empty: do "
    "not read it).", RootDir())

register(SourceSpec(
    "kubepods_cgroup", KUBERNETES, "the kubepods cgroup's cpuset",
    lambda ctx: KubepodsCgroupSource(ctx.clock, CGROUP_ROOT.of(ctx.options)),
    wanted=lambda options: bool(CGROUP_ROOT.of(options)), order=61,
    options=(CGROUP_ROOT,),
    poked_by=frozenset({Resource.CPU})))  # the cpuset
