"""The fleet's bill: how many series one exporter puts on a Prometheus, on a node that has never
resized (docs/metrics.md, "Series budget"). Every sample line of a real scrape counts,
process_* included. With Kubernetes on, the exporter runs as the DaemonSet runs it
(bench/memory.py's pod-shaped run: deploy/daemonset.yaml's own args, only the paths, the port
and the API server made local).

The machine-wide hotplug lock is held for the whole scrape, so no other test flaps a CPU or a
memory block meanwhile: a resize adds histogram series, and this is the page before any.
"""
from __future__ import annotations

from collections import Counter

from bench.memory import PodExporter, PodShaped
from testkit.exporter_proc import RunningExporter, Scrape, poll_until
from testkit.kernel import hotplug_lock

BUDGET_KUBERNETES_OFF = 80
BUDGET_KUBERNETES_ON = 156  # the DaemonSet's args, a Node and its Lease, 30 pods, podresources


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


def test_the_daemonsets_configuration_with_30_pods_fits_the_budget():
    """The DaemonSet's own args (--web.auth=kubernetes over TLS, the journal, every default
    source), the node's Node and Lease, 30 pods (2 balloons) and podresources answering,
    scraped with a bearer token as the ServiceMonitor does (bench/memory.py's pod-shaped run)."""
    with hotplug_lock(), PodShaped() as world, PodExporter(world) as exp:
        scrape = poll_until(
            lambda: Scrape(world.scrape(exp.port)[1]),
            lambda s: (kernel_side_ready(s)
                       and s.value("node_resize_readmission_forecast_valid", reason="ok") == 1
                       and s.value("node_resize_kubelet_heartbeat_age_seconds", via="lease")
                       is not None
                       and s.series("node_resize_unpluggable")),
            60, 0.2, lambda s: AssertionError(f"never a steady page:\n{bill(s)}"))
        assert never_resized(scrape)
        assert len(series(scrape)) <= BUDGET_KUBERNETES_ON, bill(scrape)
        assert "_bucket{" not in scrape.text, bill(scrape)
        # No series names a pod: 30 pods cost what 2 do.
        assert "pod=" not in scrape.text
        # Every reason an alert's increase() reads is there at 0.
        for reason in ("kernel_failed", "resync_timeout", "mismatch", "readmission_rejected"):
            assert scrape.value("node_hot_unplug_errors_total", resource="memory",
                                reason=reason) == 0, reason
        assert scrape.value("node_resize_balloon_resize_total", result="infeasible",
                            reason="capacity") == 0
        # A hugepage size no side has any of (the test API server's Node reports both at 0,
        # as a kubelet does) shows in no family; one the kernel has pages of shows.
        for labels in scrape.series("node_resize_kubelet_capacity"):
            size = dict(labels)["resource"]
            if size.startswith("hugepages-"):
                assert scrape.value("node_resize_kernel_capacity", resource=size,
                                    unit="byte"), bill(scrape)
