"""The decisions every part of a command shares, taken once from the options (and the
environment): this node's name, whether Kubernetes is joined, the correlator's settings and
where the journal is. `run`, `check`, the postmortem, bench and the test kit read them here.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from exporter.config.options import (
    COALESCE_WINDOW,
    JOURNAL,
    KUBECONFIG,
    KUBERNETES,
    MEMORY_TOLERANCE,
    NO_JOURNAL,
    NODE_NAME,
    READMISSION_SETTLE,
    RESYNC_DEADLINE,
    Options,
)
from exporter.correlate.config import CorrelatorConfig

APP_DIR = "node-resize-exporter"


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
                     journal=journal_path(JOURNAL.of(options), NO_JOURNAL.of(options)),
                     journal_named=bool(JOURNAL.of(options)) and not NO_JOURNAL.of(options))


def kubernetes_enabled(options: Options, env: dict[str, str] | None = None) -> bool:
    """--kubernetes on, or auto in a cluster (a service account's host) or with --kubeconfig."""
    env = dict(os.environ) if env is None else env
    if KUBERNETES.of(options) == "auto":
        return bool(KUBECONFIG.of(options) or env.get("KUBERNETES_SERVICE_HOST"))
    return bool(KUBERNETES.of(options) == "on")


def resolve_node_name(options: Options, env: dict[str, str] | None = None) -> str:
    """--node-name (or $NODE_NAME, which click already read into it), else the hostname,
    lower-cased as the kubelet does when it has no --hostname-override."""
    env = dict(os.environ) if env is None else env
    named = NODE_NAME.of(options)
    if named:
        return named
    return (env.get("NODE_NAME", "").strip() or socket.gethostname()).lower()


def correlator_config(options: Options, kubernetes: bool) -> CorrelatorConfig:
    """The correlator's settings from the options (their defaults are the option table's)."""
    return CorrelatorConfig(coalesce_window=COALESCE_WINDOW.of(options),
                            resync_deadline=RESYNC_DEADLINE.of(options),
                            readmission_settle=READMISSION_SETTLE.of(options),
                            memory_tolerance_bytes=MEMORY_TOLERANCE.of(options),
                            kubernetes=kubernetes)


def default_journal_path() -> Path:
    """/var/lib/node-resize-exporter/journal.db for root, the XDG state directory otherwise."""
    if os.geteuid() == 0:
        return Path("/var/lib") / APP_DIR / "journal.db"
    state = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / APP_DIR / "journal.db"


def journal_path(named: str | os.PathLike[str] | None, off: bool = False) -> Path | None:
    """Where the journal is: None when off (--no-journal), the named path, else the default."""
    if off:
        return None
    return Path(named) if named else default_journal_path()
