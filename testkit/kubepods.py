"""A real kubepods-like cpuset cgroup for tests, under a private parent, always removed.

cgroup v1 (this project's CI machines: the cpuset controller at /sys/fs/cgroup/cpuset): a
parent `nre-test-<pid>` with a child `kubepods`, and a temporary cgroup root holding only a
`cpuset` symlink to the parent, so the exporter's `--cgroup-root` finds
`cpuset/kubepods/cpuset.cpus` there and nothing of the host. cgroup v2: the parent itself is
the root (it has cgroup.controllers), with cpuset enabled for its children.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_version() -> int:
    return 2 if (CGROUP / "cgroup.controllers").exists() else 1


def rmdir_tree(path: Path) -> None:
    """Children first; cgroup directories are removed with rmdir only."""
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            rmdir_tree(child)
    path.rmdir()


@contextlib.contextmanager
def kubepods_cgroup(cpus: str = "0-1") -> Iterator[tuple[str, Path]]:
    """(cgroup root for --cgroup-root, the kubepods cgroup directory)."""
    name = f"nre-test-{os.getpid()}"
    if cgroup_version() == 1:
        parent = CGROUP / "cpuset" / name
        parent.mkdir()
        tmp = tempfile.TemporaryDirectory(prefix="nre-cgroot-")
        try:
            for p in (parent, parent / "kubepods"):
                p.mkdir(exist_ok=True)
                (p / "cpuset.mems").write_text("0")
                (p / "cpuset.cpus").write_text(cpus)
            (Path(tmp.name) / "cpuset").symlink_to(parent)
            yield tmp.name, parent / "kubepods"
        finally:
            tmp.cleanup()
            rmdir_tree(parent)
    else:
        parent = CGROUP / name
        parent.mkdir()
        try:
            (parent / "cgroup.subtree_control").write_text("+cpuset")
            (parent / "kubepods").mkdir()
            (parent / "kubepods" / "cpuset.cpus").write_text(cpus)
            yield str(parent), parent / "kubepods"
        finally:
            rmdir_tree(parent)
