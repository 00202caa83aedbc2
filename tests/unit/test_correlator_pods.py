"""Episode correlator, Kubernetes side: readmission after an unplug, relists, balloon pods,
podresources. Synthetic streams on a fake clock."""
from __future__ import annotations

from exporter.correlate.model import Outcome, Phase, PodVerdict, UpdateKind
from exporter.events import Direction, NodeStatus, Resource
from testkit.correlator_stream import T0, GiB, Stream

CPU, MEM = Resource.CPU, Resource.MEMORY


def unplugged_and_resynced(settle: float = 10.0) -> Stream:
    """cpu1 offline at 10.0, the kubelet restarted and reports 1 CPU at 15.0 (resync 5 s).

    Pods a, b, c run on the node; d finished long ago; e was rejected before the unplug.
    """
    s = Stream(kubernetes=True, readmission_settle=settle)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    for uid in "abc":
        s.pod(0.5, uid)
    s.pod(0.5, "d", phase="Succeeded", ready=False)
    s.pod(5.0, "e", phase="Failed", reason="OutOfcpu", ready=False)
    s.transition(10.0, CPU, 1, Direction.OFFLINE)
    s.snapshot(10.0625, cpus=1)
    s.tick(12.0)
    updates = s.node(15.0, cpu=1)
    assert [u.kind for u in updates] == [UpdateKind.RESYNCED]
    assert s.open_episodes()[0].phase is Phase.READMISSION
    return s


def test_unplug_resynced_with_two_pods_rejected_and_one_kept():
    s = unplugged_and_resynced()
    [a] = s.pod(16.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    assert a.kind is UpdateKind.POD
    assert [(p.uid, p.outcome, p.reason) for p in a.episode.pods] == [
        ("a", PodVerdict.REJECTED, "OutOfcpu")]
    s.pod(17.0, "b", ready=False)
    s.pod(18.0, "e", phase="Failed", reason="OutOfcpu", ready=False)  # re-delivered, old news
    assert s.tick(26.5) == []  # 10 s after the last change (17.0) not yet passed
    [ended] = s.tick(27.0)
    ep = ended.episode
    assert ep.outcome is Outcome.CONVERGED and ep.ended == T0 + 17.0
    assert ep.resync_seconds == 5.0 and ep.readmission_seconds == 7.0
    assert sorted((p.uid, p.outcome.value, p.reason) for p in ep.pods) == [
        ("a", "rejected", "OutOfcpu"), ("b", "rejected", "NotReady"), ("c", "kept", "Running")]

    stats = s.stats
    assert stats.unplug_requests == {CPU: 1}
    assert stats.unplug_errors == {(CPU, "readmission_rejected"): 1}
    assert stats.readmission_pods == {("rejected", "OutOfcpu"): 1, ("rejected", "NotReady"): 1,
                                      ("kept", "Running"): 1}
    hist = stats.readmission_duration[CPU]
    assert hist.n == 1 and hist.total == 7.0
    assert dict(hist.cumulative())["5.0"] == 0 and dict(hist.cumulative())["10.0"] == 1
    assert stats.resync_duration[(CPU, Direction.OFFLINE.change)].total == 5.0
    assert stats.readmission_duration[MEM].n == 0


def test_readmission_without_rejections_settles_at_resync():
    s = unplugged_and_resynced()
    s.pod(20.0, "a")  # an ordinary status update: no change that matters
    [ended] = s.tick(25.0)
    ep = ended.episode
    assert ep.outcome is Outcome.CONVERGED and ep.readmission_seconds == 5.0
    assert s.stats.unplug_errors == {}
    assert s.stats.readmission_pods == {("kept", "Running"): 3}


def test_rejection_before_resync_counts_and_settle_waits_for_resync():
    s = Stream(kubernetes=True, readmission_settle=10.0)
    s.snapshot(0, cpus=2)
    s.node(0, cpu=2)
    s.pod(0.5, "a")
    s.pod(3.0, "early", phase="Failed", reason="OutOfcpu")  # before the unplug: not ours
    s.transition(10.0, CPU, 1, Direction.OFFLINE)
    s.snapshot(10.0625, cpus=1)
    # A new pod the scheduler still sends to the shrunk node is rejected at admission.
    s.pod(11.0, "new", phase="Failed", reason="UnexpectedAdmissionError")
    s.tick(12.0)
    s.node(40.0, cpu=1)
    [ended] = s.tick(50.0)
    ep = ended.episode
    assert ep.readmission_seconds == 30.0
    assert s.stats.readmission_pods == {("rejected", "UnexpectedAdmissionError"): 1,
                                                ("kept", "Running"): 1}


def test_not_ready_then_failed_keeps_the_telling_reason_and_counts_once():
    s = unplugged_and_resynced()
    s.pod(16.0, "a", ready=False)
    s.pod(17.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    s.tick(40.0)
    stats = s.stats
    assert stats.readmission_pods == {("rejected", "OutOfcpu"): 1, ("kept", "Running"): 2}
    assert s.ended()[0].readmission_seconds == 6.0  # the refinement is not a new change


def test_out_of_memory_does_not_count_against_a_cpu_episode():
    s = unplugged_and_resynced()
    s.pod(16.0, "a", phase="Failed", reason="OutOfmemory")
    s.tick(40.0)
    assert s.stats.unplug_errors == {}
    assert s.stats.readmission_pods == {("kept", "Running"): 2}


def test_relist_does_not_double_count():
    s = unplugged_and_resynced()
    s.pod(16.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    # The watch broke; the relist lists everything again and re-delivers each pod.
    s.relist(18.0, "a", "b", "c", "d", "e")
    s.pod(18.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    s.pod(18.0, "b")
    s.pod(18.0, "c")
    # A second relist that had lost a, then a comes back: still one rejection.
    s.relist(19.0, "b", "c")
    s.pod(19.5, "a", phase="Failed", reason="OutOfcpu", ready=False)
    s.relist(20.0, "a", "b")  # c is gone: it is neither kept nor rejected
    s.tick(40.0)
    stats = s.stats
    assert stats.readmission_pods == {("rejected", "OutOfcpu"): 1, ("kept", "Running"): 1}
    assert stats.unplug_errors == {(CPU, "readmission_rejected"): 1}
    # Relisting after the episode ended counts nothing more.
    s.relist(50.0, "a", "b")
    s.pod(50.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    s.tick(100.0)
    assert stats.readmission_pods == {("rejected", "OutOfcpu"): 1, ("kept", "Running"): 1}


def test_resumed_readmission_keeps_its_rejections_once():
    s = unplugged_and_resynced()
    s.pod(16.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    [kept] = s.open_episodes()
    again = Stream(kubernetes=True, readmission_settle=10.0)
    again.at(20.0)
    again.resume([kept])
    again.pod(20.0, "a", phase="Failed", reason="OutOfcpu", ready=False)  # first sight here
    again.pod(20.0, "b")
    again.tick(30.0)
    [ep] = again.ended()
    assert ep.readmission_seconds == 6.0
    assert again.stats.readmission_pods == {("rejected", "OutOfcpu"): 1,
                                                    ("kept", "Running"): 1}


def test_balloon_upsize_deferred_then_applied():
    s = Stream(kubernetes=True)
    s.node(0, cpu=8, mem=32 * GiB, alloc_cpu=7.5, alloc_mem=30 * GiB)
    held = {CPU: 1.0, MEM: 4.0 * GiB}
    s.balloon(0.5, "bal", held)
    assert s.view.balloon_pods() == 1
    assert s.view.balloon_requests() == held
    assert s.view.effective() == {CPU: 6.5, MEM: 26.0 * GiB}

    s.balloon(1.0, "bal", held, desired={CPU: 2.0}, applied={CPU: 1.0}, pending="Deferred")
    s.balloon(2.0, "bal", held, desired={CPU: 2.0}, applied={CPU: 1.0}, pending="Deferred")
    stats = s.stats
    assert stats.balloon_resizes == {"deferred": 1}
    s.balloon(3.0, "bal", held, desired={CPU: 2.0}, applied={CPU: 1.0})  # in progress
    grown = {CPU: 2.0, MEM: 4.0 * GiB}
    s.balloon(4.5, "bal", grown, desired={CPU: 2.0}, applied={CPU: 2.0})
    s.balloon(5.0, "bal", grown, desired={CPU: 2.0}, applied={CPU: 2.0})  # re-delivered
    assert stats.balloon_resizes == {"deferred": 1, "applied": 1}
    assert stats.balloon_resize_duration.n == 1 and stats.balloon_resize_duration.total == 3.5
    assert s.view.effective() == {CPU: 5.5, MEM: 26.0 * GiB}

    s.balloon(6.0, "bal2", {MEM: 1.0 * GiB})
    assert s.view.balloon_pods() == 2 and s.view.balloon_requests()[MEM] == 5.0 * GiB
    s.pod(7.0, "bal2", balloon=True, deleted=True)
    assert s.view.balloon_pods() == 1


def test_balloon_infeasible_then_a_new_target_errors_and_applies():
    s = Stream(kubernetes=True)
    held = {CPU: 1.0}
    s.balloon(1.0, "bal", held, desired={CPU: 64.0}, applied={CPU: 1.0}, pending="Infeasible")
    s.balloon(2.0, "bal", held, desired={CPU: 64.0}, applied={CPU: 1.0}, pending="Infeasible")
    stats = s.stats
    assert stats.balloon_resizes == {"infeasible": 1}
    s.balloon(10.0, "bal", held, desired={CPU: 3.0}, applied={CPU: 1.0}, error=True)
    s.balloon(11.0, "bal", held, desired={CPU: 3.0}, applied={CPU: 1.0}, error=True)
    s.balloon(12.5, "bal", {CPU: 3.0}, desired={CPU: 3.0}, applied={CPU: 3.0})
    assert stats.balloon_resizes == {"infeasible": 1, "error": 1, "applied": 1}
    assert stats.balloon_resize_duration.total == 2.5
    # An ordinary pod's resize is not a balloon resize.
    s.pod(13.0, "app", requests={CPU: 1.0}, resize=None)
    assert s.view.balloon_pods() == 1 and stats.balloon_resize_duration.n == 1


def test_podresources_offers_a_cpu_the_kernel_has_offline():
    s = Stream(kubernetes=True)
    assert s.view.podresources_allocatable_cpus() is None
    s.podresources(0, None)
    assert s.view.podresources_allocatable_cpus() is None
    s.podresources(0, [])  # CPU manager policy none: an empty list means "not reported"
    assert s.view.podresources_allocatable_cpus() is None
    assert s.view.podresources_offline_cpus() is None
    s.podresources(1.0, [1])
    assert s.view.podresources_allocatable_cpus() == 1
    assert s.view.podresources_offline_cpus() is None  # no kernel snapshot yet
    s.snapshot(1.0, cpus=2)
    assert s.view.podresources_offline_cpus() == 0
    s.snapshot(2.0, cpus=1)  # cpu1 went offline; the kubelet still offers it (KEP-2403)
    assert s.view.podresources_offline_cpus() == 1


def test_kubelet_gauges_follow_the_node():
    s = Stream(kubernetes=True)
    assert s.view.kubelet_capacity() == {} and s.view.drift() == {}
    s.node(0, cpu=2, mem=24 * GiB, alloc_cpu=1.9, alloc_mem=23 * GiB)
    assert s.view.kubelet_capacity() == {CPU: 2.0, MEM: 24.0 * GiB}
    assert s.view.kubelet_allocatable() == {CPU: 1.9, MEM: 23.0 * GiB}
    assert s.view.drift() == {}  # the kernel side is not known yet
    s.snapshot(1.0, cpus=2, mem=24 * GiB)
    assert s.view.drift() == {CPU: 0.0, MEM: 0.0}


def test_a_deleted_node_leaves_no_kubelet_capacity_and_no_drift():
    """kube_node reports a deleted (or missing) Node as a NodeStatus with no capacity: the
    gauges then show no kubelet capacity and judge no drift, not the vanished Node's last."""
    s = Stream(kubernetes=True)
    s.snapshot(0.0, cpus=1, mem=24 * GiB)
    s.node(1.0, cpu=2, mem=24 * GiB)
    assert s.view.drift() == {CPU: -1.0, MEM: 0.0}
    s.feed(2.0, NodeStatus(time=T0 + 2.0, node="n1", capacity={}, allocatable={}))
    assert s.view.kubelet_capacity() == {} and s.view.kubelet_allocatable() == {}
    assert s.view.drift() == {} and s.view.drift_seconds() == {}
    s.node(3.0, cpu=1, mem=24 * GiB)
    assert s.view.drift() == {CPU: 0.0, MEM: 0.0}


def test_metrics_sink_renders_what_it_counted_from_the_updates():
    """/metrics for an unplug with one pod rejected: the counters come from the updates the
    metrics sink saw, the gauges from the node view; the sink lists no error series for itself."""
    from prometheus_client import CollectorRegistry, generate_latest

    s = unplugged_and_resynced()
    s.pod(16.0, "a", phase="Failed", reason="OutOfcpu", ready=False)
    s.metrics.sinks = [s.metrics]
    registry = CollectorRegistry()
    registry.register(s.metrics)
    before = generate_latest(registry).decode().splitlines()
    assert "node_resize_exporter_episodes_open 1.0" in before
    assert 'node_resize_readmission_pods_total{outcome="kept",reason="Running"} 0.0' in before
    s.tick(40.0)
    lines = generate_latest(registry).decode().splitlines()
    for line in ("node_resize_exporter_episodes_open 0.0",
                 'node_hot_unplug_request_total{resource="cpu"} 1.0',
                 'node_hot_unplug_errors_total{reason="readmission_rejected",resource="cpu"} 1.0',
                 'node_hot_unplug_errors_total{reason="resync_timeout",resource="cpu"} 0.0',
                 'node_resize_readmission_pods_total{outcome="kept",reason="Running"} 2.0',
                 'node_resize_readmission_pods_total{outcome="rejected",reason="OutOfcpu"} 1.0',
                 'node_resize_readmission_duration_seconds_count{resource="cpu"} 1.0',
                 'node_resize_resync_duration_seconds_sum{direction="decrease",resource="cpu",'
                 'resynced_by="unknown"} 5.0',  # no kubelet watched
                 'node_resize_kubelet_capacity{resource="cpu",unit="core"} 1.0',
                 'node_resize_capacity_drift{resource="cpu",unit="core"} 0.0'):
        assert line in lines, line
    assert not any(line.startswith("node_resize_exporter_sink_errors_total{") for line in lines)
