"""`node-resize-exporter check`: what works here, what does not, and the fix for each.

The same pipeline as `run` (exporter/app.py), asking each step whether it can start instead of
starting it: the options validated as `run` validates them (OTEL_* variables, the Kubernetes
API, the right to post Events, the web config and the listen address, each by the very
function `run` calls), the journal by its own policy, and each source `run` would open by its
own `check()`. Then what the running agent would judge: a kubelet restart now, the running
containers, the readmission forecast. This module orchestrates and renders; it decides nothing.
"""
from __future__ import annotations

import ssl
import urllib.request

from prometheus_client import CollectorRegistry

from exporter import app
from exporter.checks import FAIL, OK, WARN, Check, failed, guarded, quoted
from exporter.clock import MonotonicWallClock
from exporter.config.decide import Decisions, decide
from exporter.config.options import KUBE_EVENTS, KUBECONFIG, WEB_AUTH, WEB_TELEMETRY_PATH, Options
from exporter.kube.client import KubeUnavailable, load_config
from exporter.readnow import Reads
from exporter.sinks import collectors
from exporter.sinks.journal.sink import JournalSink
from exporter.sources import registry

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
    # What the running agent's collectors would judge now, each by its own check (the
    # table: exporter/sinks/collectors.py).
    reads = Reads(options, decisions)  # one kernel read, one scan, one list of the pods
    return checks + [*collectors.checks(reads, kubernetes=False),
                     *guarded("kubernetes", kubernetes_checks, options, decisions, reads)]


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
    if not (KUBE_EVENTS.of(options) and decisions.kubernetes):
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
                "none": ", no authentication"}.get(WEB_AUTH.of(options), "")
        if server.auth.enabled:
            auth = ", basic auth"
        return [Check("web", OK, f"{server.scheme}://{options.listen_host}:{server.port}"
                      f"{WEB_TELEMETRY_PATH.of(options)} can be served{auth}")]
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


def kubernetes_checks(options: Options, decisions: Decisions,
                      reads: Reads | None = None) -> list[Check]:
    """Configuration (as `run` checks it at start), RBAC (SelfSubjectAccessReview for what the
    sources watch), each Kubernetes source's own check (this node's Node object, the
    podresources socket, the kubelet's metrics), the readmission forecast."""
    if not decisions.kubernetes:
        return [Check("kubernetes", "warn", "off (not in a cluster, no --kubeconfig)",
                      "pass --kubeconfig or run as the DaemonSet to join the Node's view")]
    try:
        config = load_config(KUBECONFIG.of(options))
    except KubeUnavailable as e:
        return [Check("kubernetes config", "fail", e.reason, e.fix)]
    try:
        app.preflight_kubernetes(options, decisions)  # what `run` asks at start
    except app.StartupError as e:
        return [failed("kubernetes config", str(e))]
    node = decisions.node
    checks = [Check("kubernetes config", "ok", f"server {config.cluster.server} (node {node})")]
    checks.append(check_rbac(config, options, decisions))
    # The Kubernetes sources `run` would start that can say more than "not opened at start"
    # (they connect in their own threads).
    ctx = registry.SourceContext(options, MonotonicWallClock(), node)
    for spec in app.kubernetes_sources_asked(options, decisions):
        if spec.check is not None:
            checks += guarded(f"{spec.name} source", spec.can_start, ctx)
    return checks + collectors.checks(reads or Reads(options, decisions), kubernetes=True)


def check_rbac(config: object, options: Options, decisions: Decisions) -> Check:
    """List and watch on what the Kubernetes sources `run` would start watch (their
    `watches`), each asked as `kubectl auth can-i` asks, in its namespace."""
    wanted = [w for spec in app.kubernetes_sources_asked(options, decisions)
              for w in spec.watches]
    names = [str(w) for w in wanted]
    named = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + \
        (names[-1] if names else "nothing")
    denied, grants = [], []
    try:
        for watch in wanted:
            for verb in ("list", "watch"):
                if app.access_denied(config, verb, watch.group, watch.resource,
                                     watch.namespace):
                    denied.append(f"{verb} {watch}")
                    grants.append(watch.granted_by)
    except Exception as e:  # noqa: BLE001 - unreachable, 401...: say so
        return Check("kubernetes RBAC", "fail", f"SelfSubjectAccessReview failed: {quoted(e)}",
                     "check the API server address and the credentials")
    if denied:
        files = ", ".join(dict.fromkeys(grants))
        return Check("kubernetes RBAC", "fail", f"denied: {', '.join(denied)}",
                     f"apply {files} (with the binding beside each) to the exporter's "
                     "service account")
    return Check("kubernetes RBAC", "ok", f"list and watch on {named} allowed")
