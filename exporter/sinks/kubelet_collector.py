"""The kubelet's local state as Prometheus gauges, beside the exporter's Collector.

A sink and a Collector in one: the agent hands it every raw event (`on_event`, in the agent's
thread), it feeds them to the pure KubeletView under its own lock, and /metrics renders the
view under that lock. The sources that feed it (the kubepods cpuset, the checkpoints,
auto_online_blocks) re-read after the kernel events their registrations name (`poked_by`):
the kernel changes a cpuset without any notification.

The composition root wires it (exporter/app.py):

    registry.register(KubeletSink.attach(agent))     # an agent sink, and a Collector
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.checks import Check
from exporter.config.options import Options
from exporter.correlate.kubelet_view import KubeletView, cpu_list
from exporter.events import Event
from exporter.readnow import Reads, not_mounted
from exporter.sinks import ViewSink


class KubeletSink(ViewSink):
    @staticmethod
    def check(reads: Reads) -> list[Check]:
        """Can the kubelet restart now? (`check`'s line for what this sink shows.)"""
        return [check_kubelet_restart(reads)]

    def __init__(self) -> None:
        super().__init__()
        self.view = KubeletView()

    def feed(self, event: Event) -> None:
        self.view.handle(event)

    # ------------------------------------------------------------ Collector

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            view = self.view
            cpus = view.cpu_manager_cpus()
            blocked = view.restart_blocked()
            cgroup = view.cgroup_cpuset()
            # The policy in force only (1); its alternatives at 0 would be three series per
            # node that say nothing a query `== 1` needs.
            auto_online = {p: v for p, v in view.memory_auto_online().items() if v}
            features = view.features()
            configured = view.capacity_configured()
            warnings = view.warning_events()
            restarts = view.restarts
        fam = GaugeMetricFamily(
            "node_resize_kubelet_cpu_manager_cpus",
            "CPUs in the kubelet's CPU manager checkpoint (default set, exclusively assigned), "
            "by whether the kernel has them online now.", labels=["set", "state"])
        for (name, state), n in sorted(cpus.items()):
            fam.add_metric([name, state], n)
        yield fam
        yield _gauge("node_resize_kubelet_restart_blocked",
                     "1 when a kubelet restart now would fail on this checkpoint (its CPUs or "
                     "memory differ from the kernel's, or it is corrupted): run "
                     "`node-resize-exporter check`.", "reason", blocked)
        yield _gauge("node_resize_kubelet_cgroup_cpuset_cpus",
                     "CPUs of the kubepods cgroup's cpuset that are online or offline, and "
                     "online CPUs missing from it (pods cannot run there).", "state", cgroup)
        yield _gauge("node_resize_kernel_memory_auto_online",
                     "1 for the kernel's policy for hot-added memory blocks "
                     "(auto_online_blocks); offline: they stay offline until something onlines "
                     "them.", "policy", auto_online)
        yield CounterMetricFamily(
            "node_resize_kubelet_restarts", "Kubelet restarts seen (a new process start time).",
            value=restarts)
        yield _gauge("node_resize_kubelet_feature_enabled",
                     "Resize feature gates as the kubelet's /metrics reports them.", "gate",
                     features)
        yield _gauge("node_resize_kubelet_capacity_configured",
                     "KEP-3953's Node condition CapacityConfigured: 1 for its current reason.",
                     "reason", configured, ordered=False)
        count = GaugeMetricFamily(
            "node_resize_kubelet_warning_events",
            "KEP-3953: the kubelet's Warning Events on this Node (EmergencyCapacityReduced) the "
            "API holds now, counted by occurrence.", labels=["reason"])
        last = GaugeMetricFamily(
            "node_resize_kubelet_warning_event_last_timestamp_seconds",
            "When the newest of those Events was last reported.", labels=["reason"])
        for reason, (occurrences, last_seen) in warnings.items():
            count.add_metric([reason], occurrences)
            if last_seen is not None:
                last.add_metric([reason], last_seen)
        yield count
        yield last


def _gauge(name: str, help_: str, label: str, values: dict[str, int],
           ordered: bool = True) -> GaugeMetricFamily:
    """A gauge family of one label, one series per key."""
    fam = GaugeMetricFamily(name, help_, labels=[label])
    for key, value in (sorted(values.items()) if ordered else values.items()):
        fam.add_metric([key], value)
    return fam


def check_kubelet_restart(given: Options | Reads) -> Check:
    """Would a kubelet restart now succeed? Its CPU and memory manager checkpoints against
    what the kernel has online now, judged as the kubelet judges them at start."""
    name = "kubelet restart"
    reads = Reads.of(given)
    root = reads.kubelet_root
    if not root:
        return Check(name, "warn", "not checked: --kubelet-root-dir is empty",
                     "pass the kubelet's --root-dir (default /var/lib/kubelet)")
    snap = reads.kernel_or_check(name)
    if isinstance(snap, Check):
        return snap
    why = not_mounted(root)
    if why:  # not "no checkpoints": nothing of the kubelet's is visible here
        head, _, fix = why.partition(": mount ")
        return Check(name, "warn", f"not checked: {head}",
                     ("mount " + fix) if fix else "mount the kubelet's root dir read-only")
    try:
        cpu, memory = reads.checkpoints()
    except OSError as e:
        return Check(name, "warn", f"not checked: cannot read {e.filename}: {e.strerror}",
                     "run check as root on the node (or where the kubelet's root dir is mounted)")
    except ValueError as e:  # a FIFO or a device where a checkpoint should be: never read
        return Check(name, "warn", f"not checked: {e}",
                     "the kubelet writes regular files there; remove what is in their place")
    view = KubeletView()
    for event in (snap, cpu, memory):
        view.handle(event)
    problems = view.restart_problems()
    if problems["cpu_manager_state"]:
        offline = (cpu.default_cpus | cpu.assigned_cpus) - snap.cpus_online
        first = f"online {cpu_list(offline)} again before the kubelet restarts, or " \
            if offline and not cpu.error else ""
        return Check(name, "fail", "a kubelet restart now would fail: "
                     + problems["cpu_manager_state"],
                     f"{first}drain the node, stop the kubelet, delete {cpu.path} and start it "
                     "(it writes a new checkpoint for the CPUs online)")
    if problems["memory_manager_state"]:
        return Check(name, "fail", "a kubelet restart now would fail: "
                     + problems["memory_manager_state"],
                     f"drain the node, stop the kubelet, delete {memory.path} and start it")
    found = [p.path for p in (cpu, memory) if p.present]
    return Check(name, "ok", ("checkpoints match the CPUs and memory online: "
                              + ", ".join(found)) if found else f"no checkpoints in {root}")
