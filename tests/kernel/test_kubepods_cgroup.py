"""The kubepods cpuset: found under either driver and cgroup version, and what the real kernel
does to it when cpu1 goes offline and comes back."""
from __future__ import annotations

from pathlib import Path

import pytest

from exporter.correlate.kubelet_view import KubeletView
from exporter.events import KernelSnapshot, KubepodsCpuset
from exporter.sources.kubelet.kubepods_cgroup import (
    MAX_BYTES,
    find_kubepods_cpuset,
    read_kubepods_cpuset,
)
from testkit.kernel import Cpu, hotplug_lock
from testkit.kubepods import cgroup_version, kubepods_cgroup


def tree(root: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return str(root)


@pytest.mark.parametrize("files, want", [
    ({"cpuset/kubepods/cpuset.cpus": "0-1\n"}, "cpuset/kubepods/cpuset.cpus"),  # v1 cgroupfs
    ({"cpuset/kubepods.slice/cpuset.cpus": "0-3\n"}, "cpuset/kubepods.slice/cpuset.cpus"),
    ({"cgroup.controllers": "cpuset cpu memory\n",  # v2, systemd driver
      "kubepods.slice/cpuset.cpus.effective": "0-1\n", "kubepods.slice/cpuset.cpus": ""},
     "kubepods.slice/cpuset.cpus.effective"),
    ({"cgroup.controllers": "cpuset\n", "kubepods/cpuset.cpus.effective": "0\n"},
     "kubepods/cpuset.cpus.effective"),
])
def test_finds_the_kubepods_cpuset(tmp_path, files, want):
    assert find_kubepods_cpuset(tree(tmp_path, files)) == tmp_path / want


def test_no_kubepods_cgroup_is_an_empty_path(tmp_path):
    assert read_kubepods_cpuset(str(tmp_path), 1.0) == KubepodsCpuset(1.0, "")


def test_hostile_cpuset_files_raise_value_error(tmp_path):
    root = tree(tmp_path, {"cpuset/kubepods/cpuset.cpus": "0-4294967295"})
    with pytest.raises(ValueError):
        read_kubepods_cpuset(root, 1.0)
    (tmp_path / "cpuset/kubepods/cpuset.cpus").write_text("0," * MAX_BYTES)
    with pytest.raises(ValueError, match="larger than"):
        read_kubepods_cpuset(root, 1.0)


def snap(online: set[int]) -> KernelSnapshot:
    return KernelSnapshot(1.0, frozenset(online), frozenset({0, 1}) - frozenset(online),
                          frozenset({0, 1}), frozenset({0, 1}), 0, frozenset(), frozenset(),
                          0, 0)


def test_view_counts_online_offline_and_missing():
    view = KubeletView()
    view.handle(KubepodsCpuset(1.0, "/x", frozenset({0, 1})))
    assert view.cgroup_cpuset() == {}  # no kernel snapshot yet: nothing to compare with
    view.handle(snap({0}))
    assert view.cgroup_cpuset() == {"online": 1, "offline": 1, "missing": 0}
    view.handle(KubepodsCpuset(1.0, "/x", frozenset({0})))
    view.handle(snap({0, 1}))
    assert view.cgroup_cpuset() == {"online": 1, "offline": 0, "missing": 1}


@pytest.mark.kernel
def test_real_cpuset_cgroup_when_cpu1_goes_offline_and_back():
    """What the kernel does to a kubepods cpuset of 0-1: v1 drops cpu1 from cpuset.cpus for
    good (it stays missing after cpu1 is back), v2 takes it out of cpuset.cpus.effective
    and puts it back."""
    cpu1 = Cpu(1)
    with hotplug_lock(), kubepods_cgroup("0-1") as (root, _):
        try:
            cpu1.set_online(True)
            view = KubeletView()
            view.handle(read_kubepods_cpuset(root, 1.0))
            view.handle(snap({0, 1}))
            assert view.cgroup_cpuset() == {"online": 2, "offline": 0, "missing": 0}
            cpu1.set_online(False)
            view.handle(read_kubepods_cpuset(root, 2.0))
            view.handle(snap({0}))
            assert view.kubepods is not None and view.kubepods.cpus == {0}
            assert view.cgroup_cpuset() == {"online": 1, "offline": 0, "missing": 0}
            cpu1.set_online(True)
            view.handle(read_kubepods_cpuset(root, 3.0))
            view.handle(snap({0, 1}))
            if cgroup_version() == 1:
                assert view.cgroup_cpuset() == {"online": 1, "offline": 0, "missing": 1}
            else:
                assert view.cgroup_cpuset() == {"online": 2, "offline": 0, "missing": 0}
        finally:
            cpu1.set_online(True)
