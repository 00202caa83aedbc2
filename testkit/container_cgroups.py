"""Kubepods container cgroups for the running-pods tests: constructed trees (any cgroup version
and driver, for the parser) and real ones on this machine with a real process in them.

Real cgroup v1 (this project's machines): under each of the cpuset, cpu and memory controllers
a private parent `nre-rp-<pid>` holding `kubepods/burstable/pod<uid>/<container id>`, and a
temporary cgroup root whose `cpuset`, `cpu` and `memory` are symlinks to those parents, so
`--cgroup-root` sees that tree and nothing of the host's. A `sleep` runs in the container's
cgroups with the OOM score adjustment the kubelet would have given it. Everything is removed
(and the process killed) on exit, whatever happens.

Real cgroup v2 where the host has one: a named cgroup2 hierarchy without controllers (hybrid
hosts bind every controller to v1), with the systemd driver's names; only cgroup.procs and the
process's OOM score are real there.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testkit.kubepods import rmdir_tree

CGROUP = Path("/sys/fs/cgroup")
UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
CID = "a" * 64  # a containerd id: 64 hex digits
PAUSE = "b" * 64


def container_rel(version: int, driver: str, qos: str, uid: str, cid: str) -> Path:
    """The container's cgroup path under a controller (v1) or the root (v2)."""
    if driver == "cgroupfs":
        top = Path("kubepods")
        pod = (top if qos == "guaranteed" else top / qos) / f"pod{uid}"
        return pod / cid
    top = Path("kubepods.slice")
    u = uid.replace("-", "_")
    pod = top / f"kubepods-pod{u}.slice" if qos == "guaranteed" else \
        top / f"kubepods-{qos}.slice" / f"kubepods-{qos}-pod{u}.slice"
    return pod / f"cri-containerd-{cid}.scope"


def _controller(filename: str) -> str:
    if filename.startswith("cpuset."):
        return "cpuset"
    if filename.startswith("cpu."):
        return "cpu"
    return "memory"  # memory.* and cgroup.procs


def construct(root: Path, version: int, driver: str,
              containers: list[tuple[str, str, str, dict[str, str]]]) -> Path:
    """Write a tree of (qos, uid, container id, {file: text}) under `root`; returns `root`."""
    if version == 2:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu memory\n")
    for qos, uid, cid, files in containers:
        rel = container_rel(version, driver, qos, uid, cid)
        for name, text in files.items():
            base = root if version == 2 else root / _controller(name)
            (base / rel).mkdir(parents=True, exist_ok=True)
            (base / rel / name).write_text(text)
        if not files:
            (root / ("" if version == 2 else "memory") / rel).mkdir(parents=True, exist_ok=True)
    return root


def procfs(root: Path, adj: dict[int, int]) -> Path:
    """A constructed /proc with /proc/PID/oom_score_adj for each PID."""
    for pid, value in adj.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "oom_score_adj").write_text(f"{value}\n")
    return root


def cgroup_v1() -> bool:
    return not (CGROUP / "cgroup.controllers").exists() and (CGROUP / "memory").is_dir()


@dataclass
class RealContainer:
    root: str  # for --cgroup-root
    pid: int
    dirs: dict[str, Path]  # controller -> the container's cgroup directory


@contextlib.contextmanager
def _sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "3600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def real_v1_container(*, cpus: str, oom_score_adj: int, cpu_quota_us: int,
                      memory_limit: int, qos: str = "burstable") -> Iterator[RealContainer]:
    """A real cgroup v1 container (cgroupfs names) with a sleeping process in it."""
    name = f"nre-rp-{os.getpid()}"
    parents = {c: CGROUP / c / name for c in ("cpuset", "cpu", "memory")}
    rel = container_rel(1, "cgroupfs", qos, UID, CID)
    tmp = tempfile.TemporaryDirectory(prefix="nre-rp-root-")
    try:
        with _sleeper() as proc:
            dirs: dict[str, Path] = {}
            for controller, parent in parents.items():
                parent.mkdir()
                path = parent
                for part in ("", *rel.parts):  # each cpuset level needs its CPUs and nodes
                    path = path / part if part else path
                    if part:
                        path.mkdir()
                    if controller == "cpuset":
                        (path / "cpuset.mems").write_text("0")
                        (path / "cpuset.cpus").write_text(cpus)
                dirs[controller] = path
                (Path(tmp.name) / controller).symlink_to(parent)
            (dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
            (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(cpu_quota_us))
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_limit))
            for path in dirs.values():
                (path / "cgroup.procs").write_text(str(proc.pid))
            Path(f"/proc/{proc.pid}/oom_score_adj").write_text(str(oom_score_adj))
            yield RealContainer(tmp.name, proc.pid, dirs)
            # killed by _sleeper before the cgroups are removed (a cgroup with a task is busy)
    finally:
        tmp.cleanup()
        for parent in parents.values():
            rmdir_tree(parent)


def cgroup2_mount() -> Path | None:
    """A mounted cgroup2 hierarchy: the root on v2 hosts, `unified` on hybrid ones."""
    for path in (CGROUP, CGROUP / "unified"):
        if (path / "cgroup.controllers").exists() and (path / "cgroup.procs").exists():
            return path
    return None


@contextlib.contextmanager
def real_v2_container(mount: Path, *, oom_score_adj: int) -> Iterator[RealContainer]:
    """A real cgroup v2 container (systemd driver names) with a sleeping process in it."""
    parent = mount / f"nre-rp-{os.getpid()}"
    rel = container_rel(2, "systemd", "burstable", UID, CID)
    try:
        with _sleeper() as proc:
            parent.mkdir()
            (parent / rel).mkdir(parents=True)
            (parent / rel / "cgroup.procs").write_text(str(proc.pid))
            Path(f"/proc/{proc.pid}/oom_score_adj").write_text(str(oom_score_adj))
            yield RealContainer(str(parent), proc.pid, {"unified": parent / rel})
    finally:
        rmdir_tree(parent)

