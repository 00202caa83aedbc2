"""The decisions every part of a command shares, taken once from the options (and the
environment): this node's name, whether Kubernetes is joined, the correlator's settings and
where the journal is. `run`, `check`, the postmortem, bench and the test kit read them here.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from exporter.config.options import Options
from exporter.correlate.config import CorrelatorConfig
from exporter.sinks.journal.path import journal_path


@dataclass(frozen=True)
class Decisions:
    node: str  # this node's Node name
    kubernetes: bool  # the Kubernetes sources and sinks run
    correlator: CorrelatorConfig
    journal: Path | None  # None: --no-journal
    journal_named: bool  # --journal given: it must open at start (else the default degrades)


def decide(options: Options, env: dict[str, str] | None = None) -> Decisions:
    env = dict(os.environ) if env is None else env
    kubernetes = kubernetes_enabled(options, env)
    return Decisions(node=resolve_node_name(options, env), kubernetes=kubernetes,
                     correlator=correlator_config(options, kubernetes),
                     journal=journal_path(options.journal, options.no_journal),
                     journal_named=bool(options.journal) and not options.no_journal)


def kubernetes_enabled(options: Options, env: dict[str, str] | None = None) -> bool:
    """--kubernetes on, or auto in a cluster (a service account's host) or with --kubeconfig."""
    env = dict(os.environ) if env is None else env
    if options.kubernetes == "auto":
        return bool(options.kubeconfig or env.get("KUBERNETES_SERVICE_HOST"))
    return bool(options.kubernetes == "on")


def resolve_node_name(options: Options, env: dict[str, str] | None = None) -> str:
    """--node-name (or $NODE_NAME, which click already read into it), else the hostname,
    lower-cased as the kubelet does when it has no --hostname-override."""
    env = dict(os.environ) if env is None else env
    if options.node_name:
        return str(options.node_name)
    return (env.get("NODE_NAME", "").strip() or socket.gethostname()).lower()


def correlator_config(options: Options, kubernetes: bool) -> CorrelatorConfig:
    """The correlator's settings from the options (their defaults are the option table's)."""
    return CorrelatorConfig(coalesce_window=options.coalesce_window,
                            resync_deadline=options.resync_deadline,
                            readmission_settle=options.readmission_settle,
                            memory_tolerance_bytes=options.memory_tolerance,
                            kubernetes=kubernetes)
