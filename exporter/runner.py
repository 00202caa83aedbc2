"""`run`: open the sources, start the sinks and the HTTP endpoint, stop cleanly on SIGTERM."""
from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading

from prometheus_client import CollectorRegistry

from exporter.agent import Agent, StartupError
from exporter.config import Options
from exporter.http import MetricsServer
from exporter.sinks.metrics import ExporterCollector

log = logging.getLogger("exporter")


def _fail(message: str) -> int:
    print(f"node-resize-exporter: error: {message}", file=sys.stderr)
    return 2


def open_journal(options: Options, clock):
    if not options.journal_enabled:
        return None
    from exporter.sinks.journal import Journal, default_journal_path
    return Journal(options.journal or default_journal_path(), clock=clock)


def serve(options: Options) -> int:
    from exporter.sinks.traces import TraceSink, trace_config_from_env

    agent = Agent(options)
    try:
        trace_config = trace_config_from_env()  # ValueError names the bad OTEL_* variable
        node = None
        if agent.kubernetes:
            from exporter import kube
            node = kube.resolve_node_name(options.node_name)
        journal = open_journal(options, agent.clock)
    except (ValueError, OSError) as e:
        return _fail(str(e))
    # The journal first: it must hold an event before anything acts on it.
    agent.sinks = [journal] if journal is not None else []
    try:
        agent.open()
    except StartupError as e:
        return _fail(str(e))
    if journal is not None:
        resumed = journal.open_episodes()
        if resumed:
            agent.correlator.resume(resumed)
            log.info("resumed %d open episode(s) from the journal", len(resumed))

    registry = CollectorRegistry()
    try:
        server = MetricsServer(options.listen_host, options.listen_port, registry,
                               healthy=agent.alive.is_set, web_config=options.web_config_file,
                               version=agent.state_version)
    except ValueError as e:  # --web.config.file: the message names the key and the fix
        for source in agent.sources:
            source.close()
        return _fail(str(e))
    except OSError as e:
        for source in agent.sources:
            source.close()
        where = f"{options.listen_host}:{options.listen_port}"
        if e.errno == errno.EADDRINUSE:
            return _fail(f"--listen {where}: address already in use (another exporter "
                         "running?); choose another port with --listen")
        return _fail(f"--listen {where}: cannot listen: {e.strerror or e}")

    _drop_privileges(agent)
    # After the drop: the span processor starts a thread, which would keep what it inherited.
    if trace_config is not None:
        agent.sinks.append(TraceSink(trace_config, journal=journal, node_name=node))
    registry.register(ExporterCollector(agent.lock, agent.correlator.ledger,
                                        agent.correlator.tracker, agent.sinks))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    try:
        agent.run(stop)
    finally:
        server.stop()
    log.info("stopped")
    return 0


def _drop_privileges(agent: Agent) -> None:
    """Everything privileged is done (programs attached, port bound): keep only what the
    running agent still needs (exporter/privileges.py). Before agent.run() starts the source
    threads, which inherit the reduced set. A refusal is logged, never fatal."""
    from exporter import privileges
    if os.geteuid() != 0 and privileges.capabilities() == 0:
        return
    keep = privileges.needed_after_start(any(s.name == "bpf" for s in agent.sources))
    try:
        privileges.drop_capabilities(keep)
    except OSError as e:
        log.warning("could not drop capabilities after start-up: %s", e)
