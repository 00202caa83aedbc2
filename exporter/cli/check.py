"""`node-resize-exporter check`: what works here, what does not, and the fix for each.

The same pipeline as `run` (exporter/app.py), asking each step whether it can start instead of
starting it: the options validated as `run` validates them (OTEL_* variables, the Kubernetes
API, the right to post Events, the web config and the listen address, each by the very
function `run` calls), the journal by its own policy, and each source `run` would open by its
own `check()`. Then what the running agent would judge: a kubelet restart now, the running
containers, the readmission forecast. This module orchestrates and renders; it decides nothing.
"""
from __future__ import annotations

import itertools
import os
import socket
import ssl
import stat
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from exporter import app
from exporter.checks import FAIL, OK, WARN, Check, failed, guarded, quoted
from exporter.clock import MonotonicWallClock
from exporter.config.decide import Decisions, decide
from exporter.config.options import Options
from exporter.correlate.kubelet_view import KubeletView, cpu_list
from exporter.correlate.readmission_forecast import REASON_RESOURCE, ReadmissionForecast
from exporter.correlate.running_pods import KINDS, RunningPodsView
from exporter.events import SourceStatus
from exporter.kube.client import KubeUnavailable, RawNode, RawPod, load_config, make_client
from exporter.kube.convert import node_status, pod_status
from exporter.sinks.journal.path import check_journal
from exporter.sources import registry
from exporter.sources.apiserver.kube_pods import ALL_NAMESPACES
from exporter.sources.kernel.sysfs import SysfsReader
from exporter.sources.kubelet.kubelet_checkpoint import (
    read_cpu_manager_state,
    read_memory_manager_state,
)
from exporter.sources.kubelet.kubelet_metrics import KubeletMetricsSource
from exporter.sources.kubelet.running_pods import scan

__all__ = ["Check", "run_checks", "render"]


def run_checks(options: Options | None = None) -> list[Check]:
    """Every line, in the order `run` meets them."""
    options = options or Options()
    decisions = decide(options)
    warnings: list[str] = []
    checks = [*guarded("traces", check_traces, options),
              *guarded("kube events", check_events, options, decisions, warnings),
              *[Check("kube events", WARN, w) for w in warnings],
              *guarded("journal", check_journal, decisions.journal),
              *guarded("sources", check_sources, options, decisions),
              *guarded("web", check_web, options, decisions)]
    return checks + [*guarded("kubelet restart", _one, check_kubelet_restart, options),
                     *guarded("running containers", _one, check_running_pods, options),
                     *guarded("kubernetes", kubernetes_checks, options, decisions)]


def render(checks: list[Check]) -> tuple[str, int]:
    """The text `check` prints and its exit status: 1 when any check FAILs, else 0."""
    lines = [c.line() for c in checks]
    bpf = [c for c in checks if c.name == "bpf source"]
    if bpf:  # only when the BPF source was asked for
        lines.append("BPF source: " + ("can run" if bpf[0].status == OK else "cannot run (the "
                                       "exporter falls back to uevent and sysfs)"))
    return "\n".join(lines), 1 if any(c.status == FAIL for c in checks) else 0


def _one(check: Callable[..., Check], *args: Any) -> list[Check]:
    return [check(*args)]


def check_traces(options: Options) -> list[Check]:
    try:
        config = app.trace_config(options)
    except app.StartupError as e:
        return [failed("traces", str(e))]
    if config is None:
        return []
    return [Check("traces", OK, f"{'+'.join(config.exporters)} ({config.protocol})")]


def check_events(options: Options, decisions: Decisions, warnings: list[str]) -> list[Check]:
    """--kube-events: the SelfSubjectAccessReview `run` asks at start."""
    if not (options.kube_events and decisions.kubernetes):
        return []
    try:
        app.preflight_events(options, decisions, warn=warnings.append)
    except app.StartupError as e:
        return [failed("kube events", str(e))]
    if warnings:
        return []
    return [Check("kube events", OK, "create on events allowed")]


def check_sources(options: Options, decisions: Decisions) -> list[Check]:
    """Each kernel source `run` would open, opened by its own check() (BPF: compiled, loaded
    and attached) and closed; only those the options ask for."""
    ctx = registry.SourceContext(options, MonotonicWallClock(), decisions.node)
    found: list[Check] = []
    for spec in [registry.reconciler(), *app.kernel_sources_asked(options)]:
        found += guarded(f"{spec.name} source", spec.can_start, ctx)
    return found


def check_web(options: Options, decisions: Decisions) -> list[Check]:
    """The endpoint built as `run` builds it (web config, --web.auth, the port bound), then
    closed. A port held by a running node-resize-exporter (`check` in its pod) is a warning."""
    try:
        server = app.open_server(options, decisions, CollectorRegistry())
    except app.AddressInUse as e:
        if _exporter_answers(options.listen_host, options.listen_port):
            return [Check("web", WARN, f"{options.listen_host}:{options.listen_port} is served "
                          "by a node-resize-exporter already running (the one this check runs "
                          "beside?)", "another --web.listen-address to run a second one")]
        return [failed("web", str(e))]
    except app.StartupError as e:
        return [failed("web", str(e))]
    try:
        auth = {"kubernetes": ", Kubernetes bearer tokens",
                "none": ", no authentication"}.get(options.web_auth, "")
        if server.auth.enabled:
            auth = ", basic auth"
        return [Check("web", OK, f"{server.scheme}://{options.listen_host}:{server.port}"
                      f"{options.web_telemetry_path} can be served{auth}")]
    finally:
        server.stop()


def _exporter_answers(host: str, port: int) -> bool:
    """Does a node-resize-exporter answer its index page there (plain or TLS)?"""
    where = f"[{host}]" if ":" in host else host
    where = "127.0.0.1" if host == "0.0.0.0" else "::1" if host == "::" else where
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    for scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(f"{scheme}://{where}:{port}/", timeout=2,
                                        context=unverified if scheme == "https" else None) as r:
                return b"<title>node-resize-exporter</title>" in r.read(4096)
        except (OSError, ValueError):
            continue
    return False


def check_kubelet_restart(options: Options) -> Check:
    """Would a kubelet restart now succeed? Its CPU and memory manager checkpoints against
    what the kernel has online now, judged as the kubelet judges them at start."""
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
    decisions = decide(options)
    if not decisions.kubernetes:
        return [], "; OOM scores not judged: Kubernetes is off (its pods' requests are needed)"
    try:
        client, transport = make_client(load_config(options.kubeconfig), request_timeout=10)
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


# ---------------------------------------------------------------- the Kubernetes side


def kubernetes_checks(options: Options, decisions: Decisions) -> list[Check]:
    """Configuration, this node's Node object, RBAC (SelfSubjectAccessReview for what the
    sources call), the podresources socket and the kubelet metrics endpoint."""
    if not decisions.kubernetes:
        return [Check("kubernetes", "warn", "off (not in a cluster, no --kubeconfig)",
                      "pass --kubeconfig or run as the DaemonSet to join the Node's view")]
    try:
        config = load_config(options.kubeconfig)
    except KubeUnavailable as e:
        return [Check("kubernetes config", "fail", e.reason, e.fix)]
    try:
        app.preflight_kubernetes(options, decisions)  # what `run` asks at start
    except app.StartupError as e:
        return [failed("kubernetes config", str(e))]
    node = decisions.node
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

    name = "readmission forecast"
    node = decide(options).node
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
                        chunk_size=500), FORECAST_PODS_MAX)]
    except Exception as e:  # noqa: BLE001 - unreachable, 403...: say so, never a traceback
        return Check(name, "warn", f"not checked: listing node {node} and its pods failed: "
                     f"{quoted(e) or type(e).__name__}",
                     "check the API server address, the credentials and list on nodes and pods")
    finally:
        transport.close()
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
    denied = []
    try:
        for verb, group, resource in RBAC_NEEDED:
            if app.access_denied(config, verb, group, resource):
                denied.append(f"{verb} {resource}")
    except Exception as e:  # noqa: BLE001 - unreachable, 401...: say so
        return Check("kubernetes RBAC", "fail", f"SelfSubjectAccessReview failed: {quoted(e)}",
                     "check the API server address and the credentials")
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

    client, transport = make_client(config, request_timeout=5.0)  # type: ignore[arg-type]
    try:
        if list(client.list(RawNode, fields={"metadata.name": name}, chunk_size=1)):
            return Check("kubernetes node", "ok", f"Node {name} found")
        seen = [n.metadata.name for n in itertools.islice(
            client.list(RawNode, chunk_size=NODES_NAMED), NODES_NAMED) if n.metadata]
    except Exception as e:  # noqa: BLE001 - unreachable, 401, 403: say so
        return Check("kubernetes node", "fail", f"cannot list Nodes: {quoted(e)}",
                     "check the API server address, the credentials and list on nodes")
    finally:
        transport.close()
    listed = ", ".join(str(s) for s in seen) or "none"
    more = " (first ten)" if len(seen) == NODES_NAMED else ""
    return Check("kubernetes node", "fail", f"the API server has no Node {name!r}; it has: "
                 f"{listed}{more}", "pass --node-name (or NODE_NAME, the DaemonSet sets it from "
                 "spec.nodeName) with this node's Node name")


def check_podresources(path: str) -> Check:
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
    seen: list[object] = []
    KubeletMetricsSource(MonotonicWallClock(), url=url).poll(seen.append)
    down = [e for e in seen if isinstance(e, SourceStatus) and not e.up]
    if down:
        return Check("kubelet metrics", "fail", down[-1].reason,  # type: ignore[attr-defined]
                     "check --kubelet-metrics-url and get on nodes/metrics")
    return Check("kubelet metrics", "ok", f"{url} answers with Prometheus text")
