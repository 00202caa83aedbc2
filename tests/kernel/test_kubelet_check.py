"""`check` says whether a kubelet restart now would fail, and what to do."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config.options import Options
from exporter.sinks.kubelet_collector import check_kubelet_restart
from exporter.sources.kubelet.kubelet_checkpoint import KUBELET_ROOT_DIR

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet-v1.36"
MESSAGE = ("a kubelet restart now would fail: the CPU manager checkpoint names cpu1, which is "
           "offline")


def sysfs_tree(tmp_path: Path, online: str, offline: str) -> Options:
    cpu = tmp_path / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    for name, text in (("online", online), ("offline", offline), ("present", "0-1"),
                       ("possible", "0-1")):
        (cpu / name).write_text(text + "\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 8388608 kB\nSwapTotal: 0 kB\n")
    return Options(sysfs_root=str(tmp_path / "sys"), procfs_root=str(tmp_path / "proc"),
                   kubelet_root_dir=str(tmp_path / "kubelet"))


def kubelet_root(options: Options, checkpoint: str) -> Path:
    root = Path(KUBELET_ROOT_DIR.of(options))
    root.mkdir(exist_ok=True)
    shutil.copy(FIXTURES / f"cpu_manager_state.{checkpoint}", root / "cpu_manager_state")
    return root


def test_offline_cpu_in_the_checkpoint_fails_with_the_fix(tmp_path):
    options = sysfs_tree(tmp_path, "0", "1")
    root = kubelet_root(options, "static-0-1")
    check = check_kubelet_restart(options)
    assert (check.status, check.detail) == ("fail", MESSAGE)
    assert check.fix == (f"online cpu1 again before the kubelet restarts, or drain the node, "
                         f"stop the kubelet, delete {root}/cpu_manager_state and start it (it "
                         "writes a new checkpoint for the CPUs online)")


def test_matching_checkpoint_and_no_checkpoint_are_ok(tmp_path):
    options = sysfs_tree(tmp_path, "0-1", "")
    check = check_kubelet_restart(options)  # no root at all: not mounted, never "ok"
    assert check.status == "warn" and "not mounted" in check.detail
    (tmp_path / "kubelet/pods").mkdir(parents=True)  # a kubelet's root, no checkpoint
    assert check_kubelet_restart(options).detail == f"no checkpoints in {tmp_path}/kubelet"
    kubelet_root(options, "static-exclusive-cpu1")
    check = check_kubelet_restart(options)
    assert check.status == "ok" and "cpu_manager_state" in check.detail


def test_corrupted_checkpoint_fails_without_the_online_advice(tmp_path):
    options = sysfs_tree(tmp_path, "0-1", "")
    root = kubelet_root(options, "static-0-1")
    (root / "cpu_manager_state").write_text('{"policyName":"static","defaultCpuSet":"0",'
                                            '"checksum":1636926438}')
    check = check_kubelet_restart(options)
    assert check.status == "fail" and "checksum mismatch" in check.detail
    assert check.fix.startswith("drain the node")


@pytest.mark.kernel
def test_check_command_on_the_real_kernel(cpu1, tmp_path):
    root = tmp_path / "kubelet"
    root.mkdir()
    shutil.copy(FIXTURES / "cpu_manager_state.static-0-1", root / "cpu_manager_state")
    cpu1.set_online(False)
    try:
        out = subprocess.run([sys.executable, "-m", "exporter", "check", "--kubelet-root-dir",
                              str(root)], cwd=REPO, capture_output=True, text=True,
                             timeout=120).stdout
    finally:
        cpu1.set_online(True)
    assert f"FAIL kubelet restart: {MESSAGE}\n     fix: online cpu1 again" in out, out


def test_static_memory_manager_with_other_memory_fails(tmp_path):
    options = sysfs_tree(tmp_path, "0-1", "")
    root = Path(KUBELET_ROOT_DIR.of(options))
    root.mkdir()
    (root / "memory_manager_state").write_text(json.dumps({
        "policyName": "Static", "checksum": 1,
        "machineState": {"0": {"numberOfAssignments": 0, "cells": [0], "memoryMap": {
            "memory": {"total": 4 << 30, "systemReserved": 0, "allocatable": 4 << 30,
                       "reserved": 0, "free": 4 << 30}}}}}))
    check = check_kubelet_restart(options)  # the fixture's MemTotal is 8 GiB
    assert check.status == "fail"
    assert check.detail == ("a kubelet restart now would fail: the memory manager checkpoint "
                            "records 4294967296 bytes of memory, the kernel has 8589934592")
    assert f"delete {root}/memory_manager_state" in check.fix


def test_an_empty_root_dir_option_is_not_checked(tmp_path):
    options = sysfs_tree(tmp_path, "0-1", "")
    check = check_kubelet_restart(options.replace(kubelet_root_dir=""))
    assert check.status == "warn" and "--kubelet-root-dir is empty" in check.detail


def test_an_unreadable_checkpoint_is_not_checked(tmp_path):
    options = sysfs_tree(tmp_path, "0-1", "")
    (Path(KUBELET_ROOT_DIR.of(options)) / "cpu_manager_state").mkdir(parents=True)
    check = check_kubelet_restart(options)
    assert check.status == "warn" and "not a regular file (a directory)" in check.detail


@pytest.mark.parametrize("flag", ["--kubelet-root-dir", "--cgroup-root"])
def test_a_root_that_is_a_file_is_a_usage_error(tmp_path, flag):
    file = tmp_path / "typo"
    file.write_text("")
    r = subprocess.run([sys.executable, "-m", "exporter", "run", flag, str(file)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"Invalid value for '{flag}': '{file}' is not a directory" in r.stderr
