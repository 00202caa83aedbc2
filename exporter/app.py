"""The composition root: the one place that builds the agent from Options and runs it.

    sources (registry) -> Agent -> Correlator -> sinks (journal, metrics, traces, Events)
                                                   \\-> /metrics (exporter/web/) renders them

`serve` reads decide -> validate -> open -> collect -> run. Order matters and is written down
here once: what the options ask of the environment is validated first (OTEL_* variables, the
Kubernetes API, the right to post Events), then the journal opens (it is handed each event before
anything acts on it) and resumes open episodes; the sources open next (a named source that
cannot start fails fast, exit 2); the port is bound; privileges are dropped; only then are
threads started (they inherit the reduced capability set): the journal's writer, the sources',
the trace sink's last among them.

`check` asks the same steps whether they can start (exporter/cli/check.py): each raises
StartupError with the message `run` exits 2 with.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from prometheus_client import CollectorRegistry

from exporter import buildinfo, privileges, untrusted
from exporter.agent import Agent
from exporter.checks import quoted
from exporter.clock import MonotonicWallClock
from exporter.config.decide import Decisions, decide
from exporter.config.options import (
    KUBE_EVENTS,
    KUBECONFIG,
    KUBERNETES,
    PROCFS_ROOT,
    SYSFS_ROOT,
    WEB_AUTH,
    WEB_AUTH_TOKEN_AUDIENCE,
    WEB_CONFIG_FILE,
    WEB_HEALTH_LISTEN_ADDRESS,
    WEB_TELEMETRY_PATH,
    WEB_TLS_EXTRA_SAN,
    Options,
)
from exporter.correlate.correlator import Correlator
from exporter.correlate.down_changes import changes_while_down, state_at_stop
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.node_view import NodeView
from exporter.events import Direction, Resource, SourceStatus
from exporter.kube.client import (
    KubeUnavailable,
    load_config,
    make_client,
    prepare_decoding,
    probe_api,
)
from exporter.sinks import collectors
from exporter.sinks.journal.counters import BOOT_ID_PATH, valid_boot_id
from exporter.sinks.journal.path import DEFAULT_UNWRITABLE, WRITABLE_FIX
from exporter.sinks.journal.schema import JournalRefused
from exporter.sinks.journal.sink import JournalSink
from exporter.sinks.kube_events import NAMESPACE as EVENTS_NAMESPACE
from exporter.sinks.kube_events import KubeEventsSink, lightkube_events_api
from exporter.sinks.kubelet_collector import KubeletSink
from exporter.sinks.metrics import MetricsSink
from exporter.sinks.plan_collector import PlanSink, SharedViews
from exporter.sinks.running_pods_collector import RunningPodsSink
from exporter.sources import registry
from exporter.sources.base import Source, SourceUnavailable
from exporter.sources.kernel import memory_devices
from exporter.sources.kubelet.kubelet_checkpoint import KUBELET_ROOT_DIR
from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
from exporter.sources.registry import SOURCES
from exporter.web.server import MetricsServer, WebSettings

if TYPE_CHECKING:
    from exporter.sinks.traces.env import TraceConfig

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The exporter cannot start as configured; the message says why and, after ". Fix: ",
    what to do."""


class AddressInUse(StartupError):
    """--web.listen-address is taken (another exporter running?)."""


# ---------------------------------------------------------------- validate


def trace_config(options: Options) -> TraceConfig | None:
    """What OTEL_* asks for (None: traces off). StartupError names a bad variable."""
    # Imported here, not at the top: the OpenTelemetry SDK is the dearest import of the
    # exporter, and only start-up (run, check) reads the OTEL_* variables.
    from exporter.sinks.traces.env import trace_config_from_env
    try:
        return trace_config_from_env()
    except (ValueError, OSError) as e:
        raise StartupError(str(e)) from None


def preflight_kubernetes(options: Options, decisions: Decisions) -> None:
    """Fail fast where the user asked for Kubernetes explicitly: a named kubeconfig must load,
    and `--kubernetes on` needs an API server that answers now. With `auto` and no kubeconfig
    the sources degrade instead (source_up 0 with the reason, retried)."""
    if not decisions.kubernetes or not (KUBECONFIG.of(options) or KUBERNETES.of(options) == "on"):
        return
    try:
        config = load_config(KUBECONFIG.of(options))
    except KubeUnavailable as e:
        raise StartupError(f"{e.reason}. Fix: {e.fix}") from e
    if KUBERNETES.of(options) != "on":
        return
    problem = probe_api(config, decisions.node)
    if problem:
        raise StartupError(f"--kubernetes on: {quoted(problem, 300)}. Fix: check the API "
                           "server address and credentials in the kubeconfig (or the service "
                           "account), or use --kubernetes auto to start without it")


def access_denied(config: Any, verb: str, group: str, resource: str,
                  namespace: str | None = None, timeout: float = 5.0) -> str:
    """"" when the API server allows this identity `verb` on `resource` (a
    SelfSubjectAccessReview, as `kubectl auth can-i` asks), else why not. Raises when the API
    server cannot be asked (unreachable, 401)."""
    client, transport = make_client(config, request_timeout=timeout)
    try:
        review = client.create(SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(
            resourceAttributes=ResourceAttributes(verb=verb, group=group, resource=resource,
                                                  namespace=namespace))))
    finally:
        transport.close()
    status = review.status
    if status is not None and status.allowed:
        return ""
    reason = quoted((status.reason if status is not None else "") or "no reason given")
    return f"{verb} on {resource} denied ({reason})"


def preflight_events(options: Options, decisions: Decisions,
                     warn: Callable[[str], None] = log.warning) -> None:
    """--kube-events needs create on Events in their namespace: a refusal is a StartupError
    (every Event would be refused); an API server that cannot be asked now is not (it may come
    back, and the sink counts what it cannot post): `warn` says so."""
    if not (KUBE_EVENTS.of(options) and decisions.kubernetes):
        return
    try:
        denied = access_denied(load_config(KUBECONFIG.of(options)), "create", "", "events",
                               EVENTS_NAMESPACE)
    except Exception as e:  # noqa: BLE001 - unreachable, 401, no configuration: say so, go on
        warn(f"--kube-events: cannot ask the API server whether Events may be posted "
             f"({quoted(e)}); posting them anyway")
        return
    if denied:
        raise StartupError(f"--kube-events: {denied} in namespace {EVENTS_NAMESPACE}. Fix: "
                           "apply deploy/components/kube-events (create and patch on events) "
                           "to the exporter's service account, or drop --kube-events")


def validate(options: Options, decisions: Decisions) -> TraceConfig | None:
    """What the options ask of the environment, before anything opens. Returns the trace
    configuration (None: off)."""
    traces = trace_config(options)
    preflight_kubernetes(options, decisions)
    preflight_events(options, decisions)
    return traces


# ---------------------------------------------------------------- open


def kernel_sources_asked(options: Options) -> list[registry.SourceSpec]:
    """The kernel sources `run` opens besides the reconciler: every one with auto, else those
    --source names and those that are not chosen (state readers such as auto_online_blocks)."""
    chosen = SOURCES.of(options)
    auto = chosen == ("auto",)
    return [spec for spec in registry.specs(registry.KERNEL) if not spec.reconciles
            and (auto or spec.name in chosen or not spec.selectable)]


def kubernetes_sources_asked(options: Options, decisions: Decisions
                             ) -> list[registry.SourceSpec]:
    if not decisions.kubernetes:
        return []
    return [spec for spec in registry.specs(registry.KUBERNETES) if spec.wanted(options)]


@dataclass
class OpenedSources:
    running: list[tuple[registry.SourceSpec, Source]]
    reconciler: Any  # the reconciling source (sysfs): its first read is `initial`
    down: list[SourceStatus] = field(default_factory=list)

    def sources(self) -> list[Source]:
        return [source for _, source in self.running]

    def close(self) -> None:
        for source in self.sources():
            source.close()

    def pokes(self) -> list[tuple[Source, frozenset[Resource]]]:
        return [(source, spec.poked_by) for spec, source in self.running if spec.poked_by]

    def lossy(self) -> frozenset[str]:
        return frozenset(spec.name for spec, _ in self.running if spec.lossy)

    def capabilities_after_start(self) -> set[str]:
        return set().union(*(spec.capabilities_after_start() for spec, _ in self.running))


def open_sources(ctx: registry.SourceContext, decisions: Decisions) -> OpenedSources:
    """Open the kernel sources asked for (auto: every one that works, saying why the others
    do not; a named one that cannot start is a StartupError with the fix), the reconciler
    always, and the Kubernetes sources the options ask for."""
    spec = registry.reconciler()
    reconciler = spec.build(ctx)
    try:
        reconciler.open()  # always: the gauges' truth, even when its transitions are not wanted
    except SourceUnavailable as e:
        raise StartupError(f"sysfs/procfs unreadable: {e}") from e
    opened = OpenedSources([(spec, reconciler)], reconciler)
    for spec in kernel_sources_asked(ctx.options):
        try:
            opened.running.append((spec, open_kernel_source(spec, ctx)))
        except SourceUnavailable as e:
            if SOURCES.of(ctx.options) != ("auto",) and spec.selectable:
                opened.close()
                raise StartupError(f"--source {spec.name}: {e.reason}. Fix: {e.fix}") from e
            log.warning("source %s unavailable: %s (fix: %s)", spec.name, e.reason, e.fix)
            opened.down.append(SourceStatus(spec.name, False, ctx.clock.now(), e.reason))
    share_cpu_transitions(opened)
    # Not opened here: they connect in their own threads and report up/down themselves, so an
    # API server that is slow at start-up does not delay the kernel side.
    opened.running += [(spec, spec.build(ctx))
                       for spec in kubernetes_sources_asked(ctx.options, decisions)]
    if decisions.kubernetes:
        log.info("kubernetes: watching node %s", decisions.node)
    return opened


def open_kernel_source(spec: registry.SourceSpec, ctx: registry.SourceContext) -> Source:
    source = spec.build(ctx)
    try:
        source.open()
    except (OSError, ValueError) as e:  # unforeseen here (not root, odd tree): a reason
        raise SourceUnavailable(f"cannot open: {e}", "run `node-resize-exporter check` for "
                                "what is missing") from e
    return source


def share_cpu_transitions(opened: OpenedSources) -> bool:
    """When a source reports every CPU transition (BPF with its cpuhp programs attached), the
    sources that defer to it (uevent) are no longer woken for them: one wake-up per
    transition, not two. True when that was arranged."""
    if not any(spec.reports_cpu_transitions and source.reports_cpu_transitions()
               for spec, source in opened.running):
        return False
    results = [source.leave_cpu_transitions() for spec, source in opened.running
               if spec.defers_cpu_transitions]
    return bool(results) and all(results)


def open_journal(decisions: Decisions, clock: MonotonicWallClock) -> JournalSink | None:
    """The journal sink, its writer not started yet (serve() starts it after the privilege
    drop). A path the user named must be creatable and open now, or it is an error with the
    fix; the default path degrades instead (logged, counted, retried: a full disk may be
    freed). A journal of a newer schema is not an error either: the sink reports itself down
    and everything else runs (a rolled-back DaemonSet must not crash-loop on its hostPath)."""
    path = decisions.journal
    if path is None:
        return None
    try:
        return JournalSink(path, clock=clock, must_open=decisions.journal_named, start=False)
    except JournalRefused as e:  # a link, a FIFO, a loose directory, a path never creatable
        raise StartupError(str(e)) from None
    except OSError as e:
        if decisions.journal_named:
            raise StartupError(f"--journal {path}: {e.strerror or e}. Fix: {WRITABLE_FIX}"
                               ) from None
        # The default path (not root: under $HOME, which may be unwritable): degrade.
        log.warning(DEFAULT_UNWRITABLE, path, e.strerror or e)
        return None


def web_settings(options: Options, decisions: Decisions) -> WebSettings:
    """Where and how the endpoint serves, as the options say."""
    return WebSettings(options.listen_host, options.listen_port,
                       web_config=WEB_CONFIG_FILE.of(options),
                       telemetry_path=WEB_TELEMETRY_PATH.of(options), auth=WEB_AUTH.of(options),
                       node_name=decisions.node, kubeconfig=KUBECONFIG.of(options),
                       token_audiences=tuple(WEB_AUTH_TOKEN_AUDIENCE.of(options)),
                       extra_sans=tuple(WEB_TLS_EXTRA_SAN.of(options)),
                       health_address=WEB_HEALTH_LISTEN_ADDRESS.of(options))


def open_server(options: Options, decisions: Decisions, metrics: CollectorRegistry,
                healthy: Callable[[], bool] = lambda: True,
                version: Callable[[], object] = lambda: None,
                plan: Callable[[str], tuple[int, bytes]] | None = None) -> MetricsServer:
    """The endpoint, its web config read and checked and its port bound (not serving yet);
    `plan` answers GET /plan."""
    try:
        return MetricsServer(web_settings(options, decisions), metrics, healthy=healthy,
                             version=version, plan=plan)
    except ValueError as e:  # --web.config.file, --web.auth: the message names the fix
        raise StartupError(str(e)) from None
    except OSError as e:
        host = options.listen_host
        where = f"{f'[{host}]' if ':' in host else host}:{options.listen_port}"
        if e.errno == errno.EADDRINUSE:
            raise AddressInUse(f"--web.listen-address {where}: address already in use "
                               "(another exporter running?). Fix: choose another port with "
                               "--web.listen-address") from None
        raise StartupError(f"--web.listen-address {where}: cannot listen: "
                           f"{e.strerror or e}") from None


@dataclass
class Built:
    """What build_agent made: the agent, the metrics sink /metrics renders, and the
    capabilities its sources still need once started."""

    agent: Agent
    metrics: MetricsSink
    keep: set[str]


def build_agent(options: Options, clock: MonotonicWallClock, *, journal: Any = None,
                sinks: tuple[Any, ...] = (), decisions: Decisions | None = None) -> Built:
    """The agent without the HTTP side: the correlator with its ledger and node view, the
    opened sources, the sinks (the journal first, then the metrics sink, then `sinks`), and the
    episodes the journal kept open, resumed through every sink. Raises StartupError."""
    decisions = decisions or decide(options)
    ledger, view = KernelLedger(), NodeView(decisions.correlator, clock)
    correlator = Correlator(decisions.correlator, clock, ledger=ledger, view=view)
    opened = open_sources(registry.SourceContext(options, clock, decisions.node), decisions)
    prepare_decoding()  # before any thread decodes (msgspec's first decode is not thread-safe)
    agent = Agent(correlator, opened.sources(), [journal] if journal is not None else [], clock,
                  pokes=opened.pokes(), down=tuple(opened.down))
    metrics = MetricsSink(agent.lock, ledger, view, sinks=agent.sinks,
                          kubernetes=decisions.kubernetes, lossy=opened.lossy())
    agent.add_sink(metrics)
    for sink in sinks:
        agent.add_sink(sink)
    if journal is not None:
        _resume(agent, journal, opened.reconciler, ledger, PROCFS_ROOT.of(options))
    return Built(agent, metrics, opened.capabilities_after_start())


def _resume(agent: Agent, journal: JournalSink, reconciler: Any, ledger: KernelLedger,
            procfs: str) -> None:
    """The episodes the journal kept open, through every sink; what changed while no exporter
    ran (what the reconciler reads now against what the journal last knew); the hotplug
    counters carried from this boot's earlier processes (exporter/sinks/journal/counters.py)."""
    updates = agent.correlator.resume(journal.open_episodes())
    if updates:
        log.info("resumed %d open episode(s) from the journal", len(updates))
    for update in updates:
        agent.episode_log.on_update(update)
        for sink in agent.sinks:
            sink.on_update(update)
    changes = Counter[tuple[Resource, Direction]]() if reconciler.initial is None else \
        changes_while_down(state_at_stop(journal.last_kernel_events()), reconciler.initial)
    for (resource, direction), n in sorted(changes.items(), key=str):
        log.info("while the exporter was down: %d %s %s transition(s)", n, resource.value,
                 direction.value)
    # The counters go on from what this boot's earlier processes committed (issue 36 M6):
    # a transition the killed process counted after its last scrape shows in this one's.
    carried = journal.carry(boot_id(procfs), changes)
    for key, n in carried.transitions.items():
        ledger.transitions[key] = ledger.transitions.get(key, 0) + n
    ledger.down_changes.update(carried.down_changes)
    if journal.counters_refused:
        ledger.malformed["journal"] += 1


def boot_id(procfs: str) -> str | None:
    """The kernel's boot id (a UUID), or None (a tree without it: nothing is carried)."""
    path = os.path.join(procfs, BOOT_ID_PATH)
    try:
        text = untrusted.read_text(path, 64, what=path)
    except (OSError, ValueError) as e:
        log.info("no boot id at %s (%s): the hotplug counters start at 0", path, e)
        return None
    boot = valid_boot_id(text)
    if boot is None:
        log.info("no boot id at %s (not a UUID): the hotplug counters start at 0", path)
    return boot


# ---------------------------------------------------------------- run


def serve(options: Options) -> int:
    """`run`: build everything, serve until SIGTERM/SIGINT. Returns the exit status."""
    clock = MonotonicWallClock()
    decisions = decide(options)
    log.info("node-resize-exporter %s (revision %s)", buildinfo.version(), buildinfo.revision())
    metrics = CollectorRegistry(auto_describe=True)  # a family registered twice is refused
    try:
        traces = validate(options, decisions)
        journal = open_journal(decisions, clock)
        built = build_agent(options, clock, journal=journal, decisions=decisions)
    except StartupError as e:
        return _fail(str(e))
    agent = built.agent
    # Before you unplug: GET /plan and the unpluggable gauges. The plan reads the Correlator's
    # forecast, the running-pods view and the kubelet's view rather than keeping copies: those
    # sinks are attached here, before the plan sink; all are registered with the others from
    # the collectors' table (exporter/sinks/collectors.py).
    running, kubelet = RunningPodsSink.attach(agent), KubeletSink.attach(agent)
    plan = PlanSink.attach(agent, SharedViews.of(agent, running, kubelet),
                           SYSFS_ROOT.of(options), PROCFS_ROOT.of(options),
                           KUBELET_ROOT_DIR.of(options),
                           kubernetes=decisions.kubernetes, node=decisions.node,
                           cgroup_root=CGROUP_ROOT.of(options))
    try:
        server = open_server(options, decisions, metrics, agent.alive.is_set,
                             agent.state_version, plan=plan.endpoint())
    except StartupError as e:
        agent.close_sources()
        return _fail(str(e))
    # /proc/iomem shows addresses only through a file opened with CAP_SYS_ADMIN: opened now,
    # read again by the plan and the zones collector after the drop (memory_devices.py).
    memory_devices.hold_iomem(PROCFS_ROOT.of(options))
    _drop_privileges(built.keep)
    events = collect(options, decisions, agent, journal, traces)
    collectors.register(metrics, collectors.Wiring(agent, built.metrics, running, kubelet, plan))
    plan.start()  # the gauges' thread: after the privilege drop, as every thread
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: _stop(stop, agent))
    server.start()
    _log_started(agent, decisions, journal, traces, events)
    try:
        agent.run(stop)
    finally:
        server.stop()
    log.info("stopped")
    return 0


def collect(options: Options, decisions: Decisions, agent: Agent, journal: JournalSink | None,
            traces: TraceConfig | None) -> str:
    """After the privilege drop, every thread that start-up leaves (the journal's writer, the
    span processor's, the Events poster's). Returns whether Events are posted, for the
    start-up line. (The Collectors /metrics renders: exporter/sinks/collectors.py.)"""
    if journal is not None:
        journal.start()
    if traces is not None:
        agent.add_sink(_trace_sink(traces, journal, decisions.node))
    events = "off"
    if KUBE_EVENTS.of(options) and decisions.kubernetes:
        try:
            agent.add_sink(KubeEventsSink(decisions.node,
                                          lightkube_events_api(KUBECONFIG.of(options))))
            events = "posted"
        except Exception as e:  # noqa: BLE001 - no API configuration: Events off, say why
            log.warning("--kube-events: cannot post Events (%s); continuing without them",
                        quoted(e))
            events = "off (cannot post)"
    return events


def _trace_sink(traces: TraceConfig, journal: JournalSink | None, node: str) -> Any:
    from exporter.sinks.traces.sink import TraceSink  # the OpenTelemetry SDK: see trace_config
    return TraceSink(traces, journal=journal, node_name=node)


def _log_started(agent: Agent, decisions: Decisions, journal: JournalSink | None,
                 traces: TraceConfig | None, events: str) -> None:
    journal_state = "off" if journal is None else str(journal.path) if journal.up else "down"
    log.info("started: sources %s; journal %s; kubernetes %s; events %s; traces %s",
             ", ".join(s.name for s in agent.sources), journal_state,
             f"on (node {decisions.node})" if decisions.kubernetes else "off", events,
             "off" if traces is None else
             f"{'+'.join(traces.exporters)} ({traces.protocol})",
             extra={"sources": [s.name for s in agent.sources],
                    "journal": "off" if journal is None else "up" if journal.up else "down",
                    "kubernetes": decisions.kubernetes, "events": events})


def _stop(stop: threading.Event, agent: Agent) -> None:
    """SIGTERM/SIGINT: end serve()'s wait and wake the agent, which sleeps untimed while no
    episode is open."""
    stop.set()
    agent.wake()


def _fail(message: str) -> int:
    print(f"node-resize-exporter: error: {message}", file=sys.stderr)
    return 2


def _drop_privileges(keep: set[str]) -> None:
    """Everything privileged is done (programs attached, port bound): keep only what the
    running sources declared they still need (their `capabilities_after_start`). Before
    agent.run() starts the source threads, which inherit the reduced set. A refusal is
    logged, never fatal."""
    if os.geteuid() != 0 and privileges.capabilities() == 0:
        return
    try:
        privileges.drop_capabilities(keep)
    except OSError as e:
        log.warning("could not drop capabilities after start-up: %s", e)
