"""The journal: raw events and every episode in a local SQLite file, for postmortems and resume.

Written before an event is acted on (the agent calls `on_event` before the correlator), so a
SIGKILL loses nothing: WAL with synchronous=NORMAL makes each committed row survive a process
crash (only a power cut can lose the last few, which is the usual trade for not fsyncing each
event). On start the agent resumes `open_episodes()`; `mark_exported` / `is_exported` make a
resumed episode's trace go out exactly once.

The journal must never take the agent down: a read-only or full disk is logged once, counted in
`errors` (a metric later) and every later write is still attempted, so it recovers by itself
when space comes back.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from exporter import codec
from exporter.clock import Clock
from exporter.correlate.model import Episode, EpisodeUpdate
from exporter.events import Event
from exporter.sinks.journal.path import JournalPathError, check_journal_path, open_private
from exporter.sinks.journal.schema import (  # noqa: F401 - re-exported for callers
    APP_DIR,
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_BYTES,
    DEFAULT_PRUNE_EVERY,
    SCHEMA,
    SCHEMA_VERSION,
    JournalError,
    JournalRefused,
    StoredEvent,
    T,
    _refuse_newer_schema,
    default_journal_path,
    event_time,
)

log = logging.getLogger("exporter.sinks.journal.store")



class Journal:
    """The SQLite journal; also a Sink (on_event / on_update / close)."""

    def __init__(self, path: str | os.PathLike | None = None, *, clock: Clock | None = None,
                 max_age: float = DEFAULT_MAX_AGE, max_bytes: int = DEFAULT_MAX_BYTES,
                 prune_every: int = DEFAULT_PRUNE_EVERY, readonly: bool = False) -> None:
        self.path = Path(path) if path is not None else default_journal_path()
        self.clock = clock
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.prune_every = max(1, prune_every)
        self.readonly = readonly
        self.errors = 0  # failed writes (read-only or full disk, corrupt file, ...)
        self.malformed = 0  # rows that would not decode (skipped)
        self.pruned_events = 0
        self.pruned_episodes = 0
        self._failing = False  # a write failure was logged; stay quiet until one succeeds
        self._writes = 0
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._started = False  # JournalRefused raises out of __init__, later it is counted
        if readonly:
            self._conn = self._connect_readonly()
        else:
            try:
                check_journal_path(self.path)
            except JournalPathError as e:
                raise JournalRefused(str(e)) from None
            self._write(lambda conn: None)  # opening: logged and counted if it fails, retried
            self._write(self._prune)
        self._started = True

    @classmethod
    def open_existing(cls, path: str | os.PathLike | None = None) -> "Journal":
        """A read-only view for the CLI; JournalError if there is no readable journal there."""
        return cls(path, readonly=True)

    # ------------------------------------------------------------ connection

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else time.time()

    def _connect_readonly(self) -> sqlite3.Connection:
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
            raise JournalError(f"{self.path} has journal schema {version}, newer than this "
                               f"exporter's {SCHEMA_VERSION}")
        return conn

    def _ensure_open(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        directory = self.path.parent
        if not directory.exists():
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        # Create the file 0600 ourselves: SQLite gives -wal and -shm the main file's mode.
        # Never through a link, never a FIFO (exporter/sinks/journal/path.py).
        fd = open_private(self.path)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        for suffix in ("-wal", "-shm"):
            side = Path(f"{self.path}{suffix}")
            if side.exists() and not side.is_symlink():
                os.chmod(side, 0o600)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=5)
        try:
            _refuse_newer_schema(conn, self.path)  # before any pragma changes the file
            # auto_vacuum only takes effect before the first table exists: set it first, so
            # pruning can give pages back to the file system (incremental_vacuum).
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # A small bound must hold for the WAL too: checkpoint it well before it grows.
            pages = max(16, min(1000, self.max_bytes // 4096 // 8))
            conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
            conn.execute(f"PRAGMA journal_size_limit={min(self.max_bytes, 4 * 2**20)}")
            conn.executescript(SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T | None:
        """Run one write; failures are logged once, counted, and never raised into the agent."""
        with self._lock:
            try:
                conn = self._ensure_open()
                result = fn(conn)
            except (sqlite3.Error, OSError, JournalRefused) as e:
                if isinstance(e, JournalRefused) and not self._started:
                    raise  # at start-up: `run` exits 2 with the reason
                self.errors += 1
                if self._conn is not None and self._conn.in_transaction:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if not self._failing:
                    self._failing = True
                    log.warning("journal %s: write failed (%s); counting further failures "
                                "quietly and retrying every write", self.path, e)
                else:
                    log.debug("journal %s: write failed again: %s", self.path, e)
                return None
            if self._failing:
                self._failing = False
                log.warning("journal %s: writes succeed again after %d failures",
                            self.path, self.errors)
            return result

    def _read(self, fn: Callable[[sqlite3.Connection], T], default: T) -> T:
        with self._lock:
            try:
                conn = self._conn if self.readonly else self._ensure_open()
                if conn is None:
                    return default
                return fn(conn)
            except (sqlite3.Error, OSError) as e:
                if self.readonly:
                    raise JournalError(f"cannot read the journal {self.path}: {e}") from None
                log.debug("journal %s: read failed: %s", self.path, e)
                return default

    # ------------------------------------------------------------ Sink

    def on_event(self, event: Event) -> None:
        try:
            text = codec.dumps(event)
        except codec.CodecError as e:
            self.malformed += 1
            log.debug("journal: event not stored: %s", e)
            return
        row = (event_time(event), type(event).__name__, text)
        self._write(lambda c: c.execute(
            "INSERT INTO events(time, type, json) VALUES (?, ?, ?)", row))
        self._count_write()

    def on_update(self, update: EpisodeUpdate) -> None:
        self.save_episode(update.episode)

    def close(self) -> None:
        with self._lock:
            if self._conn is None:
                return
            if not self.readonly:
                self._write(self._prune)
                self._write(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    # ------------------------------------------------------------ episodes

    def save_episode(self, ep: Episode) -> None:
        try:
            text = codec.dumps(ep)
        except codec.CodecError as e:
            self.malformed += 1
            log.debug("journal: episode %s not stored: %s", ep.id, e)
            return
        row = (ep.id, ep.resource.value, ep.change.value, ep.opened, ep.ended,
               ep.outcome.value if ep.outcome else None, text)
        self._write(lambda c: c.execute(
            "INSERT INTO episodes(id, resource, change, opened, ended, outcome, json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "resource=excluded.resource, change=excluded.change, opened=excluded.opened, "
            "ended=excluded.ended, outcome=excluded.outcome, json=excluded.json", row))
        self._count_write()

    def mark_exported(self, episode_id: str) -> None:
        # The trace sink may run before the journal sees the ENDED update: insert a stub row
        # that the coming upsert fills in (it never touches `exported`).
        self._write(lambda c: c.execute(
            "INSERT INTO episodes(id, exported) VALUES (?, 1) "
            "ON CONFLICT(id) DO UPDATE SET exported=1", (episode_id,)))

    def is_exported(self, episode_id: str) -> bool:
        row = self._read(lambda c: c.execute(
            "SELECT exported FROM episodes WHERE id=?", (episode_id,)).fetchone(), None)
        return bool(row and row[0])

    def last_kernel_events(self) -> list[Event]:
        """The last KernelSnapshot and the Transitions journaled after it, in order: the kernel
        state the last process knew (exporter/correlate/down_changes.py)."""
        def query(c: sqlite3.Connection) -> list:
            # Newest first along the primary key: stops at the first snapshot, no full scan.
            row = c.execute("SELECT seq FROM events WHERE type='KernelSnapshot' "
                            "ORDER BY seq DESC LIMIT 1").fetchone()
            if row is None:
                return []
            return c.execute("SELECT json FROM events WHERE seq >= ? AND type IN "
                             "('KernelSnapshot', 'Transition') ORDER BY seq",
                             (row[0],)).fetchall()
        out = []
        rows: list[Any] = self._read(query, [])
        for (text,) in rows:
            try:
                out.append(codec.loads(text))
            except codec.CodecError:
                self.malformed += 1
        return out

    def open_episodes(self) -> list[Episode]:
        return self._episodes("ended IS NULL AND json IS NOT NULL", ())

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

    def _episodes(self, where: str, args: tuple) -> list[Episode]:
        rows: list[Any] = self._read(lambda c: c.execute(
            f"SELECT id, json FROM episodes WHERE {where} ORDER BY opened, id", args).fetchall(),
            [])
        out = []
        for episode_id, text in rows:
            try:
                ep = codec.loads(text)
                if not isinstance(ep, Episode):
                    raise codec.CodecError(f"holds a {type(ep).__name__}")
            except codec.CodecError as e:
                self.malformed += 1
                log.warning("journal: episode %s skipped: %s", episode_id, e)
                continue
            out.append(ep)
        return out

    # ------------------------------------------------------------ events

    def count_events(self, since: float | None = None, until: float | None = None) -> int:
        where, args = self._time_range(since, until)
        return self._read(lambda c: c.execute(
            f"SELECT count(*) FROM events {where}", args).fetchone()[0], 0)

    def events(self, since: float | None = None, until: float | None = None,
               batch: int = 1000) -> Iterator[Event]:
        for stored in self.stored_events(since, until, batch):
            yield stored.event

    def stored_events(self, since: float | None = None, until: float | None = None,
                      batch: int = 1000) -> Iterator[StoredEvent]:
        """Events in journal (arrival) order; read in batches so an export needs little memory."""
        where, args = self._time_range(since, until)
        where = f"{where} AND seq > ?" if where else "WHERE seq > ?"
        last = 0
        while True:
            rows: list[Any] = self._read(lambda c: c.execute(
                f"SELECT seq, json FROM events {where} ORDER BY seq LIMIT ?",
                (*args, last, batch)).fetchall(), [])
            for seq, text in rows:
                last = seq
                try:
                    yield StoredEvent(seq, codec.loads(text))
                except codec.CodecError as e:
                    self.malformed += 1
                    log.warning("journal: event %d skipped: %s", seq, e)
            if len(rows) < batch:
                return

    @staticmethod
    def _time_range(since: float | None, until: float | None) -> tuple[str, tuple]:
        where, args = [], []
        if since is not None:
            where.append("time >= ?")
            args.append(since)
        if until is not None:
            where.append("time <= ?")
            args.append(until)
        return ("WHERE " + " AND ".join(where) if where else ""), tuple(args)

    # ------------------------------------------------------------ retention

    def size_bytes(self) -> int:
        """Bytes the database's live pages take (what retention bounds)."""
        def used(c: sqlite3.Connection) -> int:
            pages = c.execute("PRAGMA page_count").fetchone()[0]
            free = c.execute("PRAGMA freelist_count").fetchone()[0]
            return (pages - free) * c.execute("PRAGMA page_size").fetchone()[0]
        return self._read(used, 0)

    def prune(self) -> None:
        """Apply retention now (also runs at start, every `prune_every` writes and on close)."""
        self._write(self._prune)

    def _count_write(self) -> None:
        self._writes += 1
        if self._writes % self.prune_every == 0:
            self._write(self._prune)

    def _prune(self, conn: sqlite3.Connection) -> None:
        cutoff = self._now() - self.max_age
        n_ev = conn.execute("DELETE FROM events WHERE time < ?", (cutoff,)).rowcount
        n_ep = conn.execute("DELETE FROM episodes WHERE ended IS NOT NULL AND ended < ?",
                            (cutoff,)).rowcount
        # Size: oldest events go first (episodes hold the summary a postmortem needs most),
        # then the oldest ended episodes; open episodes are never dropped (resume needs them).
        # Aim below the bound so the next few hundred writes do not trigger another prune.
        target = int(self.max_bytes * 0.8)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        for table, order, cond in (("events", "seq", ""),
                                   ("episodes", "ended", "WHERE ended IS NOT NULL")):
            while True:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                used = (pages - free) * page_size
                if used <= target:
                    break
                count = conn.execute(f"SELECT count(*) FROM {table} {cond}").fetchone()[0]
                if count == 0:
                    break
                share = min(1.0, (used - target) / max(used, 1) + 0.05)
                victims = max(1, int(count * share))
                key = "seq" if table == "events" else "id"
                deleted = conn.execute(
                    f"DELETE FROM {table} WHERE {key} IN "
                    f"(SELECT {key} FROM {table} {cond} ORDER BY {order} LIMIT ?)",
                    (victims,)).rowcount
                if table == "events":
                    n_ev += deleted
                else:
                    n_ep += deleted
        if n_ev or n_ep:
            self.pruned_events += n_ev
            self.pruned_episodes += n_ep
            conn.execute("PRAGMA incremental_vacuum")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            log.info("journal %s: retention removed %d events and %d episodes",
                     self.path, n_ev, n_ep)
