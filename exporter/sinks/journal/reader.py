"""Reading a journal: the postmortem commands (`episodes list|show|export`, `report`), replay
inputs, and what the agent resumes at start.

`JournalReader` opens the file read-only (SQLite `mode=ro`: it cannot create, migrate or write
anything, so it may read a journal copied off a node while the exporter still writes it). The
query functions below take a connection, so the sink can run the same ones on its own
connection at start-up.

An episode is its row plus, from schema version 2, its rows in `transitions` (schema.py); a
row written by version 1 holds its transitions inline and is read as it is.
"""
from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from exporter import codec
from exporter.correlate.model import Episode
from exporter.events import Event, Transition
from exporter.sinks.journal.schema import SCHEMA_VERSION, JournalError, StoredEvent

T = TypeVar("T")
log = logging.getLogger(__name__)


class Malformed:
    """Counts rows that would not decode (skipped, never raised)."""

    def __init__(self) -> None:
        self.count = 0


def has_transitions_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                        "name='transitions'").fetchone() is not None


def _decoded(text: str, kind: type[T], what: str, bad: Malformed) -> T | None:
    """The row's JSON as a `kind`, or None: a row that is not one is counted and skipped."""
    try:
        obj = codec.loads(text)
        if not isinstance(obj, kind):
            raise codec.CodecError(f"holds a {type(obj).__name__}")
    except codec.CodecError as e:
        bad.count += 1
        log.warning("journal: %s skipped: %s", what, e)
        return None
    return obj


def load_episodes(conn: sqlite3.Connection, where: str, args: tuple[Any, ...],
                  bad: Malformed) -> list[Episode]:
    rows = conn.execute(f"SELECT id, json FROM episodes WHERE {where} ORDER BY opened, id",
                        args).fetchall()
    split = has_transitions_table(conn)
    out = []
    for episode_id, text in rows:
        ep = _decoded(text, Episode, f"episode {episode_id}", bad)
        if ep is None:
            continue
        if split:
            rows_t = conn.execute("SELECT idx, json FROM transitions WHERE episode=? "
                                  "ORDER BY idx", (episode_id,)).fetchall()
            if rows_t:  # none: a version 1 row (inline transitions) or an episode without any
                ep.transitions = _transitions(episode_id, rows_t, bad)
        out.append(ep)
    return out


def _transitions(episode_id: str, rows: list[tuple[int, str]], bad: Malformed) -> list[Transition]:
    out = []
    for idx, text in rows:
        t = _decoded(text, Transition, f"transition {idx} of episode {episode_id}", bad)
        if t is None:
            continue
        out.append(t)
    return out


def open_episodes(conn: sqlite3.Connection, bad: Malformed) -> list[Episode]:
    return load_episodes(conn, "ended IS NULL AND json IS NOT NULL", (), bad)


def is_exported(conn: sqlite3.Connection, episode_id: str) -> bool:
    row = conn.execute("SELECT exported FROM episodes WHERE id=?", (episode_id,)).fetchone()
    return bool(row and row[0])


def exported_open(conn: sqlite3.Connection) -> set[str]:
    """Ids marked exported whose episode is still open (or only a stub row)."""
    return {row[0] for row in conn.execute(
        "SELECT id FROM episodes WHERE exported=1 AND ended IS NULL")}


# The sysfs reconciler's first events in a process: SourceStatus up (no reason; the fields
# after it, such as cause, left open), then the
# snapshot it read at start, after which that process counted every transition it saw.
_SYSFS_STARTED = '{"type":"SourceStatus","source":"sysfs","up":true,%"reason":""%}'
MAX_STATE_TRANSITIONS = 200_000  # transitions of the last process read at start, at most


def last_kernel_events(conn: sqlite3.Connection, bad: Malformed) -> list[Event]:
    """The kernel state the last process counted, as exporter/correlate/down_changes.py's
    state_at_stop reads it (ordering by kernel time): the snapshot that process read at its
    start and every Transition it journaled after that.

    Not the newest snapshot: a snapshot is read from sysfs, which can be ahead of what the
    process counted (a transition in sysfs whose event was still queued at a SIGKILL), and
    comparing that with sysfs at the next start would lose the change. Only that process's
    rows (journaled after its start marker): an earlier process's transitions are already in
    its start snapshot, and taking them by wall time would count them again after the clock
    stepped back between two starts. A journal with no start marker (written before it, or
    pruned), or with more than MAX_STATE_TRANSITIONS since the start, falls back to the newest
    snapshot journaled and the transitions journaled after the last start before it."""
    start = conn.execute("SELECT seq FROM events WHERE type='SourceStatus' AND json LIKE ? "
                         "ORDER BY seq DESC LIMIT 1", (_SYSFS_STARTED,)).fetchone()
    if start is not None:
        row = conn.execute("SELECT seq, json FROM events WHERE type='KernelSnapshot' AND "
                           "seq > ? ORDER BY seq LIMIT 1", (start[0],)).fetchone()
        events = _snapshot_and_after(conn, row, start[0], bad, MAX_STATE_TRANSITIONS)
        if events is not None:
            return events
    row = conn.execute("SELECT seq, json FROM events WHERE type='KernelSnapshot' "
                       "ORDER BY seq DESC LIMIT 1").fetchone()
    since = conn.execute("SELECT seq FROM events WHERE type='SourceStatus' AND json LIKE ? "
                         "AND seq < ? ORDER BY seq DESC LIMIT 1",
                         (_SYSFS_STARTED, row[0] if row else 0)).fetchone()
    return _snapshot_and_after(conn, row, since[0] if since else 0, bad, None) or []


def _snapshot_and_after(conn: sqlite3.Connection, row: tuple[int, str] | None, since: int,
                        bad: Malformed, most: int | None) -> list[Event] | None:
    """The snapshot in `row` and every Transition journaled after row `since` (the process's
    start) that ended at or after it; None when there is none, or more than `most` of
    them."""
    if row is None:
        return None
    try:
        snapshot = codec.loads(row[1])
    except codec.CodecError:
        bad.count += 1
        return None
    out: list[Event] = [snapshot]
    # events.time of a Transition is its end (schema.event_time); the index makes this a range.
    rows = conn.execute("SELECT json FROM events WHERE type='Transition' AND time >= ? "
                        "AND seq > ? ORDER BY seq" + ("" if most is None else
                                                      f" LIMIT {most + 1}"),
                        (snapshot.time, since)).fetchall()
    if most is not None and len(rows) > most:
        return None
    for (text,) in rows:
        try:
            out.append(codec.loads(text))
        except codec.CodecError:
            bad.count += 1
    return out


def _time_range(since: float | None, until: float | None) -> tuple[str, tuple[float, ...]]:
    where, args = [], []
    if since is not None:
        where.append("time >= ?")
        args.append(since)
    if until is not None:
        where.append("time <= ?")
        args.append(until)
    return ("WHERE " + " AND ".join(where) if where else ""), tuple(args)


class JournalReader:
    """A journal opened read-only; JournalError (the CLI exits 2) when there is none to read."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._bad = Malformed()
        if not self.path.exists():
            raise JournalError(f"no journal at {self.path} (is the exporter writing elsewhere? "
                               "pass --journal PATH)")
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                   isolation_level=None, check_same_thread=False, timeout=5)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("SELECT 1 FROM episodes LIMIT 1").fetchall()
        except sqlite3.Error as e:
            raise JournalError(f"cannot read the journal {self.path}: {e}") from None
        if version > SCHEMA_VERSION:
            conn.close()
            raise JournalError(f"{self.path} has journal schema {version}, newer than this "
                               f"exporter's {SCHEMA_VERSION}: read it with the exporter that "
                               "wrote it")
        self._conn: sqlite3.Connection | None = conn

    @property
    def malformed(self) -> int:
        """Rows that would not decode, skipped so far."""
        return self._bad.count

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise JournalError(f"the journal {self.path} is closed")
        return self._conn

    def _fail(self, e: sqlite3.Error) -> JournalError:
        return JournalError(f"cannot read the journal {self.path}: {e}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------ episodes

    def open_episodes(self) -> list[Episode]:
        try:
            return open_episodes(self._c(), self._bad)
        except sqlite3.Error as e:
            raise self._fail(e) from None

    def episodes(self, since: float | None = None, until: float | None = None) -> list[Episode]:
        """Episodes active at some time in [since, until] (open ones count as active now)."""
        where, args = ["json IS NOT NULL"], []
        if since is not None:
            where.append("(ended IS NULL OR ended >= ?)")
            args.append(since)
        if until is not None:
            where.append("opened <= ?")
            args.append(until)
        return self._episodes(" AND ".join(where), tuple(args))

    def episode(self, episode_id: str) -> Episode | None:
        """By id, or by a prefix of an id when exactly one episode has it."""
        found = self._episodes("id = ? AND json IS NOT NULL", (episode_id,))
        if not found:
            pattern = episode_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            found = self._episodes("id LIKE ? ESCAPE '\\' AND json IS NOT NULL",
                                   (pattern + "%",))
        return found[0] if len(found) == 1 else None

    def _episodes(self, where: str, args: tuple[Any, ...]) -> list[Episode]:
        try:
            return load_episodes(self._c(), where, args, self._bad)
        except sqlite3.Error as e:
            raise self._fail(e) from None

    def is_exported(self, episode_id: str) -> bool:
        try:
            return is_exported(self._c(), episode_id)
        except sqlite3.Error as e:
            raise self._fail(e) from None

    # ------------------------------------------------------------ events

    def last_kernel_events(self) -> list[Event]:
        try:
            return last_kernel_events(self._c(), self._bad)
        except sqlite3.Error as e:
            raise self._fail(e) from None

    def count_events(self, since: float | None = None, until: float | None = None) -> int:
        where, args = _time_range(since, until)
        try:
            return int(self._c().execute(f"SELECT count(*) FROM events {where}",
                                         args).fetchone()[0])
        except sqlite3.Error as e:
            raise self._fail(e) from None

    def events(self, since: float | None = None, until: float | None = None,
               batch: int = 1000) -> Iterator[Event]:
        for stored in self.stored_events(since, until, batch):
            yield stored.event

    def stored_events(self, since: float | None = None, until: float | None = None,
                      batch: int = 1000) -> Iterator[StoredEvent]:
        """Events in journal (arrival) order; read in batches so an export needs little memory."""
        where, args = _time_range(since, until)
        where = f"{where} AND seq > ?" if where else "WHERE seq > ?"
        last = 0
        while True:
            try:
                rows = self._c().execute(
                    f"SELECT seq, json FROM events {where} ORDER BY seq LIMIT ?",
                    (*args, last, batch)).fetchall()
            except sqlite3.Error as e:
                raise self._fail(e) from None
            for seq, text in rows:
                last = seq
                try:
                    yield StoredEvent(seq, codec.loads(text))
                except codec.CodecError as e:
                    self._bad.count += 1
                    log.warning("journal: event %d skipped: %s", seq, e)
            if len(rows) < batch:
                return
