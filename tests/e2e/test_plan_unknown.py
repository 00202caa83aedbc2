"""Unknown is never safe (issue 35 item 1, issue 36 M2, M3, L9): `plan` beside a kubelet names
every input it did not read and exits 3 (cannot tell), never 0; a kubelet root holding none
of the kubelet's files is "not mounted", not "no checkpoint"; a partial container scan names
what it did not read; a hostile block never fails the whole plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.container_cgroups import construct
from testkit.fakes.apiserver import FakeApiServer
from testkit.kube_replay import recording
from testkit.plan import fake_host


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "plan", *args, "--output", "json"],
                          capture_output=True, text=True, timeout=60)


def containers(root: Path, n: int, quota_cpus: int = 0, fifo: bool = False) -> str:
    """`n` burstable containers under a cgroup v2 tree; the last with a CPU quota."""
    items = []
    for i in range(n):
        files = {"cgroup.procs": "", "cpuset.cpus.effective": "0-3\n", "memory.max": "max\n"}
        if i == n - 1 and quota_cpus:
            files["cpu.max"] = f"{quota_cpus * 100000} 100000\n"
        items.append(("burstable", f"1b4e28ba-2fa1-11d2-883f-{i:012x}", f"{i:064x}", files))
    tree = construct(root, 2, "cgroupfs", items)
    if fifo:
        last = next(tree.glob(f"kubepods/burstable/pod*{n - 1:012x}/{n - 1:064x}"))
        (last / "cpu.max").unlink(missing_ok=True)
        os.mkfifo(last / "cpu.max")
    return str(tree)


def kubelet_root(tmp_path: Path, *names: str, checkpoint: str = "") -> str:
    root = tmp_path / "kubelet"
    for name in names:
        (root / name).mkdir(parents=True)
    root.mkdir(exist_ok=True)
    if checkpoint:
        (root / "cpu_manager_state").write_text(checkpoint)
    return str(root)


NONE_POLICY = '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}'


def test_without_a_kubeconfig_beside_a_kubelet_the_answer_is_cannot_tell(tmp_path):
    """M2: a CPU manager checkpoint and five running containers, no --kubeconfig: the pods
    were not read, so not SAFE (it was exit 0 "SAFE: hurts nothing")."""
    sysfs, procfs = fake_host(tmp_path, cpus=4)
    done = plan("--cpu", "-3", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", kubelet_root(tmp_path, "pods", checkpoint=NONE_POLICY),
                "--cgroup-root", containers(tmp_path / "cg", 5), "--kubernetes", "off")
    assert done.returncode == 3, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["verdict"] == "unknown" and answer["safe"] is False
    assert answer["inputs"]["pods"].startswith("Kubernetes is off")
    assert [u for u in answer["unknown"] if u.startswith("pods: ")]
    assert answer["inputs"]["running_containers"] == "read"
    assert answer["inputs"]["cpu_manager_checkpoint"] == "read"


def test_a_kubelet_root_without_the_kubelets_files_is_not_mounted(tmp_path):
    """The default DaemonSet mounted only pod-resources: the checkpoints were never seen."""
    sysfs, procfs = fake_host(tmp_path, cpus=4)
    done = plan("--cpu", "-1", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", kubelet_root(tmp_path, "pod-resources"),
                "--cgroup-root", containers(tmp_path / "cg", 2), "--kubernetes", "off")
    assert done.returncode == 3, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["inputs"]["cpu_manager_checkpoint"].startswith("not mounted")
    assert answer["kubelet"]["restarts"] is None
    # No kubepods cgroup either: the running containers are named as not read too.
    done = plan("--cpu", "-1", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", kubelet_root(tmp_path, "pods"),
                "--cgroup-root", str(tmp_path), "--kubernetes", "off")
    assert done.returncode == 3
    assert json.loads(done.stdout)["inputs"]["running_containers"].startswith(
        "no kubepods cgroup found")


def test_a_host_with_no_kubelet_at_all_can_be_safe(tmp_path):
    sysfs, procfs = fake_host(tmp_path, cpus=4)
    done = plan("--cpu", "-1", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", str(tmp_path / "none"), "--cgroup-root", str(tmp_path),
                "--kubernetes", "off")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["inputs"]["pods"] == "not needed"


@pytest.fixture
def api():
    with FakeApiServer() as server:
        server.publish_recorded(recording("node-watch-cpu1-unplug-restart.jsonl")[0])
        yield server


@pytest.mark.parametrize("cut", ["budget", "fifo"])
def test_a_partial_container_scan_is_never_safe(api, tmp_path, cut):
    """M3: 21 containers, one with a 2-CPU quota (taking 3 of 4 CPUs leaves it stale). The
    full scan says it would hurt; a scan cut at 12 containers, or with that container's
    cpu.max a FIFO, names what it did not read instead of saying SAFE."""
    sysfs, procfs = fake_host(tmp_path, cpus=4)
    common = ("--path.sysfs", sysfs, "--path.procfs", procfs, "--node-name", "vm",
              "--kubeconfig", api.write_kubeconfig(str(tmp_path / "kubeconfig")),
              "--kubelet-root-dir", kubelet_root(tmp_path, "pods", checkpoint=NONE_POLICY))
    full = plan("--cpu", "-3", *common,
                "--cgroup-root", containers(tmp_path / "full", 21, quota_cpus=2))
    assert full.returncode == 1, full.stdout + full.stderr
    assert json.loads(full.stdout)["stale_containers"]
    if cut == "budget":
        done = plan("--cpu", "-3", *common, "--running-pods.max-containers", "12",
                    "--cgroup-root", containers(tmp_path / "cut", 21, quota_cpus=2))
    else:
        done = plan("--cpu", "-3", *common,
                    "--cgroup-root", containers(tmp_path / "fifo", 21, quota_cpus=2,
                                                fifo=True))
    answer = json.loads(done.stdout)
    assert done.returncode in (1, 3) and answer["verdict"] != "safe", done.stdout
    partial = [u for u in answer["unknown"] if "partial scan" in u]
    assert partial and ("budget" in partial[0] if cut == "budget" else
                        "1 container unreadable" in partial[0])


def test_hostile_blocks_never_fail_the_whole_plan(tmp_path):
    """L9: a block whose valid_zones cannot be read is "not read", not "spans zones"; a block
    whose state is a FIFO, a link loop or a folder is named, and the plan still answers."""
    blocks = {n: ("online", "Movable") for n in range(40, 46)}
    sysfs, procfs = fake_host(tmp_path, cpus=2, blocks=blocks)
    mem = Path(sysfs, "devices/system/memory")
    (mem / "memory40/valid_zones").unlink()
    (mem / "memory41/state").unlink()
    os.mkfifo(mem / "memory41/state")
    (mem / "memory42/state").unlink()
    os.symlink(mem / "memory42/loop", mem / "memory42/state")
    os.symlink(mem / "memory42/state", mem / "memory42/loop")
    (mem / "memory43/state").unlink()
    (mem / "memory43/state").mkdir()
    done = plan("--cpu", "-1", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", str(tmp_path / "none"), "--cgroup-root", str(tmp_path),
                "--kubernetes", "off")
    assert done.returncode != 2 and "Traceback" not in done.stderr, done.stderr
    answer = json.loads(done.stdout)
    assert "memory block(s) 41 42 43" in answer["inputs"]["kernel"]
    done = plan("--memory", "-128Mi", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", str(tmp_path / "none"), "--cgroup-root", str(tmp_path),
                "--kubernetes", "off")
    assert done.returncode in (1, 3) and "Traceback" not in done.stderr, done.stderr
    assert all(r["reason"] != "spans_zones" for r in json.loads(done.stdout)["refusals"])


@pytest.mark.parametrize("size", ["100000000000000", "0", "3000", "zz"])
def test_a_hostile_block_size_is_bounded_and_answered(tmp_path, size):
    """L4: block_size_bytes 2^56 made the page-flag read ask for 2^47 pages (MemoryError)."""
    sysfs, procfs = fake_host(tmp_path, cpus=2, blocks={40: ("online", "Normal")})
    Path(sysfs, "devices/system/memory/block_size_bytes").write_text(size + "\n")
    done = plan("--memory", "-1Gi", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", str(tmp_path / "none"), "--cgroup-root", str(tmp_path),
                "--kubernetes", "off")
    assert "Traceback" not in done.stderr, done.stderr
    if size in ("zz", "0"):  # the kernel's state cannot be read: said with the fix
        assert done.returncode == 2 and "--path.sysfs" in done.stderr
        return
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert "no memory hotplug" in answer["harm"][0]
    assert "not a memory block size" in answer["inputs"]["kernel"]
