"""What a resize left behind in the running containers, as Prometheus gauges: a sink and a
Collector in one, like the kubelet sink beside it (exporter/sinks/kubelet_collector.py).

The agent hands it every raw event (`on_event`, in the agent's thread); it feeds the pure
RunningPodsView (exporter/correlate/running_pods_view.py) under its own lock; /metrics takes a
copy under that lock and judges it outside (kept until the view changes): judged at scrape
time, so a memory block that goes offline makes a Burstable container's OOM score stale at
the next scrape, without a rescan. The running-pods source rescans after every CPU or memory
event (its `poked_by`: a cpuset changes without any notification), at least
--running-pods.min-interval apart.

The plan sink (exporter/sinks/plan_collector.py) plans on a copy of this view rather than keeping
one of its own. The composition root wires it (exporter/app.py):

    running = RunningPodsSink.attach(agent)   # before the plan sink, which is handed it
    registry.register(running)
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.checks import Check, quoted
from exporter.config.decide import decide
from exporter.config.options import KUBECONFIG, PROCFS_ROOT, Options
from exporter.correlate.running_pods_view import KINDS, RunningPodsView
from exporter.events import Event
from exporter.kube.client import RawPod, load_config, make_client
from exporter.kube.convert import pod_status
from exporter.sinks import ViewSink, kernel_now
from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
from exporter.sources.kubelet.running_pods import RUNNING_PODS_MAX_CONTAINERS, scan


class RunningPodsSink(ViewSink):
    @staticmethod
    def check(options: Options) -> list[Check]:
        """What a resize left in the running containers now (`check`'s line)."""
        return [check_running_pods(options)]

    def __init__(self) -> None:
        super().__init__()
        self.view = RunningPodsView()

    def feed(self, event: Event) -> None:
        self.view.handle(event)

    # ------------------------------------------------------------ Collector

    def collect(self) -> Iterable[Metric]:
        # A copy taken under the lock the agent feeds the view under, judged outside it (4,096
        # containers take ~0.1 s); the findings go back to the view while it is the same.
        with self.lock:
            view = self.view.copy()
        counts = view.counts()
        scanned = view.containers()
        with self.lock:
            self.view.keep(view)
        stale = GaugeMetricFamily(
            "node_resize_running_containers_stale",
            "Running containers a resize left in a state the kubelet would not create today, "
            "by kind: an OOM score adjustment from another memory capacity, a cpuset with "
            "offline CPUs or without online ones, a CPU or memory limit above what the node "
            "has, a swap limit from another capacity. `node-resize-exporter check` names them.",
            labels=["kind"])
        for kind in KINDS:
            if kind in counts:
                stale.add_metric([kind], counts[kind])
        yield stale
        found = GaugeMetricFamily(
            "node_resize_running_containers",
            "Container cgroups under kubepods the last scan read.")
        if scanned is not None:
            found.add_metric([], scanned)
        yield found


# What to do about each kind of stale container (docs/runbooks.md says why).
RUNNING_PODS_FIX = {
    "oom_score_adj": "restart the pod (kubectl delete pod; its controller recreates it) for an "
                     "OOM score from today's memory",
    "cpuset_offline": "online the CPUs again, or re-create the pod",
    "cpuset_missing": "re-create the pod (cgroup v1 never gives a container an onlined CPU "
                      "back)",
    "cpu_limit_above_online": "online CPUs again or lower the pod's CPU limit",
    "memory_limit_above_capacity": "online memory again or lower the pod's memory limit",
    "swap_limit": "restart the pod for a swap share of today's memory and swap",
}
RUNNING_PODS_NAMED = 10  # containers named in the check's output; the counts stay exact


def check_running_pods(options: Options, pods: list[object] | None = None) -> Check:
    """What a resize left in the running containers: their cgroups and processes scanned
    once, judged against the kernel now (OOM scores also need this node's pods from the API:
    listed when Kubernetes is on, else `pods`)."""
    name = "running containers"
    root = CGROUP_ROOT.of(options)
    if not root or RUNNING_PODS_MAX_CONTAINERS.of(options) <= 0:
        return Check(name, "warn", "not checked: --cgroup-root is empty or "
                     "--running-pods.max-containers is 0", "pass the host's cgroup mount")
    snap = kernel_now(options, name)
    if isinstance(snap, Check):
        return snap
    problems: list[str] = []
    found = scan(root, PROCFS_ROOT.of(options), 0.0,
                 max_containers=RUNNING_PODS_MAX_CONTAINERS.of(options), problems=problems)
    if not found.cgroup_version:
        return Check(name, "ok", f"no kubepods cgroup under {root}")
    note = ""
    if pods is None:
        pods, note = _node_pods(options)
    view = RunningPodsView()
    for event in (snap, found, *pods):
        view.handle(event)  # type: ignore[arg-type]
    findings = view.findings()
    scanned = (f"{len(found.containers)} container cgroups (cgroup v{found.cgroup_version})"
               + (", scan truncated" if found.truncated else "")
               + (f", {found.skipped} unreadable: {problems[0]}" if found.skipped else "")
               + note)
    if not findings:
        return Check(name, "ok", f"none left stale by a resize: {scanned}")
    counts = view.counts()
    kinds = [k for k in KINDS if counts.get(k)]
    lines = [f"{f.kind}: {f.line()}" for f in findings[:RUNNING_PODS_NAMED]]
    more = len(findings) - len(lines)
    detail = (f"{len(findings)} finding(s) in running containers the kubelet would not create "
              f"so today ({', '.join(f'{k} {counts[k]}' for k in kinds)}; {scanned}):"
              + "".join(f"\n       {line}" for line in lines)
              + (f"\n       ... and {more} more" if more else ""))
    return Check(name, "warn", detail, "; ".join(RUNNING_PODS_FIX[k] for k in kinds))


def _node_pods(options: Options) -> tuple[list[object], str]:
    """This node's pods as the watch would convert them; ([], why not) when it cannot."""
    decisions = decide(options)
    if not decisions.kubernetes:
        return [], "; OOM scores not judged: Kubernetes is off (its pods' requests are needed)"
    try:
        client, transport = make_client(load_config(KUBECONFIG.of(options)), request_timeout=10)
    except Exception as e:  # noqa: BLE001 - KubeUnavailable and friends: say why, go on
        return [], f"; OOM scores not judged: {quoted(e)}"
    try:
        listing = client.list(RawPod, namespace="*", chunk_size=500,
                              fields={"spec.nodeName": decisions.node})
        pods = [pod_status(dict(item), 0.0, None).event for item in listing]
        return [p for p in pods if p is not None], ""
    except Exception as e:  # noqa: BLE001 - unreachable, refused: the cgroup kinds still count
        return [], f"; OOM scores not judged: cannot list pods ({quoted(e)})"
    finally:
        transport.close()
