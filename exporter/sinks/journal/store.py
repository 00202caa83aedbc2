"""The journal's SQLite file, opened for writing: its safety, its schema version, its pragmas,
its retention.

What goes into it and when is the sink's business (sink.py); reading it for a postmortem is
the reader's (reader.py). This module only makes sure the file is the right file (never through
a link, 0600, path.py), at a schema this code understands (a journal of an older version is
migrated forward, a newer one is left untouched: JournalNewer), tuned (WAL, synchronous=NORMAL:
each committed transaction survives a process crash; only a power cut can lose the last few),
and bounded in age and size.

Not thread-safe by itself: the sink's writer thread owns it, other callers go through the
sink's lock.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from exporter.clock import Clock
from exporter.sinks.journal.path import JournalPathError, check_journal_path, open_private
from exporter.sinks.journal.schema import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_BYTES,
    SCHEMA,
    SCHEMA_VERSION,
    JournalRefused,
    T,
    refuse_newer_schema,
)

log = logging.getLogger(__name__)


class JournalStore:
    """The SQLite file. `connect()` opens (creating and migrating) it; every error is raised:
    the caller decides whether it is fatal (start-up with a named path) or counted."""

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock | None = None,
                 max_age: float = DEFAULT_MAX_AGE, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = Path(path)
        self.clock = clock
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.pruned_events = 0
        self.pruned_episodes = 0
        self._conn: sqlite3.Connection | None = None
        try:
            check_journal_path(self.path)
        except JournalPathError as e:
            raise JournalRefused(str(e)) from None

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else time.time()

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def connect(self) -> sqlite3.Connection:
        """The open connection, opening the file first if need be. Raises OSError,
        sqlite3.Error or JournalNewer (schema newer than ours: nothing was changed)."""
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
            refuse_newer_schema(conn, self.path)  # before any pragma changes the file
            # auto_vacuum only takes effect before the first table exists: set it first, so
            # pruning can give pages back to the file system (incremental_vacuum).
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # A small bound must hold for the WAL too: checkpoint it well before it grows.
            pages = max(16, min(1000, self.max_bytes // 4096 // 8))
            conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
            conn.execute(f"PRAGMA journal_size_limit={min(self.max_bytes, 4 * 2**20)}")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Bring a new, version 1 or current file to SCHEMA_VERSION in one transaction. Every
        step so far only adds tables (CREATE ... IF NOT EXISTS), so SCHEMA is the migration;
        a step that must rewrite rows goes here, keyed by the version it starts from."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            conn.executescript(SCHEMA)  # idempotent; repairs a dropped index
            return
        try:  # one script, one transaction: a crash half-way leaves the old version whole
            conn.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\n"
                               f"PRAGMA user_version={SCHEMA_VERSION};\nCOMMIT;")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if version:
            log.info("journal: migrated schema %d -> %d", version, SCHEMA_VERSION)

    def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one write transaction (a batch costs one commit); rolled back and
        re-raised on any error."""
        conn = self.connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise
        return result

    def size_bytes(self) -> int:
        """Bytes the database's live pages take (what retention bounds)."""
        c = self.connect()
        pages = int(c.execute("PRAGMA page_count").fetchone()[0])
        free = int(c.execute("PRAGMA freelist_count").fetchone()[0])
        return (pages - free) * int(c.execute("PRAGMA page_size").fetchone()[0])

    def prune(self) -> tuple[int, int]:
        """Apply retention (by age, then by size); returns (events, episodes) removed."""
        conn = self.connect()
        n_ev, n_ep = self.transaction(self._prune)
        if n_ev or n_ep:
            self.pruned_events += n_ev
            self.pruned_episodes += n_ep
            conn.execute("PRAGMA incremental_vacuum")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            log.info("journal %s: retention removed %d events and %d episodes",
                     self.path, n_ev, n_ep)
        return n_ev, n_ep

    def _prune(self, conn: sqlite3.Connection) -> tuple[int, int]:
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
        return n_ev, n_ep

    def checkpoint(self) -> None:
        if self._conn is not None:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        self._conn = None

    def drop_connection(self) -> None:
        """Forget a connection a failure left in doubt; the next connect() opens afresh."""
        self.close()


__all__ = ["JournalStore", "SCHEMA_VERSION"]
