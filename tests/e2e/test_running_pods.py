"""The running-pods path in a real exporter process: a constructed kubepods tree (cgroup v1
names) under --cgroup-root, the pods from the test API server, /metrics. What a real resize
does is in tests/kernel/test_running_pods_kernel.py; here, a tree with containers the node
could never have created, and hostile entries, which are counted and skipped."""
from __future__ import annotations

from testkit.container_cgroups import CID, UID, construct
from testkit.exporter_proc import RunningExporter
from testkit.fakes.apiserver import FakeApiServer


def test_exporter_reports_stale_containers_and_counts_unreadable_ones(tmp_path):
    good = {"cgroup.procs": "", "cpuset.cpus": "0-63\n", "cpu.cfs_quota_us": "6400000\n",
            "cpu.cfs_period_us": "100000\n", "memory.limit_in_bytes": str(1 << 50)}
    others = [("besteffort", f"{UID[:-4]}{i:04x}", f"{i:064x}",
               {"cgroup.procs": "", "cpuset.cpus": "0\n"}) for i in range(40)]
    hostile = ("besteffort", UID, "f" * 64, {"cgroup.procs": "", "cpuset.cpus": "zero\n"})
    root = construct(tmp_path / "cg", 1, "cgroupfs",
                     [("burstable", UID, CID, good), hostile, *others])
    with FakeApiServer() as api:
        api.put_pod("cart-0", node="n1", namespace="shop", container_ids=[CID], uid=UID,
                    requests={"cpu": "100m", "memory": "64Mi"}, limits={"memory": "1Pi"})
        with RunningExporter("--kubeconfig", api.kubeconfig_path, "--node-name", "n1",
                             "--podresources-socket", "", "--kubelet-root-dir", "",
                             "--cgroup-root", str(root)) as exp:
            scrape = exp.wait_for(lambda s: s.value("node_resize_running_containers") == 41
                                  and s.series("node_resize_running_containers_stale")
                                  and s.value("node_resize_exporter_malformed_total",
                                              source="running_pods") == 1)
            assert scrape.value("node_resize_exporter_source_up", source="running_pods") == 1
            stale = {dict(k)["kind"]: v for k, v in
                     scrape.series("node_resize_running_containers_stale").items()}
            # 64 CPUs named, 64 cores of quota, a petabyte of limit, on a 2-CPU node
            assert stale["cpuset_offline"] == 1
            assert stale["cpu_limit_above_online"] == 1
            assert stale["memory_limit_above_capacity"] == 1
            assert stale["oom_score_adj"] == 0  # no process in the constructed container
            assert "running_pods (counted, skipped): 1 container(s) unreadable" in exp.logs()
