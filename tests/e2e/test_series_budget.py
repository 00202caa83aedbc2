"""The fleet's bill: how many series one exporter puts on a Prometheus, on a node that has never
resized (docs/metrics.md, "Series budget"). Every sample line of a real scrape counts,
process_* included.

The machine-wide hotplug lock is held for the whole scrape, so no other test flaps a CPU or a
memory block meanwhile: a resize adds histogram series, and this is the page before any.
"""
from __future__ import annotations

from collections import Counter

from testkit.exporter_proc import RunningExporter, Scrape
from testkit.kernel import hotplug_lock

BUDGET_KUBERNETES_OFF = 80
BUDGET_KUBERNETES_ON = 155  # a Node, 2 balloon pods, 30 other pods, podresources
BALLOON = {"node-resize-exporter.io/balloon": "true"}


def series(scrape: Scrape) -> list[str]:
    return [line for line in scrape.text.splitlines() if line and not line.startswith("#")]


def bill(scrape: Scrape) -> str:
    """Series per family, largest first: what to look at when the budget is exceeded."""
    per = Counter(line.split("{")[0].split(" ")[0] for line in series(scrape))
    return "\n".join(f"{n:4d} {name}" for name, n in per.most_common())


def never_resized(scrape: Scrape) -> bool:
    return scrape.total("node_resize_kernel_transitions_total") == 0


def kernel_side_ready(s: Scrape) -> bool:
    """The first sysfs read is in, and the BPF source has said whether it attached (its
    programs' series) or not."""
    bpf_up = s.value("node_resize_exporter_source_up", source="bpf")
    return bool(s.series("node_resize_kernel_capacity")) and (
        bpf_up == 0 or len(s.series("node_resize_exporter_bpf_program_attached")) > 0)


def test_kubernetes_off_fits_the_budget():
    with hotplug_lock(), RunningExporter("--kubernetes", "off") as exp:
        scrape = exp.wait_for(kernel_side_ready, timeout=60)
        assert never_resized(scrape)
        assert len(series(scrape)) <= BUDGET_KUBERNETES_OFF, bill(scrape)
        # Nothing of the Kubernetes join, and no bucket of a duration never measured.
        assert "_bucket{" not in scrape.text, bill(scrape)
        assert not scrape.series("node_resize_balloon_pods")
        # What the alerts read with increase() exists at 0, for the reasons that can occur.
        assert scrape.value("node_hot_unplug_errors_total", resource="cpu",
                            reason="kernel_failed") == 0
        assert scrape.value("node_hot_unplug_errors_total", resource="cpu",
                            reason="resync_timeout") is None
        assert scrape.value("node_resize_exporter_events_lost_total", source="uevent") == 0
        # Only the process_* families someone reads.
        assert "python_gc_" not in scrape.text and "python_info" not in scrape.text
        assert scrape.value("process_resident_memory_bytes") > 0


def test_kubernetes_on_with_32_pods_fits_the_budget(tmp_path):
    from exporter.sources.kubelet.proto import podresources_pb2 as pb
    from testkit.fakes.apiserver import FakeApiServer
    from testkit.fakes.podresources import Kubelet, Server

    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
    sock = str(tmp_path / "kubelet.sock")
    server = Server(sock, kubelet)
    try:
        with FakeApiServer() as api, hotplug_lock():
            api.set_node("budget-node", cpu="2", memory="8Gi")
            for i in range(2):
                api.put_pod(f"balloon-{i}", node="budget-node", labels=BALLOON,
                            requests={"cpu": "250m", "memory": "256Mi"})
            for i in range(30):
                api.put_pod(f"app-{i}", node="budget-node",
                            requests={"cpu": "10m", "memory": "16Mi"})
            kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
            with RunningExporter("--kubernetes", "on", "--kubeconfig", kubeconfig,
                                 "--node-name", "budget-node",
                                 "--podresources-socket", sock) as exp:
                scrape = exp.wait_for(lambda s: (
                    kernel_side_ready(s)
                    and s.value("node_resize_balloon_pods") == 2
                    and s.series("node_resize_kubelet_capacity")
                    and s.value("node_resize_podresources_allocatable_cpus") == 2
                ), timeout=60)
                assert never_resized(scrape)
                assert len(series(scrape)) <= BUDGET_KUBERNETES_ON, bill(scrape)
                assert "_bucket{" not in scrape.text, bill(scrape)
                # No series names a pod: 32 pods cost what 2 do.
                assert "pod=" not in scrape.text
                # Every reason an alert's increase() reads is there at 0.
                for reason in ("kernel_failed", "resync_timeout", "mismatch",
                               "readmission_rejected"):
                    assert scrape.value("node_hot_unplug_errors_total", resource="memory",
                                        reason=reason) == 0, reason
                assert scrape.value("node_resize_balloon_resize_total", result="infeasible",
                                    reason="capacity") == 0
    finally:
        server.stop()
