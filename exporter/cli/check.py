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

from prometheus_client import CollectorRegistry

from exporter import app
from exporter.checks import FAIL, OK, WARN, Check, failed, guarded, quoted
from exporter.clock import MonotonicWallClock
from exporter.config.decide import Decisions, decide
from exporter.config.options import Options
from exporter.events import SourceStatus
from exporter.kube.client import KubeUnavailable, RawNode, load_config, make_client
from exporter.sinks.forecast_collector import ForecastCollector
from exporter.sinks.journal.sink import JournalSink
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.running_pods import RunningPodsSink
from exporter.sources import registry
from exporter.sources.kubelet.kubelet_metrics import KubeletMetricsSource

__all__ = ["Check", "run_checks", "render"]


def run_checks(options: Options | None = None) -> list[Check]:
    """Every line, in the order `run` meets them."""
    options = options or Options()
    decisions = decide(options)
    warnings: list[str] = []
    checks = [*guarded("traces", check_traces, options),
              *guarded("kube events", check_events, options, decisions, warnings),
              *[Check("kube events", WARN, w) for w in warnings],
              *guarded("journal", JournalSink.check, decisions.journal),
              *guarded("sources", check_sources, options, decisions),
              *guarded("web", check_web, options, decisions)]
    # What the running agent's sinks would judge now, each by its own check.
    return checks + [*guarded("kubelet restart", KubeletSink.check, options),
                     *guarded("running containers", RunningPodsSink.check, options),
                     *guarded("kubernetes", kubernetes_checks, options, decisions)]


def render(checks: list[Check]) -> tuple[str, int]:
    """The text `check` prints and its exit status: 1 when any check FAILs, else 0."""
    lines = [c.line() for c in checks]
    bpf = [c for c in checks if c.name == "bpf source"]
    if bpf:  # only when the BPF source was asked for
        lines.append("BPF source: " + ("can run" if bpf[0].status == OK else "cannot run (the "
                                       "exporter falls back to uevent and sysfs)"))
    return "\n".join(lines), 1 if any(c.status == FAIL for c in checks) else 0


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
    checks += ForecastCollector.check(options)
    if options.podresources_socket:
        checks.append(check_podresources(options.podresources_socket))
    if options.kubelet_metrics_url:
        checks.append(check_kubelet_metrics(options.kubelet_metrics_url))
    return checks


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
