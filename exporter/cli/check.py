"""`node-resize-exporter check`: what works here, what does not, and the fix for each."""
from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.config.options import Options
from exporter.privileges import CAPS, capabilities
from exporter.sources import registry
from exporter.sources.base import SourceUnavailable

if TYPE_CHECKING:
    from exporter.correlate.readmission_forecast import ReadmissionForecast

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = CAPS["CAP_SYS_ADMIN"], CAPS["CAP_PERFMON"], CAPS["CAP_BPF"]


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn" (works, with less), "fail"
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status.upper():4} {self.name}: {self.detail}"
        return text + (f"\n     fix: {self.fix}" if self.fix and self.status != "ok" else "")


def check_capabilities() -> Check:
    caps = capabilities()
    has = lambda c: bool(caps >> c & 1)  # noqa: E731
    if has(CAP_BPF) and has(CAP_PERFMON):
        return Check("capabilities", "ok", "CAP_BPF and CAP_PERFMON")
    if has(CAP_SYS_ADMIN):
        return Check("capabilities", "ok", "CAP_SYS_ADMIN (covers BPF on kernels < 5.8)")
    return Check("capabilities", "fail", "neither CAP_BPF+CAP_PERFMON nor CAP_SYS_ADMIN",
                 "run as root, or add capabilities BPF and PERFMON (SYS_ADMIN before 5.8)")


def bpf_requirement_checks() -> list[Check]:
    """The BPF source's own pre-flight, one line per requirement (the same list it checks)."""
    from exporter.sources.kernel.bpf.requirements import requirements
    return [Check(r.name, "ok" if r.ok else "fail", r.detail, r.fix) for r in requirements()]


def check_btf() -> Check:
    if Path("/sys/kernel/btf/vmlinux").exists():
        return Check("BTF", "ok", "/sys/kernel/btf/vmlinux present")
    return Check("BTF", "warn", "no /sys/kernel/btf/vmlinux (not needed: the programs read "
                 "tracepoint args only)", "use a kernel with CONFIG_DEBUG_INFO_BTF for CO-RE tools")


def check_kprobes() -> Check:
    if not os.access("/sys/kernel/tracing", os.R_OK | os.X_OK):
        return Check("kprobes", "fail", "cannot look into /sys/kernel/tracing (not root, or "
                     "tracefs not mounted)", "run as root, or grant CAP_BPF, CAP_PERFMON")
    if Path("/sys/kernel/tracing/kprobe_events").exists():
        return Check("kprobes", "ok", "memory online/offline probes can attach")
    return Check("kprobes", "warn", "kernel built without CONFIG_KPROBES: the memory BPF "
                 "probes (online_pages/offline_pages) cannot attach; memory hotplug is still "
                 "seen through uevents and sysfs, without kernel durations or refusal codes",
                 "a kernel with CONFIG_KPROBES=y for memory durations and EBUSY reasons")


def check_uevent() -> Check:
    from exporter.sources.kernel.uevent import KERNEL_GROUP, NETLINK_KOBJECT_UEVENT
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT) as s:
            s.bind((0, KERNEL_GROUP))
        return Check("uevent socket", "ok", "NETLINK_KOBJECT_UEVENT group 1 joined")
    except OSError as e:
        return Check("uevent socket", "fail", str(e),
                     "run in the host network namespace (hostNetwork: true)")


def check_sysfs(sysfs: str = "/sys") -> Check:
    cpu = Path(sysfs) / "devices/system/cpu/online"
    mem = Path(sysfs) / "devices/system/memory/block_size_bytes"
    if not os.access(cpu, os.R_OK):
        return Check("sysfs", "fail", f"cannot read {cpu}", "mount the host's /sys")
    if not mem.exists():
        return Check("sysfs", "warn", f"{cpu} readable; no memory hotplug in sysfs",
                     "a kernel with CONFIG_MEMORY_HOTPLUG to see memory blocks")
    return Check("sysfs", "ok", f"{cpu} and memory blocks readable")


def check_source(spec: registry.SourceSpec, ctx: registry.SourceContext) -> Check:
    """The only real test of a source: build it from the registry, open it (BPF: compile,
    load and attach), close it again."""
    source = spec.factory(ctx)
    try:
        source.open()
    except SourceUnavailable as e:
        return Check(f"{spec.name} source", "fail", e.reason, e.fix)
    except Exception as e:  # noqa: BLE001 - `check` reports, it never prints a traceback
        return Check(f"{spec.name} source", "fail", f"cannot open: {e}"[:300],
                     "see the checks above (run as root?)")
    try:
        detail = f"opens ({spec.help})"
        programs = getattr(source, "attached", None)
        if programs:
            attached = [p for p, (ok, _) in programs.items() if ok]
            missing = [p for p, (ok, _) in programs.items() if not ok]
            detail = f"compiled and attached: {', '.join(attached)}"
            if missing:
                detail += f"; not attached: {', '.join(missing)}"
        return Check(f"{spec.name} source", "ok", detail)
    finally:
        source.close()


def check_journal(options: Options) -> Check:
    """Can `run` journal where it would? A corrupt journal only costs a warning and a counter
    at run time (journaling stays off), so `check` is where it is said plainly."""
    import sqlite3

    from exporter.sinks.journal.path import JournalPathError, cannot_create, check_journal_path
    from exporter.sinks.journal.schema import NEWER_FIX, SCHEMA_VERSION, default_journal_path
    if options.no_journal:
        return Check("journal", "ok", "off (--no-journal)")
    path = Path(options.journal) if options.journal else default_journal_path()
    fix = (f"move it away (mv {path} {path}.corrupt): `run` starts a new one; until then "
           "nothing is journaled and node_resize_exporter_sink_errors_total{sink=\"journal\"} "
           "grows")
    try:
        check_journal_path(path)
    except JournalPathError as e:
        return Check("journal", "fail", str(e).split(". Fix: ")[0],
                     str(e).partition(". Fix: ")[2])
    problem = cannot_create(path)  # tried, not guessed: root passes access() under /proc
    if problem:
        return Check("journal", "fail", f"{path}: {problem}",
                     "a writable path on a local filesystem (--journal PATH), or --no-journal")
    if not path.exists():
        return Check("journal", "ok", f"{path} does not exist yet; `run` creates it (0600)")
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5) as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            problems = [r[0] for r in c.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.Error as e:
        return Check("journal", "fail", f"{path} is corrupt or not a journal: {e}", fix)
    if problems != ["ok"]:
        return Check("journal", "fail", f"{path} is corrupt: {'; '.join(problems)[:300]}", fix)
    if version > SCHEMA_VERSION:
        return Check("journal", "fail", f"{path} has schema {version}, newer than this "
                     f"exporter's {SCHEMA_VERSION}: `run` leaves it untouched and runs without "
                     "a journal (sink_up{sink=\"journal\"} 0)",
                     f"{NEWER_FIX.replace('move the file away', f'mv {path} {path}.newer')}")
    return Check("journal", "ok", f"{path} readable, schema {version}, no corruption found")


def run_checks(options: Options | None = None) -> list[Check]:
    """Host diagnostics (why a source may fail), then every kernel source the registry knows,
    opened for real."""
    from exporter.clock import MonotonicWallClock
    options = options or Options()
    checks = [_guarded("capabilities", check_capabilities),
              *_guarded_list("bpf requirements", bpf_requirement_checks),
              _guarded("BTF", check_btf), _guarded("kprobes", check_kprobes),
              _guarded("uevent socket", check_uevent),
              _guarded("sysfs", check_sysfs, options.sysfs_root)]
    ctx = registry.SourceContext(options, MonotonicWallClock(), node_name="")
    checks += [_guarded(f"{spec.name} source", check_source, spec, ctx)
               for spec in registry.specs(registry.KERNEL)]
    return checks + [_guarded("journal", check_journal, options),
                     _guarded("kubelet restart", check_kubelet_restart, options),
                     _guarded("running pods", check_running_pods, options),
                     *_guarded_list("kubernetes", kubernetes_checks, options)]


def _guarded(name: str, check: Callable[..., Check], *args: Any) -> Check:
    """One check, whatever it meets (not root, a FIFO, a garbage tree): a failed line with
    the reason, never a traceback that hides the other lines."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - reported as the check's result
        return Check(name, "fail", f"could not be checked: {_why(e)}"[:300],
                     "run check as root on the node")


def _guarded_list(name: str, checks: Callable[..., list[Check]], *args: Any) -> list[Check]:
    try:
        return checks(*args)
    except Exception as e:  # noqa: BLE001 - reported as the check's result
        return [Check(name, "fail", f"could not be checked: {_why(e)}"[:300],
                      "run check as root on the node")]


def _why(e: Exception) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.strerror or e}: {e.filename}"
    return repr(e)


def check_kubelet_restart(options: Options) -> Check:
    """Would a kubelet restart now succeed? Its CPU and memory manager checkpoints against
    what the kernel has online now, judged as the kubelet judges them at start."""
    from exporter.correlate.kubelet_view import KubeletView, cpu_list
    from exporter.sources.kernel.sysfs import SysfsReader
    from exporter.sources.kubelet.kubelet_checkpoint import (
        read_cpu_manager_state,
        read_memory_manager_state,
    )
    name = "kubelet restart"
    root = options.kubelet_root_dir
    if not root:
        return Check(name, "warn", "not checked: --kubelet-root-dir is empty",
                     "pass the kubelet's --root-dir (default /var/lib/kubelet)")
    try:
        snap = SysfsReader(options.sysfs_root, options.procfs_root).read(0.0)
    except (OSError, ValueError) as e:
        return Check(name, "warn", f"not checked: cannot read sysfs/procfs ({e})",
                     "mount the host's /sys and /proc")
    try:
        cpu, memory = read_cpu_manager_state(root, 0.0), read_memory_manager_state(root, 0.0)
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
    from exporter.correlate.running_pods import KINDS, RunningPodsView
    from exporter.sources.kernel.sysfs import SysfsReader
    from exporter.sources.kubelet.running_pods import scan
    name = "running containers"
    root = options.cgroup_root
    if not root or options.running_pods_max_containers <= 0:
        return Check(name, "warn", "not checked: --cgroup-root is empty or "
                     "--running-pods.max-containers is 0", "pass the host's cgroup mount")
    try:
        snap = SysfsReader(options.sysfs_root, options.procfs_root).read(0.0)
    except (OSError, ValueError) as e:
        return Check(name, "warn", f"not checked: cannot read sysfs/procfs ({e})",
                     "mount the host's /sys and /proc")
    problems: list[str] = []
    found = scan(root, options.procfs_root, 0.0,
                 max_containers=options.running_pods_max_containers, problems=problems)
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
    from exporter.app import kubernetes_enabled, resolve_node_name
    if not kubernetes_enabled(options):
        return [], "; OOM scores not judged: Kubernetes is off (its pods' requests are needed)"
    from exporter.kube.client import RawPod, load_config, make_client
    from exporter.kube.convert import pod_status
    try:
        client, transport = make_client(load_config(options.kubeconfig), request_timeout=10)
    except Exception as e:  # noqa: BLE001 - KubeUnavailable and friends: say why, go on
        return [], f"; OOM scores not judged: {e}"
    try:
        listing = client.list(RawPod, namespace="*", chunk_size=500,
                              fields={"spec.nodeName": resolve_node_name(options)})
        pods = [pod_status(dict(item), 0.0, None).event for item in listing]
        return [p for p in pods if p is not None], ""
    except Exception as e:  # noqa: BLE001 - unreachable, refused: the cgroup kinds still count
        return [], f"; OOM scores not judged: cannot list pods ({str(e)[:200]})"
    finally:
        transport.close()


# ---------------------------------------------------------------- the Kubernetes side


def kubernetes_checks(options: Options) -> list[Check]:
    """Configuration, this node's Node object, RBAC (SelfSubjectAccessReview for what the
    sources call), the podresources socket and the kubelet metrics endpoint."""
    from exporter.app import kubernetes_enabled, resolve_node_name
    if not kubernetes_enabled(options):
        return [Check("kubernetes", "warn", "off (not in a cluster, no --kubeconfig)",
                      "pass --kubeconfig or run as the DaemonSet to join the Node's view")]
    from exporter.kube.client import KubeUnavailable, load_config
    try:
        config = load_config(options.kubeconfig)
    except KubeUnavailable as e:
        return [Check("kubernetes config", "fail", e.reason, e.fix)]
    node = resolve_node_name(options)
    checks = [Check("kubernetes config", "ok", f"server {config.cluster.server} (node {node})")]
    checks.append(check_rbac(config))
    checks.append(check_node(config, node))
    checks.append(check_readmission_forecast(options))
    if options.podresources_socket:
        checks.append(check_podresources(options.podresources_socket))
    if options.kubelet_metrics_url:
        checks.append(check_kubelet_metrics(options.kubelet_metrics_url))
    return checks


FORECAST_NAMED = 8  # pods named on the check line; the metrics name up to LISTED_MAX
FORECAST_PODS_MAX = 10_000  # pods listed at most (the watch sources' own bound)


def check_readmission_forecast(options: Options) -> Check:
    """Which pods a kubelet restart now would reject: the exporter's own forecast
    (exporter/correlate/readmission_forecast.py), made from one list of this node's Node and
    pods, the kernel now, and the CPU manager's policy from its checkpoint."""
    import itertools

    from exporter.app import resolve_node_name
    from exporter.correlate.readmission_forecast import ReadmissionForecast
    from exporter.kube.client import KubeUnavailable, RawNode, RawPod, load_config, make_client
    from exporter.kube.convert import node_status, pod_status
    from exporter.sources.apiserver.kube_pods import ALL_NAMESPACES
    from exporter.sources.kernel.sysfs import SysfsReader
    from exporter.sources.kubelet.kubelet_checkpoint import read_cpu_manager_state
    name = "readmission forecast"
    node = resolve_node_name(options)
    try:
        snap = SysfsReader(options.sysfs_root, options.procfs_root).read(0.0)
    except (OSError, ValueError) as e:
        return Check(name, "warn", f"not checked: cannot read sysfs/procfs ({e})",
                     "mount the host's /sys and /proc")
    try:
        config = load_config(options.kubeconfig)
    except KubeUnavailable as e:
        return Check(name, "warn", f"not checked: {e.reason}", e.fix)
    client, transport = make_client(config, request_timeout=10.0)
    try:
        nodes = [dict(o) for o in client.list(RawNode, fields={"metadata.name": node},
                                              chunk_size=1)]
        pods = [dict(o) for o in itertools.islice(
            client.list(RawPod, namespace=ALL_NAMESPACES, fields={"spec.nodeName": node},
                        chunk_size=500), FORECAST_PODS_MAX + 1)]
    except Exception as e:  # noqa: BLE001 - unreachable, 403...: say so, never a traceback
        # Never a forecast of the pods it did not see.
        return Check(name, "warn", "cannot forecast: listing node "
                     f"{node} and its pods failed: {str(e)[:200] or type(e).__name__}",
                     "check the API server address, the credentials and list on nodes and pods")
    finally:
        transport.close()
    if len(pods) > FORECAST_PODS_MAX:
        return Check(name, "warn", f"cannot forecast: more than {FORECAST_PODS_MAX} pods are "
                     f"bound to node {node} (the list bound); a forecast of some would not be "
                     "one of all", "check --node-name and the pods the API server binds to it")
    if not nodes:
        return Check(name, "warn", f"not checked: no Node named {node}",
                     "pass --node-name (or $NODE_NAME) as the kubelet registered it")
    forecast = ReadmissionForecast()
    forecast.on_snapshot(snap)
    converted = node_status(nodes[0], 0.0).event
    if converted is None or not hasattr(converted, "allocatable"):
        return Check(name, "warn", f"not checked: the Node {node} is not readable", "")
    forecast.on_node(converted)  # type: ignore[arg-type]
    if options.kubelet_root_dir:
        try:
            forecast.on_cpu_manager(read_cpu_manager_state(options.kubelet_root_dir, 0.0))
        except OSError:
            pass  # the kubelet restart line says why; judged without the CPU manager here
    for obj in pods:
        event = pod_status(obj, 0.0, None).event
        if event is not None:
            forecast.on_pod(event)  # type: ignore[arg-type]
    return forecast_check(forecast, snap.cpus_offline & snap.cpus_present)


def forecast_check(forecast: ReadmissionForecast, offline: frozenset[int]) -> Check:
    """The check line for a ReadmissionForecast: the pods it would reject and the fix."""
    from exporter.correlate.kubelet_view import cpu_list
    from exporter.correlate.readmission_forecast import REASON_RESOURCE
    name = "readmission forecast"
    result = forecast.result()
    if result is None:
        return Check(name, "warn", "not checked: no Node status or kernel snapshot", "")
    skipped = f" ({result.skipped} pods with unusable requests left out)" if result.skipped \
        else ""
    if not result.rejected_total:
        return Check(name, "ok", f"a kubelet restart now would readmit all {result.pods} pods"
                     + skipped)
    named = ", ".join(f"{r.namespace}/{r.name} ({r.reason})"
                      for r in result.rejected[:FORECAST_NAMED])
    more = result.rejected_total - min(FORECAST_NAMED, len(result.rejected))
    if more:
        named += f" and {more} more"
    resources = {REASON_RESOURCE.get(reason, "") for reason, n in result.by_reason.items() if n}
    restore = []
    if "cpu" in resources and offline:
        restore.append(f"restore {cpu_list(offline).replace('cpu', 'cpu ')}")
    if resources & {"memory", "hugepages-2Mi", "hugepages-1Gi"}:
        restore.append("restore the memory taken away")
    if "pods" in resources:
        restore.append("raise the kubelet's maxPods")
    fix = "drain these" + (", or " + " and ".join(restore) if restore else "") + \
        ", before restarting the kubelet (docs/runbooks.md: Before you restart the kubelet)"
    return Check(name, "fail", f"a kubelet restart now would reject {result.rejected_total} "
                 f"of {result.pods} pods: {named}" + skipped, fix)


# (verb, API group, resource): what the list/watch sources call (deploy/clusterrole.yaml).
RBAC_NEEDED = tuple((verb, group, resource) for group, resource in (
    ("", "nodes"), ("", "pods"), ("coordination.k8s.io", "leases"), ("", "events"))
    for verb in ("list", "watch"))


def check_rbac(config: object) -> Check:
    from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
    from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

    from exporter.kube.client import make_client
    client, transport = make_client(config, request_timeout=5.0)  # type: ignore[arg-type]
    denied = []
    try:
        for verb, group, resource in RBAC_NEEDED:
            review = client.create(SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(
                resourceAttributes=ResourceAttributes(verb=verb, group=group,
                                                      resource=resource))))
            if not (review.status and review.status.allowed):
                denied.append(f"{verb} {resource}")
    except Exception as e:  # noqa: BLE001 - unreachable, 401...: say so
        return Check("kubernetes RBAC", "fail", f"SelfSubjectAccessReview failed: {e}",
                     "check the API server address and the credentials")
    finally:
        transport.close()
    if denied:
        return Check("kubernetes RBAC", "fail", f"denied: {', '.join(denied)}",
                     "bind deploy/clusterrole.yaml (list, watch on nodes, pods, leases and "
                     "events) to the exporter's service account")
    return Check("kubernetes RBAC", "ok", "list and watch on nodes, pods, leases and events "
                 "allowed")


NODES_NAMED = 10  # Nodes a FAIL lists when this node's name is not one of them


def check_node(config: object, name: str) -> Check:
    """Does the API server know this node's name? A wrong --node-name (or a hostname that is not
    the Node's name) watches nothing: every Kubernetes series would stay empty."""
    import itertools

    from exporter.kube.client import RawNode, make_client
    client, transport = make_client(config, request_timeout=5.0)  # type: ignore[arg-type]
    try:
        if list(client.list(RawNode, fields={"metadata.name": name}, chunk_size=1)):
            return Check("kubernetes node", "ok", f"Node {name} found")
        seen = [n.metadata.name for n in itertools.islice(
            client.list(RawNode, chunk_size=NODES_NAMED), NODES_NAMED) if n.metadata]
    except Exception as e:  # noqa: BLE001 - unreachable, 401, 403: say so
        return Check("kubernetes node", "fail", f"cannot list Nodes: {e}",
                     "check the API server address, the credentials and list on nodes")
    finally:
        transport.close()
    listed = ", ".join(str(s) for s in seen) or "none"
    more = " (first ten)" if len(seen) == NODES_NAMED else ""
    return Check("kubernetes node", "fail", f"the API server has no Node {name!r}; it has: "
                 f"{listed}{more}", "pass --node-name (or NODE_NAME, the DaemonSet sets it from "
                 "spec.nodeName) with this node's Node name")


def check_podresources(path: str) -> Check:
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return Check("podresources socket", "warn", f"{path}: {e.strerror}",
                     "mount /var/lib/kubelet/pod-resources from the host (the DaemonSet does)")
    if not stat.S_ISSOCK(mode):
        return Check("podresources socket", "fail", f"{path} is not a unix socket",
                     "point --podresources-socket at the kubelet's kubelet.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        try:
            s.connect(path)
        except OSError as e:
            return Check("podresources socket", "fail", f"{path}: connect: {e.strerror or e}",
                         "is the kubelet running? (the socket exists but nobody listens)")
    return Check("podresources socket", "ok", f"{path} accepts connections")


def check_kubelet_metrics(url: str) -> Check:
    from exporter.clock import MonotonicWallClock
    from exporter.events import SourceStatus
    from exporter.sources.kubelet.kubelet_metrics import KubeletMetricsSource
    seen: list[object] = []
    KubeletMetricsSource(MonotonicWallClock(), url=url).poll(seen.append)
    down = [e for e in seen if isinstance(e, SourceStatus) and not e.up]
    if down:
        return Check("kubelet metrics", "fail", down[-1].reason,  # type: ignore[attr-defined]
                     "check --kubelet-metrics-url and get on nodes/metrics")
    return Check("kubelet metrics", "ok", f"{url} answers with Prometheus text")
