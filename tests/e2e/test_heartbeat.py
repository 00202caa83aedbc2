"""A dead kubelet is not a healthy one. The Node watch gives no event at all while the
kubelet is dead after a failed restart (recorded: tests/fixtures/kubelet-v1.36/), and Ready
stays True until the node lifecycle controller notices; the drift gauge then shows a stale
value that never moves. The kubelet's heartbeat ages instead: via the Node's Ready condition
(posted at least every 5 min) and via its Lease in kube-node-lease (renewed every 10 s).
"""
from __future__ import annotations

import pytest

from exporter.events import Direction, MalformedInput, NodeHeartbeat
from testkit.fakes.apiserver import FakeApiServer
from testkit.kube_replay import NODE, Replay, at, recording


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def beat(s, via, what="age"):
    return s.value(f"node_resize_kubelet_heartbeat_{what}_seconds", via=via)


def micro(stamp: str) -> str:
    """A Lease renewTime as the kubelet writes it (a MicroTime)."""
    return f"2026-11-23T{stamp}.250000Z"


def test_a_dead_kubelet_s_lease_stops_while_the_node_stays_ready(api):
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    with Replay(api, lease=True) as r:
        r.kernel(at("08:21:44"), cpus=2)
        r.publish(node[0], at("08:21:44"))
        for stamp in ("08:21:44", "08:21:54", "08:22:04"):  # a live kubelet: every 10 s
            r.set_clock(at(stamp) + 0.5)
            r.seen(api.set_lease(NODE, micro(stamp)))
            s = r.scrape()
            assert beat(s, "lease", "timestamp") == at(stamp) + 0.25
            assert beat(s, "lease") == 0.25
        # cpu1 offlined, the kubelet restarted and died (kubelet-restart-fail.log): no Lease
        # renewal, no Node update; the Node still says Ready, capacity 2.
        r.kernel(at("08:22:10"), cpus=1, direction=Direction.OFFLINE)
        r.publish(node[2], at("08:22:30"))  # a BOOKMARK is all the Node watch sends
        s = r.scrape()
        assert s.value("node_resize_capacity_drift", resource="cpu", unit="core") == -1
        assert beat(s, "lease") == 25.75  # > 40 s (leaseDurationSeconds): dead
        assert beat(s, "node_status") == 46  # within the 5 min a live kubelet may stay silent
        r.tick(at("08:23:00"))
        s = r.scrape()
        assert beat(s, "lease") == 55.75 and beat(s, "node_status") == 76
        # Restarted without its state file: a Node update (capacity 1) and a renewal.
        r.publish(node[3], at("08:23:19"))
        r.seen(api.set_lease(NODE, micro("08:23:19")))
        s = r.scrape()
        assert beat(s, "node_status") == 0 and beat(s, "lease") == 0
        assert s.value("node_resize_capacity_drift", resource="cpu", unit="core") == 0
        heartbeats = [e for e in r.emitted if isinstance(e, NodeHeartbeat)]
        assert [e.via for e in heartbeats] == ["lease"] * 4  # the Node's rode on NodeStatus


def test_a_lease_renewal_repeated_or_unreadable_is_not_a_new_heartbeat(api):
    with Replay(api, lease=True) as r:
        r.set_clock(at("08:00:00"))
        r.seen(api.set_lease(NODE, micro("08:00:00")))
        r.seen(api.set_lease(NODE, micro("08:00:00")))  # same renewTime (holder changed, say)
        for _ in range(3):
            r.seen(api.set_lease(NODE, "yesterday"))
        r.seen(api.set_lease(NODE, None))  # not renewed yet: no renewTime at all
        beats = [e for e in r.emitted if isinstance(e, NodeHeartbeat)]
        bad = [e for e in r.emitted if isinstance(e, MalformedInput)]
        assert len(beats) == 1 and beats[0].heartbeat == at("08:00:00") + 0.25
        assert len(bad) == 1 and "renewTime" in bad[0].detail and bad[0].source == "kube_lease"
        assert beat(r.scrape(), "lease", "timestamp") == at("08:00:00") + 0.25


def test_a_running_exporter_reads_the_lease_and_can_be_told_not_to(tmp_path):
    from testkit.exporter_proc import RunningExporter

    with FakeApiServer() as api:
        api.set_node(NODE, cpu="2")
        api.set_lease(NODE, micro("08:21:44"))
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        common = ("--source", "sysfs", "--kubeconfig", kubeconfig, "--node-name", NODE,
                  "--podresources-socket", "", "--kubelet-root-dir", "", "--cgroup-root", "")
        with RunningExporter(*common) as exp:
            # The Node and the Lease arrive on two watches: wait for both, in either order.
            s = exp.wait_for(lambda s: beat(s, "lease", "timestamp") is not None
                             and beat(s, "node_status", "timestamp") is not None)
            assert beat(s, "lease", "timestamp") == at("08:21:44") + 0.25
            s = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                               source="kube_lease") == 1)
            query = api.requests_for("leases", watch=True)[-1]
            assert query["fieldSelector"] == "metadata.name=" + NODE
        with RunningExporter(*common, "--no-node-lease") as exp:
            s = exp.wait_for(lambda s: s.series("node_resize_kubelet_capacity"))
            assert s.value("node_resize_exporter_source_up", source="kube_lease") is None
            assert beat(s, "lease", "timestamp") is None
