"""What the journal file is: its schema and version, where it lives by default, its errors.

Kept apart from the Journal sink (journal.py) so the CLI and the checks can name these without
the writer.
"""
from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from exporter.events import Event, Transition

DEFAULT_MAX_AGE = 30 * 86400.0
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_PRUNE_EVERY = 1000
APP_DIR = "node-resize-exporter"
SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    type TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
CREATE TABLE IF NOT EXISTS episodes (
    id       TEXT PRIMARY KEY,
    resource TEXT,
    change   TEXT,
    opened   REAL,
    ended    REAL,
    outcome  TEXT,
    json     TEXT,            -- NULL only for a row mark_exported made before the episode came
    exported INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS episodes_opened ON episodes(opened);
CREATE INDEX IF NOT EXISTS episodes_ended ON episodes(ended);
"""

T = TypeVar("T")


class JournalError(Exception):
    """The journal cannot be read (missing, not a journal, no permission): the CLI exits 2."""


class JournalRefused(JournalError):
    """The journal must not be opened for writing (an unsafe path, a newer schema): `run`
    exits 2 with this message instead of journaling into the wrong thing."""


def default_journal_path() -> Path:
    """/var/lib/node-resize-exporter/journal.db for root, the XDG state directory otherwise."""
    if os.geteuid() == 0:
        return Path("/var/lib") / APP_DIR / "journal.db"
    state = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / APP_DIR / "journal.db"


def event_time(event: Event) -> float:
    if isinstance(event, Transition):  # it carries start/end, no time
        return float(event.end)
    return float(event.time)


def _refuse_newer_schema(conn: sqlite3.Connection, path: Path) -> None:
    """A journal a newer exporter wrote is not relabelled as ours (its rows would be misread);
    JournalRefused instead, which `run` turns into exit 2."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise JournalRefused(f"journal {path} has schema version {version}, newer than this "
                             f"exporter's {SCHEMA_VERSION}: it was written by a newer "
                             "node-resize-exporter. Fix: run that version, or move the file "
                             "away (a new journal is made), or pass --journal PATH")


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    event: Event
