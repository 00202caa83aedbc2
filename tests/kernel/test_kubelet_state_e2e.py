"""The kubelet's local state end to end on the real kernel: a running exporter reads a
static-policy CPU manager checkpoint naming CPUs 0-1 (the one a real kubelet v1.36 wrote)
and a real kubepods cpuset cgroup; cpu1 goes offline and comes back."""
from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testkit.exporter_proc import RunningExporter
from testkit.fakes.apiserver import FakeApiServer
from testkit.kubepods import cgroup_version, kubepods_cgroup

pytestmark = pytest.mark.kernel
NODE = "kubelet-state-node"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet-v1.36"
BLOCKED = {"name": "node_resize_kubelet_restart_blocked", "reason": "cpu_manager_state"}


def blocked(s) -> float | None:
    return s.value(BLOCKED["name"], reason=BLOCKED["reason"])


def kernel_offline(s) -> float | None:
    return s.value("node_resize_kernel_cpus", state="offline")


def test_restart_blocked_within_one_kernel_event(cpu1, tmp_path):
    root = tmp_path / "kubelet"
    (root / "pods").mkdir(parents=True)  # a kubelet's root: its pods folder is always there
    shutil.copy(FIXTURES / "cpu_manager_state.static-0-1", root / "cpu_manager_state")
    with FakeApiServer() as api, kubepods_cgroup("0-1") as (cgroup_root, _):
        api.set_node(NODE, cpu="2", memory="8Gi")
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with RunningExporter("--kubeconfig", kubeconfig, "--node-name", NODE,
                             "--podresources-socket", "", "--kubelet-root-dir", str(root),
                             "--cgroup-root", cgroup_root) as exp:
            # The checkpoint and the cgroup read (a gauge appears only once its file was read).
            s = exp.wait_for(lambda s: blocked(s) is not None and s.value(
                "node_resize_kubelet_cgroup_cpuset_cpus", state="online") == 2, timeout=15)
            assert blocked(s) == 0
            assert (
                s.value("node_resize_kubelet_cpu_manager_cpus", set="default", state="online") == 2
            )
            assert s.value("node_resize_exporter_source_up", source="kubelet_checkpoint") == 1

            cpu1.set_online(False)
            # The first scrape that shows the kernel's snapshot with cpu1 offline already shows
            # the restart blocked: the same event updated both (no second read needed).
            s = exp.wait_for(lambda s: kernel_offline(s) == 1, timeout=10)
            assert blocked(s) == 1
            assert (
                s.value("node_resize_kubelet_cpu_manager_cpus", set="default", state="offline") == 1
            )
            # online == 1 already holds on the new kernel snapshot with the old cpuset read
            # (cpu1 then counts as offline); offline == 0 needs the cgroup's own re-read, a
            # different source: wait for both.
            exp.wait_for(
                lambda s: (
                    s.value("node_resize_kubelet_cgroup_cpuset_cpus", state="online") == 1
                    and s.value("node_resize_kubelet_cgroup_cpuset_cpus", state="offline") == 0
                ),
                timeout=10,
            )

            cpu1.set_online(True)
            s = exp.wait_for(lambda s: kernel_offline(s) == 0, timeout=10)
            assert blocked(s) == 0
            # cgroup v1 keeps cpu1 out of the kubepods cpuset: pods cannot use it again.
            missing = 1 if cgroup_version() == 1 else 0
            exp.wait_for(
                lambda s: (
                    s.value("node_resize_kubelet_cgroup_cpuset_cpus", state="missing") == missing
                ),
                timeout=10,
            )

            # The operator's fix (drain, remove the checkpoint) is seen through inotify.
            cpu1.set_online(False)
            exp.wait_for(lambda s: blocked(s) == 1, timeout=10)
            (root / "cpu_manager_state").unlink()
            exp.wait_for(lambda s: blocked(s) == 0, timeout=10)


GATES_TEXT = (
    b"# TYPE kubernetes_feature_enabled gauge\n"
    b'kubernetes_feature_enabled{name="InPlaceNodeResourceResize",stage="ALPHA"} 1\n'
    b'kubernetes_feature_enabled{name="NodeResourceHotUnPlug",stage="ALPHA"} 0\n'
)


class _Kubelet(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(GATES_TEXT)))
        self.end_headers()
        self.wfile.write(GATES_TEXT)

    def log_message(self, *args) -> None:
        pass


def test_feature_gates_and_kep3953_condition_through_a_running_exporter(tmp_path):
    """The kubelet's /metrics (a real HTTP server on loopback) and the Node watch (the test API
    server) carry KEP-3953's objects to node_resize_kubelet_feature_enabled and
    _capacity_configured."""
    kubelet = ThreadingHTTPServer(("127.0.0.1", 0), _Kubelet)
    threading.Thread(target=kubelet.serve_forever, daemon=True).start()
    try:
        with FakeApiServer() as api:
            api.set_node(NODE, cpu="2", memory="8Gi")
            kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
            url = f"http://127.0.0.1:{kubelet.server_address[1]}/metrics"
            with RunningExporter(
                "--source",
                "sysfs",
                "--kubeconfig",
                kubeconfig,
                "--node-name",
                NODE,
                "--podresources-socket",
                "",
                "--kubelet-metrics-url",
                url,
                "--kubelet-root-dir",
                str(tmp_path / "none"),
            ) as exp:
                s = exp.wait_for(
                    lambda s: (
                        s.series("node_resize_kubelet_feature_enabled")
                        and s.series("node_resize_kubelet_capacity")
                    ),
                    timeout=15,
                )
                assert s.series("node_resize_kubelet_feature_enabled") == {
                    frozenset({("gate", "InPlaceNodeResourceResize")}): 1.0,
                    frozenset({("gate", "NodeResourceHotUnPlug")}): 0.0,
                }
                assert not s.series("node_resize_kubelet_capacity_configured")  # today's kubelets

                node = api.get("nodes", NODE)
                node["spec"]["configuredCapacity"] = {"cpu": "1", "memory": "8Gi"}
                node["status"]["conditions"].append(
                    {
                        "type": "CapacityConfigured",
                        "status": "False",
                        "reason": "InProgress",
                        "message": "applying cpu 1",
                        "lastTransitionTime": "2026-11-23T10:00:00Z",
                    }
                )
                api.put_raw("nodes", node)
                s = exp.wait_for(
                    lambda s: (
                        s.value("node_resize_kubelet_capacity_configured", reason="InProgress") == 1
                    ),
                    timeout=10,
                )
                assert s.value("node_resize_kubelet_capacity_configured", reason="Accepted") == 0
    finally:
        kubelet.shutdown()
        kubelet.server_close()


def memtotal_bytes() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def test_static_memory_manager_blocked_while_a_memory_block_is_offline(memory_block, tmp_path):
    """A Static memory manager checkpoint recording the memory the kernel has now (the shape
    of pkg/kubelet/cm/memorymanager/state); one memory block offlined for real: a restart
    would fail ("the expected machine state is different from the real one")."""
    root = tmp_path / "kubelet"
    root.mkdir()
    total = memtotal_bytes()
    (root / "memory_manager_state").write_text(
        json.dumps(
            {
                "policyName": "Static",
                "checksum": 1,
                "machineState": {
                    "0": {
                        "numberOfAssignments": 0,
                        "cells": [0],
                        "memoryMap": {
                            "memory": {
                                "total": total,
                                "systemReserved": 0,
                                "allocatable": total,
                                "reserved": 0,
                                "free": total,
                            }
                        },
                    }
                },
            }
        )
    )
    mem_blocked = {"name": "node_resize_kubelet_restart_blocked", "reason": "memory_manager_state"}
    with FakeApiServer() as api:
        api.set_node(NODE, cpu="2", memory="8Gi")
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with RunningExporter(
            "--kubeconfig",
            kubeconfig,
            "--node-name",
            NODE,
            "--podresources-socket",
            "",
            "--kubelet-root-dir",
            str(root),
            "--cgroup-root",
            "",
        ) as exp:
            exp.wait_for(lambda s: s.value(**mem_blocked) == 0, timeout=15)
            memory_block.set_online(False)
            exp.wait_for(lambda s: s.value(**mem_blocked) == 1, timeout=15)
            memory_block.set_online(True)
            s = exp.wait_for(lambda s: s.value(**mem_blocked) == 0, timeout=15)
            assert s.value(BLOCKED["name"], reason=BLOCKED["reason"]) == 0  # no CPU checkpoint
