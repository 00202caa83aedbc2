"""What a resize left behind in the running containers, as Prometheus gauges: a sink and a
Collector in one, like the kubelet sink beside it (exporter/sinks/kubelet_collector.py).

The agent hands it every raw event (`on_event`, in the agent's thread); it feeds the pure
RunningPodsView (exporter/correlate/running_pods_view.py); /metrics takes a copy (a sequence
lock: the agent never waits for a reader) and judges it (once per change of the view): judged
at scrape time, so a memory block that goes offline makes a Burstable container's OOM score stale at
the next scrape, without a rescan. The running-pods source rescans after every CPU or memory
event (its `poked_by`: a cpuset changes without any notification), at least
--running-pods.min-interval apart.

The plan sink (exporter/sinks/plan_collector.py) plans on a copy of this view rather than keeping
one of its own. The composition root wires it (exporter/app.py):

    running = RunningPodsSink.attach(agent)   # before the plan sink, which is handed it
    registry.register(running)
"""
from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.checks import Check
from exporter.config.options import Options
from exporter.correlate.running_pods_view import KINDS, RunningPodsView
from exporter.events import Event
from exporter.readnow import CGROUP_ROOT, NO_KUBEPODS, Reads, Unlisted
from exporter.sinks import ViewSink


class RunningPodsSink(ViewSink):
    @staticmethod
    def check(reads: Reads) -> list[Check]:
        """What a resize left in the running containers now (`check`'s line)."""
        return [check_running_pods(reads)]

    def __init__(self) -> None:
        super().__init__()
        self.view = RunningPodsView()
        # A sequence lock: odd while the agent's thread changes the view. The agent never
        # waits for a reader; a reader copies the view and keeps the copy only when no change
        # began meanwhile (else it copies again).
        self._seq = 0
        self._copy: tuple[int, RunningPodsView] | None = None  # the last copy handed out

    def on_event(self, event: Event) -> None:
        self._seq += 1
        try:
            self.feed(event)
        finally:
            self._seq += 1

    def copy(self) -> RunningPodsView:
        """The view as it stands, a copy its later events do not change (the same copy while
        the view is unchanged), taken without any lock the agent waits for. Its findings are
        judged once, by whoever asks first."""
        kept = self._copy
        while True:
            seq = self._seq
            if kept is not None and kept[0] == seq:
                return kept[1]
            if not seq & 1:
                copy = self.view.copy()
                if self._seq == seq:  # no change began while it was copied
                    self._copy = (seq, copy)
                    return copy
            time.sleep(0)  # the agent's thread is changing it: let it finish
            kept = self._copy

    def feed(self, event: Event) -> None:
        self.view.handle(event)

    # ------------------------------------------------------------ Collector

    def collect(self) -> Iterable[Metric]:
        # A copy (no lock: copy()), judged with none (4,096 containers take ~0.1 s), once per
        # change of the view.
        view = self.copy()
        counts = view.counts()
        scanned = view.containers()
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


def check_running_pods(given: Options | Reads, pods: list[object] | None = None) -> Check:
    """What a resize left in the running containers: their cgroups and processes scanned
    once, judged against the kernel now (OOM scores also need this node's pods from the API:
    the one bounded list of exporter/readnow when Kubernetes is on, else `pods`)."""
    name = "running containers"
    reads = Reads.of(given)
    if reads.running() is None:
        return Check(name, "warn", "not checked: --cgroup-root is empty or "
                     "--running-pods.max-containers is 0", "pass the host's cgroup mount")
    snap = reads.kernel_or_check(name)
    if isinstance(snap, Check):
        return snap
    read = reads.running()
    assert read is not None
    found, problems = read.found, read.problems
    if not found.cgroup_version:  # not "none stale": nothing was seen
        head, _, fix = NO_KUBEPODS.format(root=CGROUP_ROOT.of(reads.options)).partition(
            " (fix: ")
        return Check(name, "warn", f"not checked: {head}", fix.rstrip(")"))
    note = ""
    if pods is None:
        pods, note = _node_pods(reads)
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


def _node_pods(reads: Reads) -> tuple[list[object], str]:
    """This node's pods as the watch would convert them; ([], why not) when it cannot."""
    if not reads.decisions.kubernetes:
        return [], "; OOM scores not judged: Kubernetes is off (its pods' requests are needed)"
    listed = reads.node_and_pods()
    if isinstance(listed, Unlisted):
        return [], f"; OOM scores not judged: {listed.message}"
    return list(listed.pods), ""
