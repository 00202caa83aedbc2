"""The recorded Node watch of a real kubelet v1.36.2 across a cpu1 hot-unplug and the
restarts that followed (tests/fixtures/kubelet-v1.36/node-watch-cpu1-unplug-restart.jsonl),
replayed by the list/watch test server into a running exporter while cpu1 is offlined and
onlined for real, where the recording says the kernel changed (under the hotplug lock).

The exporter must show what it showed on the recorded cluster: drift -1 at once, the unplug
request, no change while the kubelet is dead (its heartbeat ageing instead), the resync when the
restarted kubelet posts capacity 1, and the same on the way back to 2.
"""
from __future__ import annotations

import pytest

from testkit.exporter_proc import RunningExporter
from testkit.fakes.apiserver import FakeApiServer
from testkit.kube_replay import NODE, RECORDINGS, at

pytestmark = pytest.mark.kernel


def beat_at(s, via="node_status"):
    return s.value("node_resize_kubelet_heartbeat_timestamp_seconds", via=via)


def beat_age(s, via="node_status"):
    return s.value("node_resize_kubelet_heartbeat_age_seconds", via=via)


def drift(s):
    return s.value("node_resize_capacity_drift", resource="cpu", unit="core")


def kubelet_cpu(s):
    return (s.value("node_resize_kubelet_capacity", resource="cpu", unit="core"),
            s.value("node_resize_kubelet_allocatable", resource="cpu", unit="core"))


def test_node_recording_against_a_running_exporter_with_cpu1_offlined(cpu1, tmp_path):
    with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with RunningExporter("--source", "uevent", "--kubeconfig", kubeconfig,
                             "--node-name", NODE, "--podresources-socket", "",
                             "--kubelet-root-dir", "", "--cgroup-root", "",
                             "--readmission-settle", "1") as exp:
            api.wait_for_watches(2)
            seen = []

            def step(i: int, event: dict) -> None:
                seen.append(event["type"])
                if i == 0:  # ADDED: capacity 2, allocatable 1 (reservedSystemCPUs "0")
                    s = exp.wait_for(lambda s: kubelet_cpu(s) == (2, 1))
                    assert drift(s) == 0
                    assert beat_at(s) == at("08:21:44")
                    assert beat_age(s) > 0
                elif i == 1:  # BOOKMARK; then cpu1 goes offline while the kubelet runs
                    cpu1.set_online(False)
                    s = exp.wait_for(lambda s: drift(s) == -1)
                    assert s.value("node_hot_unplug_request_total", resource="cpu") == 1
                    assert s.value("node_resize_exporter_episodes_open") == 1
                elif i == 2:  # BOOKMARK while the restarted kubelet is dead: no Node update
                    s = exp.scrape()
                    assert drift(s) == -1 and kubelet_cpu(s) == (2, 1)
                    assert beat_at(s) == at("08:21:44")
                elif i == 3:  # the kubelet started without its state file: capacity 1
                    s = exp.wait_for(lambda s: kubelet_cpu(s) == (1, 0))
                    assert drift(s) == 0
                    # counted once the kernel phase has closed (--coalesce-window after it)
                    exp.wait_for(lambda s: s.total("node_resize_resync_duration_seconds_count",
                                                   resource="cpu", direction="decrease") == 1)
                    assert beat_at(s) == at("08:23:19")
                    s = exp.wait_for(lambda s: s.value("node_resize_exporter_episodes_open") == 0)
                    assert s.value("node_hot_unplug_errors_total", resource="cpu",
                                   reason="readmission_rejected") == 0
                elif i == 4:  # BOOKMARK; cpu1 comes back: the Node says 1 until a restart
                    cpu1.set_online(True)
                    s = exp.wait_for(lambda s: drift(s) == 1)
                    assert s.value("node_resize_resync_request_total", resource="cpu") == 1
                elif i == 5:
                    s = exp.wait_for(lambda s: kubelet_cpu(s) == (2, 1))
                    assert drift(s) == 0
                    exp.wait_for(lambda s: s.total("node_resize_resync_duration_seconds_count",
                                                   resource="cpu", direction="increase") == 1)
                    s = exp.wait_for(lambda s: s.value("node_resize_exporter_episodes_open") == 0)
                    assert s.value("node_resize_resync_errors_total", resource="cpu",
                                   reason="resync_timeout") == 0

            api.replay(RECORDINGS / "node-watch-cpu1-unplug-restart.jsonl", step)
            assert seen == ["ADDED", "BOOKMARK", "BOOKMARK", "MODIFIED", "BOOKMARK", "MODIFIED"]
