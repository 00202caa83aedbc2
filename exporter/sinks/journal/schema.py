"""What the journal file is: its schema and version, where it lives by default, its errors.

Kept apart from the store, the sink and the reader so the CLI and the checks can name these
without any of them.

Versions (PRAGMA user_version):
1. `events` and `episodes`, each episode row holding the whole episode (transitions included)
   as one JSON object, rewritten on every update.
2. adds `transitions`: an episode's transitions, one row each, appended as they join; the
   episode row then holds the episode without them. Opening a version 1 journal migrates it
   forward in place (the table is added; old rows keep their transitions inline and are read
   as they are).
   Later, still version 2 (an added table every version reads or ignores, no row rewritten):
   `counters`, one row per boot (the kernel's boot_id) with the hotplug counters carried
   across restarts (counters.py). A 0.2 exporter reading such a file ignores it.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from exporter.events import Event

DEFAULT_MAX_AGE = 30 * 86400.0
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_PRUNE_EVERY = 1000
SCHEMA_VERSION = 2

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
-- Version 2: one row per transition of an episode, by its place in the episode's list.
CREATE TABLE IF NOT EXISTS transitions (
    episode TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (episode, idx)
) WITHOUT ROWID;
-- Retention deletes episode rows; their transitions go with them.
CREATE TRIGGER IF NOT EXISTS episodes_delete_transitions AFTER DELETE ON episodes
BEGIN
    DELETE FROM transitions WHERE episode = old.id;
END;
-- Added within version 2: the hotplug counters of this boot, carried across restarts
-- (counters.py). Never pruned: one small row, replaced when the boot changes.
CREATE TABLE IF NOT EXISTS counters (
    boot_id TEXT PRIMARY KEY,
    json    TEXT NOT NULL
) WITHOUT ROWID;
"""

T = TypeVar("T")


class JournalError(Exception):
    """The journal cannot be read (missing, not a journal, no permission): the CLI exits 2."""


class JournalRefused(JournalError):
    """The journal must not be opened for writing (an unsafe path, a named path that cannot
    be created): `run` exits 2 with this message instead of journaling into the wrong thing."""


class JournalNewer(JournalRefused):
    """The journal was written by a newer exporter (a higher schema version). Not an exit: the
    journal is a hostPath, so a rolled-back DaemonSet would crash-loop on every node. The sink
    leaves the file untouched and reports itself down instead."""


def event_time(event: Event) -> float:
    """The time an event is filed under: its `time`, or a Transition's `end` (it has no time)."""
    t = getattr(event, "time", None)
    if t is None:
        t = getattr(event, "end", None)
    return float(t) if isinstance(t, (int, float)) else 0.0


NEWER_FIX = ("roll forward to the exporter that wrote it, or move the file away (a new journal "
             "is made), or pass --journal PATH")


def refuse_newer_schema(conn: sqlite3.Connection, path: Path) -> None:
    """A journal a newer exporter wrote is not relabelled as ours (its rows would be misread):
    JournalNewer, before anything is written to it."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise JournalNewer(f"journal {path} has schema version {version}, newer than this "
                           f"exporter's {SCHEMA_VERSION}: it was written by a newer "
                           f"node-resize-exporter. Fix: {NEWER_FIX}")


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    event: Event
