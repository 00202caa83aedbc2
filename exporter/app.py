"""The composition root: the one place that builds the agent from Options and runs it.

    sources (registry) -> Agent -> Correlator -> sinks (journal, metrics, traces)
                                                   \\-> /metrics (http.py) renders the Collector

Order matters and is written down here once: the journal opens first (it is handed each event
before anything acts on it) and resumes open episodes; the sources open next (a named source
that cannot start fails fast, exit 2); the port is bound; privileges are dropped; only then
are threads started (they inherit the reduced capability set): the journal's writer, the
sources', the trace sink's last among them.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from exporter import buildinfo
from exporter.agent import Agent
from exporter.clock import MonotonicWallClock
from exporter.config.options import Options
from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.correlator import Correlator
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.node_view import NodeView
from exporter.events import SourceStatus
from exporter.sources import registry
from exporter.sources.base import Source, SourceUnavailable
from exporter.sources.kernel.sysfs import SysfsSource
from exporter.sources.kernel.uevent import share_cpu_transitions

log = logging.getLogger("exporter")


class StartupError(Exception):
    """The exporter cannot start as configured; the message says why and what to do."""


def kubernetes_enabled(options: Options, env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    if options.kubernetes == "auto":
        return bool(options.kubeconfig or env.get("KUBERNETES_SERVICE_HOST"))
    return options.kubernetes == "on"


def resolve_node_name(options: Options, env: dict[str, str] | None = None) -> str:
    """--node-name (or $NODE_NAME, which click already read into it), else the hostname,
    lower-cased as the kubelet does when it has no --hostname-override."""
    env = dict(os.environ) if env is None else env
    if options.node_name:
        return options.node_name
    return (env.get("NODE_NAME", "").strip() or socket.gethostname()).lower()


def correlator_config(options: Options, kubernetes: bool) -> CorrelatorConfig:
    """The correlator's settings from the options (their defaults are the option table's)."""
    return CorrelatorConfig(coalesce_window=options.coalesce_window,
                            resync_deadline=options.resync_deadline,
                            readmission_settle=options.readmission_settle,
                            memory_tolerance_bytes=options.memory_tolerance,
                            kubernetes=kubernetes)


@dataclass
class OpenedSources:
    running: list[Source]
    reconciler: SysfsSource
    down: list[SourceStatus] = field(default_factory=list)

    def close(self) -> None:
        for source in self.running:
            source.close()


def open_sources(ctx: registry.SourceContext, kubernetes: bool) -> OpenedSources:
    """Open the kernel sources asked for (auto: every one that works, saying why the others
    do not; a named one that cannot start is a StartupError with the fix), the sysfs
    reconciler always, and the Kubernetes sources the options ask for."""
    options = ctx.options
    auto = options.sources == ("auto",)
    reconciler = registry.spec("sysfs").factory(ctx)
    assert isinstance(reconciler, SysfsSource)
    try:
        reconciler.open()  # always: the gauges' truth, even when sysfs transitions are not wanted
    except SourceUnavailable as e:
        raise StartupError(f"sysfs/procfs unreadable: {e}") from e
    opened = OpenedSources([reconciler], reconciler)
    for spec in registry.specs(registry.KERNEL):
        if spec.name == "sysfs" or not (auto or spec.name in options.sources
                                        or not spec.selectable):
            continue
        source = spec.factory(ctx)
        try:
            try:
                source.open()
            except (OSError, ValueError) as e:  # unforeseen here (not root, odd tree): a reason
                raise SourceUnavailable(f"cannot open: {e}",
                                        "run `node-resize-exporter check` for what is "
                                        "missing") from e
        except SourceUnavailable as e:
            if not auto and spec.selectable:
                opened.close()
                raise StartupError(f"--source {spec.name}: {e.reason}. Fix: {e.fix}") from e
            log.warning("source %s unavailable: %s (fix: %s)", spec.name, e.reason, e.fix)
            opened.down.append(SourceStatus(spec.name, False, ctx.clock.now(), e.reason))
            continue
        opened.running.append(source)
    share_cpu_transitions(opened.running)  # with BPF's cpuhp attached, uevents skip CPUs
    if kubernetes:
        # Not opened here: they connect in their own threads and report up/down themselves, so
        # an API server that is slow at start-up does not delay the kernel side.
        opened.running += [spec.factory(ctx) for spec in registry.specs(registry.KUBERNETES)
                           if spec.wanted(options)]
        log.info("kubernetes: watching node %s", ctx.node_name)
    return opened


def open_journal(options: Options, clock: MonotonicWallClock) -> Any:
    """The journal sink, its writer not started yet (serve() starts it after the privilege
    drop). A path the user named must be creatable and open now, or it is an error with the
    fix; the default path degrades instead (logged, counted, retried: a full disk may be
    freed). A journal of a newer schema is not an error either: the sink reports itself down
    and everything else runs (a rolled-back DaemonSet must not crash-loop on its hostPath)."""
    if options.no_journal:
        return None
    from exporter.sinks.journal.schema import JournalRefused, default_journal_path
    from exporter.sinks.journal.sink import JournalSink
    path = options.journal or default_journal_path()
    try:
        return JournalSink(path, clock=clock,
                           must_open=bool(options.journal), start=False)
    except JournalRefused as e:  # a link, a FIFO, a loose directory, a path never creatable
        raise StartupError(str(e)) from None
    except OSError as e:
        if options.journal:
            raise StartupError(f"--journal {options.journal}: {e.strerror or e}. Fix: a "
                               "writable path on a local filesystem, or --no-journal") from None
        # The default path (not root: under $HOME, which may be unwritable): degrade.
        log.warning("journal off: cannot create %s (%s); pass --journal PATH (writable) to "
                    "keep episodes across restarts, or --no-journal", path, e.strerror or e)
        return None


def preflight_kubernetes(options: Options, node: str) -> None:
    """Fail fast where the user asked for Kubernetes explicitly: a named kubeconfig must load,
    and `--kubernetes on` needs an API server that answers now. With `auto` and no kubeconfig
    the sources degrade instead (source_up 0 with the reason, retried)."""
    if not (options.kubeconfig or options.kubernetes == "on"):
        return
    from exporter.kube.client import KubeUnavailable, load_config
    try:
        config = load_config(options.kubeconfig)
    except KubeUnavailable as e:
        raise StartupError(f"{e.reason}. Fix: {e.fix}") from e
    if options.kubernetes != "on":
        return
    from exporter.kube.client import probe_api
    problem = probe_api(config, node)
    if problem:
        raise StartupError(f"--kubernetes on: {problem}. Fix: check the API server address "
                           "and credentials in the kubeconfig (or the service account), or use "
                           "--kubernetes auto to start without it")


@dataclass
class Built:
    """What build_agent made: the agent, the metrics sink /metrics renders, and the two
    decisions taken once for every part (the node's name, whether Kubernetes is joined)."""

    agent: Agent
    metrics: Any
    node: str
    kubernetes: bool


def build_agent(options: Options, clock: MonotonicWallClock, *, journal: Any = None,
                sinks: tuple[Any, ...] = (), node: str | None = None) -> Built:
    """The agent without the HTTP side: the correlator with its ledger and node view, the
    opened sources, the sinks (the journal first, then the metrics sink, then `sinks`), and the
    episodes the journal kept open, resumed through every sink. Raises StartupError."""
    from exporter.sinks.metrics import MetricsSink
    kubernetes = kubernetes_enabled(options)
    node = node or resolve_node_name(options)
    config = correlator_config(options, kubernetes)
    ledger, view = KernelLedger(), NodeView(config, clock)
    correlator = Correlator(config, clock, ledger=ledger, view=view)
    ctx = registry.SourceContext(options, clock, node)
    opened = open_sources(ctx, kubernetes)
    agent = Agent(correlator, opened.running, [journal] if journal is not None else [], clock,
                  reconciler=opened.reconciler, down=tuple(opened.down))
    metrics = MetricsSink(agent.lock, ledger, view, sinks=agent.sinks, kubernetes=kubernetes)
    agent.add_sink(metrics)
    for sink in sinks:
        agent.add_sink(sink)
    if journal is not None:
        updates = correlator.resume(journal.open_episodes())
        if updates:
            log.info("resumed %d open episode(s) from the journal", len(updates))
        for update in updates:
            agent.episode_log.on_update(update)
            for sink in agent.sinks:
                sink.on_update(update)
        _count_changes_while_down(journal, opened.reconciler, ledger)
    return Built(agent, metrics, node, kubernetes)


def _count_changes_while_down(journal: Any, reconciler: SysfsSource,
                              ledger: KernelLedger) -> None:
    """What sysfs says now against what the journal last knew."""
    from exporter.correlate.down_changes import changes_while_down, state_at_stop
    if reconciler.initial is None:
        return
    changes = changes_while_down(state_at_stop(journal.last_kernel_events()), reconciler.initial)
    ledger.down_changes.update(changes)
    for (resource, direction), n in sorted(changes.items(), key=str):
        log.info("while the exporter was down: %d %s %s transition(s)", n, resource.value,
                 direction.value)


def _stop(stop: threading.Event, agent: Agent) -> None:
    """SIGTERM/SIGINT: end serve()'s wait and wake the agent, which sleeps untimed while no
    episode is open."""
    stop.set()
    agent.wake()


def _fail(message: str) -> int:
    print(f"node-resize-exporter: error: {message}", file=sys.stderr)
    return 2


def serve(options: Options) -> int:
    """`run`: build everything, serve until SIGTERM/SIGINT. Returns the exit status."""
    from exporter.sinks.traces.env import trace_config_from_env
    from exporter.web.server import MetricsServer

    clock = MonotonicWallClock()
    node = resolve_node_name(options)
    kubernetes = kubernetes_enabled(options)
    log.info("node-resize-exporter %s (revision %s)", buildinfo.version(), buildinfo.revision())
    try:
        trace_config = trace_config_from_env()  # ValueError names the bad OTEL_* variable
        if kubernetes:
            preflight_kubernetes(options, node)
        journal = open_journal(options, clock)
    except (ValueError, OSError, StartupError) as e:
        return _fail(str(e))
    try:
        built = build_agent(options, clock, journal=journal, node=node)
    except StartupError as e:
        return _fail(str(e))
    agent = built.agent

    registry_ = CollectorRegistry()
    try:
        server = MetricsServer(options.listen_host, options.listen_port, registry_,
                               healthy=agent.alive.is_set, web_config=options.web_config_file,
                               version=agent.state_version,
                               telemetry_path=options.web_telemetry_path,
                               auth=options.web_auth, node_name=node,
                               kubeconfig=options.kubeconfig,
                               token_audiences=tuple(options.web_auth_token_audience))
    except ValueError as e:  # --web.config.file, --web.auth: the message names the fix
        agent.close_sources()
        return _fail(str(e))
    except OSError as e:
        agent.close_sources()
        where = f"{options.listen_host}:{options.listen_port}"
        if e.errno == errno.EADDRINUSE:
            return _fail(f"--web.listen-address {where}: address already in use (another "
                         "exporter running?); choose another port with --web.listen-address")
        return _fail(f"--web.listen-address {where}: cannot listen: {e.strerror or e}")

    _drop_privileges(any(s.name == "bpf" for s in agent.sources))
    if journal is not None:
        journal.start()  # its writer thread, after the drop like every thread
    # After the drop: the span processor starts a thread, which would keep what it inherited.
    if trace_config is not None:
        from exporter.sinks.traces.sink import TraceSink  # OpenTelemetry: only with traces on
        agent.add_sink(TraceSink(trace_config, journal=journal, node_name=node))
    if options.kube_events and kubernetes:
        from exporter.sinks.kube_events import KubeEventsSink, lightkube_events_api
        try:
            agent.add_sink(KubeEventsSink(node, lightkube_events_api(options.kubeconfig)))
        except Exception as e:  # noqa: BLE001 - no API configuration: Events off, say why
            log.warning("--kube-events: cannot post Events (%s); continuing without them", e)
    registry_.register(built.metrics)
    # The kubelet's local state (checkpoints, kubepods cpuset) has its own Collector,
    # a sink of the agent: it sees every event and pokes the sources that re-read after them.
    from exporter.sinks.kubelet_collector import KubeletSink
    registry_.register(KubeletSink.attach(agent))
    # What a resize left in the running containers (stale OOM scores, cpusets, limits): its
    # own sink and Collector, poking the running-pods source after CPU and memory events.
    from exporter.sinks.running_pods import RunningPodsSink
    registry_.register(RunningPodsSink.attach(agent))
    # What a kubelet restart now would reject: the Correlator's forecast, read at scrape time.
    from exporter.sinks.forecast_collector import ForecastCollector
    registry_.register(ForecastCollector(agent.lock, agent.correlator.forecast))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: _stop(stop, agent))
    server.start()
    log.info("started: sources %s; journal %s; kubernetes %s; traces %s",
             ", ".join(s.name for s in agent.sources),
             journal.path if journal is not None else "off",
             f"on (node {node})" if kubernetes else "off",
             "off" if trace_config is None else
             f"{'+'.join(trace_config.exporters)} ({trace_config.protocol})")
    try:
        agent.run(stop)
    finally:
        server.stop()
    log.info("stopped")
    return 0


def _drop_privileges(bpf_running: bool) -> None:
    """Everything privileged is done (programs attached, port bound): keep only what the
    running agent still needs (exporter/privileges.py). Before agent.run() starts the source
    threads, which inherit the reduced set. A refusal is logged, never fatal."""
    from exporter import privileges
    if os.geteuid() != 0 and privileges.capabilities() == 0:
        return
    keep = privileges.needed_after_start(bpf_running)
    try:
        privileges.drop_capabilities(keep)
    except OSError as e:
        log.warning("could not drop capabilities after start-up: %s", e)
