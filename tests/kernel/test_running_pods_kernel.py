"""What a real resize does to a running container, read from real cgroups and a real process:
a container sized as the kubelet sizes a Burstable one, then a memory block and cpu1 go
offline on this machine, and the running-pods source and judge report what went stale."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.correlate.running_pods_view import KINDS, RunningPodsView, container_oom_score_adj
from exporter.events import ContainerSizing, PodStatus
from exporter.sources.kernel.sysfs import SysfsReader
from exporter.sources.kubelet.running_pods import scan
from testkit.container_cgroups import (
    CID,
    UID,
    cgroup2_mount,
    cgroup_v1,
    real_v1_container,
    real_v2_container,
)
from testkit.exporter_proc import RunningExporter
from testkit.fakes.apiserver import FakeApiServer

pytestmark = pytest.mark.kernel


def snapshot():
    return SysfsReader("/sys", "/proc").read(1.0)


def burstable_pod(request: int, limit: int) -> PodStatus:
    return PodStatus(1.0, UID, "shop", "cart-0", "Running", "", True, qos_class="Burstable",
                     containers=(ContainerSizing("cart", CID, request, limit),))


def judge(root: str, pod: PodStatus) -> tuple[RunningPodsView, dict[str, int]]:
    view = RunningPodsView()
    for event in (snapshot(), pod, scan(root, "/proc", 1.0)):
        view.handle(event)
    return view, view.counts()


def stale(**kinds: int) -> dict[str, int]:
    return {kind: kinds.get(kind, 0) for kind in KINDS}


@pytest.mark.skipif(not cgroup_v1(), reason="needs cgroup v1 controllers (this machine's)")
def test_memory_block_offline_leaves_oom_score_and_memory_limit_stale(memory_block):
    capacity = snapshot().mem_total_bytes
    request = capacity // 2  # half the node: one block moves the score by points
    adj = container_oom_score_adj("Burstable", request, capacity)
    # below the capacity today, above it with a block less (the kernel keeps whole pages)
    limit = (capacity - 64 * 2**20) // 4096 * 4096
    online = Path("/sys/devices/system/cpu/online").read_text().strip()  # held by the lock
    with real_v1_container(cpus=online, oom_score_adj=adj, cpu_quota_us=50000,
                           memory_limit=limit) as c:
        pod = burstable_pod(request, limit)
        view, counts = judge(c.root, pod)
        [found] = view.scan.containers
        assert (found.oom_score_adj, found.memory_limit, found.cpu_limit) == (adj, limit, 0.5)
        assert counts == stale()
        memory_block.set_online(False)
        view, counts = judge(c.root, pod)
        assert counts == stale(oom_score_adj=1, memory_limit_above_capacity=1)
        lines = sorted(f.line() for f in view.findings())
        assert lines[1].startswith(f"shop/cart-0 cart: oom_score_adj {adj}, the kubelet would "
                                   "set ")
        memory_block.set_online(True)
        assert judge(c.root, pod)[1] == stale()


@pytest.mark.skipif(not cgroup_v1(), reason="needs cgroup v1 controllers (this machine's)")
def test_cpu1_offline_leaves_cpu_limit_above_and_the_cpuset_short_for_good(cpu1):
    capacity = snapshot().mem_total_bytes
    request = 2 * 2**30
    adj = container_oom_score_adj("Burstable", request, capacity)
    with real_v1_container(cpus="0-1", oom_score_adj=adj, cpu_quota_us=200000,
                           memory_limit=4 * 2**30) as c:
        pod = burstable_pod(request, 4 * 2**30)
        assert judge(c.root, pod)[1] == stale()
        cpu1.set_online(False)
        view, counts = judge(c.root, pod)
        # v1 takes cpu1 out of the container's cpuset at once: nothing offline stays named
        assert view.scan.containers[0].cpus == {0}
        assert counts == stale(cpu_limit_above_online=1)
        cpu1.set_online(True)
        view, counts = judge(c.root, pod)
        # ... and never puts it back: the container cannot use the CPU the node has again
        assert view.scan.containers[0].cpus == {0}
        assert counts == stale(cpuset_missing=1)


@pytest.mark.skipif(cgroup2_mount() is None, reason="no cgroup2 hierarchy mounted here")
def test_real_cgroup2_tree_with_systemd_names(memory_block):
    """A real cgroup2 hierarchy (on this hybrid machine without controllers: every controller
    is bound to v1, so only cgroup.procs and the process are real; the limits and cpusets of
    v2 are covered by constructed trees in tests/unit/test_running_pods.py)."""
    mount = cgroup2_mount()
    capacity = snapshot().mem_total_bytes
    request = capacity // 2
    adj = container_oom_score_adj("Burstable", request, capacity)
    with real_v2_container(mount, oom_score_adj=adj) as c:
        pod = burstable_pod(request, 0)
        view, counts = judge(c.root, pod)
        assert view.scan.cgroup_version == 2
        assert [(x.pod_uid, x.container_id, x.oom_score_adj) for x in view.scan.containers] \
            == [(UID, CID, adj)]
        assert counts == stale()
        memory_block.set_online(False)
        assert judge(c.root, pod)[1] == stale(oom_score_adj=1)


@pytest.mark.skipif(not cgroup_v1(), reason="needs cgroup v1 controllers (this machine's)")
def test_exporter_and_check_report_the_pod_a_memory_block_left_stale(memory_block):
    """The whole path: the pod from the test API server's watch, the container's real cgroups
    and process, a real memory block offline; the gauge moves and `check` names the pod."""
    capacity = snapshot().mem_total_bytes
    request = capacity // 2 // 2**20  # MiB
    adj = container_oom_score_adj("Burstable", request * 2**20, capacity)
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    with FakeApiServer() as api, real_v1_container(
            cpus=online, oom_score_adj=adj, cpu_quota_us=-1, memory_limit=capacity * 2) as c:
        # The node's Node: check lists the Node and its pods in one bounded list (readnow).
        api.set_node("n1", cpu="2", memory=f"{capacity // 1024}Ki")
        api.put_pod("cart-0", node="n1", namespace="shop", containers=1,
                    requests={"cpu": "100m", "memory": f"{request}Mi"},
                    limits={"memory": f"{request * 2}Mi"}, container_ids=[CID], uid=UID)
        args = ("--kubeconfig", api.kubeconfig_path, "--node-name", "n1",
                "--podresources-socket", "", "--kubelet-root-dir", "", "--cgroup-root", c.root)
        with RunningExporter(*args) as exp:
            def stale_oom(n):
                return lambda s: s.value("node_resize_running_containers_stale",
                                         kind="oom_score_adj") == n \
                    and s.value("node_resize_running_containers") == 1
            exp.wait_for(stale_oom(0))
            memory_block.set_online(False)
            exp.wait_for(stale_oom(1))
            out = subprocess.run([sys.executable, "-m", "exporter", "check", "--no-journal",
                                  *args], capture_output=True, text=True, timeout=120).stdout
            assert f"oom_score_adj: shop/cart-0 c0: oom_score_adj {adj}, the kubelet would " \
                   "set" in out, out
            assert "fix: restart the pod" in out
            memory_block.set_online(True)
            exp.wait_for(stale_oom(0))
