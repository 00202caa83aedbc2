"""The journal sink: what the agent drives (on_event / on_update / close), off the path to
/metrics.

The agent's thread only hands objects over: `on_event` appends the event to a bounded queue,
`on_update` keeps the episode's latest copy (an episode row is overwritten by each update, so
only the newest matters). A writer thread takes everything pending and writes it in one
transaction, so a burst costs one commit, and a slow or failing disk delays only the journal,
never the correlator or a scrape. When the queue is full the event is dropped, counted in
`dropped` (shown, with write failures, as node_resize_exporter_sink_errors_total{sink="journal"})
and logged at most once a minute with the count.

An episode update appends what changed: the episode row without its transitions, plus one row
per transition that joined since the last write (schema version 2). The correlator may replace
a transition in place (a BPF record arriving after the uevent of the same transition): the
recent tail is compared by identity on every write, the whole list once when the kernel phase
ends. So a 4,096-block hot-unplug writes each transition about once, not 4,096 times.

The sink never takes the agent down: a read-only or full disk is logged once and counted, every
later batch is still attempted, so it recovers by itself when space comes back. A journal a
newer exporter wrote is left untouched and the sink reports itself down (`up` False with
`down_reason`, node_resize_exporter_sink_up{sink="journal"} 0): a rolled-back DaemonSet must not
crash-loop on its hostPath. What survives a SIGKILL is what the writer committed; the window
this leaves is in docs/reliability.md.

The hotplug counters are carried across restarts within one boot (counters.py): `carry` at
start reads this boot's row and writes the new start's, and from then on every transaction
holding transitions also rewrites the row with what the writer has counted of them (a
KernelLedger of its own, fed in the writer thread and with what a full queue drops,
deduplicating across sources the way the agent's does), so the row and the events it counts
commit together.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, TypeVar

from exporter import codec
from exporter.clock import Clock
from exporter.config.decide import default_journal_path
from exporter.correlate.ledger import KernelLedger
from exporter.correlate.model import Episode, EpisodeUpdate, Phase
from exporter.events import Event, PdbsRelisted, PdbStatus, Transition
from exporter.ratelog import RateLimitedLog
from exporter.sinks.journal import counters, reader
from exporter.sinks.journal.path import WRITABLE_FIX, cannot_create, check_journal
from exporter.sinks.journal.schema import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_BYTES,
    DEFAULT_PRUNE_EVERY,
    JournalNewer,
    JournalRefused,
    event_time,
)
from exporter.sinks.journal.store import JournalStore

# The cluster's PodDisruptionBudgets are cluster state, not this node's: they change with any
# pod's readiness anywhere, and only a plan asked now reads them (the API server judges an
# eviction by the budget it holds then), so no node's journal keeps them.
NOT_JOURNALED = (PdbStatus, PdbsRelisted)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Events waiting for the writer. ~1 KiB each at most: a bound of a few MiB, and at the agent's
# measured peak (~20k events/s in a flap storm) seconds of a stalled disk before anything drops.
DEFAULT_QUEUE = 50_000
# Rows per transaction: big enough that a burst is a few commits, small enough that one
# transaction does not hold the file (and the memory of its rows) for long.
BATCH = 2_000
# Transitions at the end of an episode's list re-compared on each write (replacements land near
# the end: the duplicate of a transition comes within the coalescing window).
RECHECK_TAIL = 64
DROP_LOG_SECONDS = 60.0
# At shutdown, how long the writer may take to empty the queue (a pod's default grace period is
# 30 s, and the sources and the trace sink flush too).
CLOSE_SECONDS = 10.0


@dataclasses.dataclass
class _Batch:
    """One write's rows, encoded before the transaction."""

    exported: list[str]  # episode ids whose trace went out
    events: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)
    episodes: list[tuple[object, ...]] = dataclasses.field(default_factory=list)
    transitions: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)
    # (episode, index): its stored transitions from there on go (the list got shorter)
    cuts: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    after: list[tuple[Episode, list[Transition]]] = dataclasses.field(default_factory=list)
    counters: tuple[str, str] | None = None  # (boot_id, row): this boot's carried counters

    @property
    def rows(self) -> int:
        return len(self.events) + len(self.episodes) + len(self.transitions) + \
            len(self.exported)

    @property
    def items(self) -> int:
        """What a failure loses."""
        return len(self.events) + len(self.episodes) + len(self.exported)

    @property
    def bytes(self) -> int:
        return sum(len(r[2]) for r in self.events) + \
            sum(len(str(r[6])) for r in self.episodes) + sum(len(r[2]) for r in self.transitions)

    def insert(self, c: sqlite3.Connection) -> None:
        c.executemany("INSERT INTO events(time, type, json) VALUES (?, ?, ?)", self.events)
        c.executemany(
            "INSERT INTO episodes(id, resource, change, opened, ended, outcome, json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "resource=excluded.resource, change=excluded.change, opened=excluded.opened, "
            "ended=excluded.ended, outcome=excluded.outcome, json=excluded.json", self.episodes)
        c.executemany("DELETE FROM transitions WHERE episode=? AND idx>=?", self.cuts)
        c.executemany("INSERT OR REPLACE INTO transitions(episode, idx, json) "
                      "VALUES (?, ?, ?)", self.transitions)
        # The trace sink may run before the journal sees the ENDED update: a stub row the
        # coming upsert fills in (it never touches `exported`).
        c.executemany("INSERT INTO episodes(id, exported) VALUES (?, 1) "
                      "ON CONFLICT(id) DO UPDATE SET exported=1",
                      [(i,) for i in self.exported])
        if self.counters is not None:
            c.execute("INSERT OR REPLACE INTO counters(boot_id, json) VALUES (?, ?)",
                      self.counters)


class JournalSink:
    """The journal as the agent's sink. Raises JournalRefused for an unsafe path, and, with
    `must_open` (the user named the path), for one that cannot be created or opened."""

    check = staticmethod(check_journal)  # `check`'s journal line (the journal's policy)
    name = "journal"  # the `sink` label of its errors (exporter/sinks/metrics.py)

    def __init__(self, path: str | os.PathLike[str] | None = None, *, clock: Clock | None = None,
                 max_age: float = DEFAULT_MAX_AGE, max_bytes: int = DEFAULT_MAX_BYTES,
                 prune_every: int = DEFAULT_PRUNE_EVERY, queue_size: int = DEFAULT_QUEUE,
                 must_open: bool = False, start: bool = True) -> None:
        self.path = Path(path) if path is not None else default_journal_path()
        self.queue_size = max(1, queue_size)
        self.prune_every = max(1, prune_every)
        self.failed = 0  # events/updates a write could not make (read-only or full disk, ...)
        self.dropped = 0  # events and updates refused because the queue was full
        self.malformed = 0  # objects that would not encode (skipped)
        self.up = True
        self.down_reason = ""
        self.written = 0  # rows committed (events, episode rows, transitions)
        self.bytes_written = 0  # their JSON, what the journal's growth is made of
        self._failing = False  # a write failure was logged; quiet until one succeeds
        self._since_prune = 0
        self._drop_log = RateLimitedLog(log, DROP_LOG_SECONDS)
        self._bad = reader.Malformed()
        # The counters carried across restarts (carry): this boot's id, and the transitions
        # committed so far (with what earlier processes of this boot committed) as the writer
        # counts them; None: not carried (no boot id, or the row could not be read).
        self._boot: str | None = None
        self._tally: KernelLedger | None = None
        self._down: dict[counters.DownKey, int] = {}
        self._recount = False  # the tally moved without a batch (a dropped transition)
        # The tally's own lock: the writer's batches and the agent's drops (rare), so the
        # agent's hand-over never waits for a batch being counted.
        self._tally_lock = threading.Lock()
        self.counters_refused = ""  # why this boot's row was refused (hostile or broken)
        self._cv = threading.Condition()
        self._events: deque[Event] = deque()
        self._episodes: dict[str, Episode] = {}
        self._exported: list[str] = []
        self._marked: set[str] = set()  # ids this process marked exported
        self._inflight = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._db = threading.Lock()  # the connection: the writer's batches, start-up reads
        # Per episode still open: the transitions written, as the very objects (identity says
        # whether one was replaced since).
        self._written: dict[str, list[Transition]] = {}
        self._full_checked: set[str] = set()
        self._store = JournalStore(self.path, clock=clock, max_age=max_age,
                                   max_bytes=max_bytes)  # JournalRefused: an unsafe path
        if must_open:
            problem = cannot_create(self.path)
            if problem:
                raise JournalRefused(f"--journal {self.path}: {problem}. Fix: {WRITABLE_FIX}")
        try:
            with self._db:
                conn = self._store.connect()
                self._store.prune()
                # Episodes the last process exported but left open (killed between the export
                # and the ENDED row): the only ones a trace sink here could ask about, so
                # is_exported never reads the disk on the agent's thread.
                self._marked |= reader.exported_open(conn)
        except JournalNewer as e:
            self._go_down(str(e))
        except OSError as e:  # the file itself cannot be made or opened
            if must_open:
                raise JournalRefused(f"--journal {self.path}: cannot open it ({e}). Fix: "
                                     f"{WRITABLE_FIX}") from None
            self._write_failed(e, 1)  # the default path: degrade, retry with every batch
        except sqlite3.Error as e:  # a corrupt file: counted, and `check` says what to do
            self._write_failed(e, 1)
        if start:
            self.start()

    # ------------------------------------------------------------ state

    @property
    def errors(self) -> int:
        """What node_resize_exporter_sink_errors_total{sink="journal"} shows: rows not
        written, whether the disk refused them or the queue was full."""
        return self.failed + self.dropped

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._events) + len(self._episodes) + len(self._exported)

    @property
    def pruned_events(self) -> int:
        return self._store.pruned_events

    @property
    def pruned_episodes(self) -> int:
        return self._store.pruned_episodes

    def _go_down(self, reason: str) -> None:
        self.up, self.down_reason = False, reason
        self._store.close()
        log.error("journal sink down, the file left untouched and the exporter running "
                  "without it: %s", reason)

    # ------------------------------------------------------------ the writer thread

    def start(self) -> None:
        """Start the writer thread. Separate from __init__ so the composition root starts it
        after dropping privileges (a thread keeps the capabilities it was made with)."""
        if self._thread is not None or not self.up:
            return
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._has_work() and not self._stopping:
                    self._cv.wait()
                if not self._has_work():
                    break
                batch = self._take()
            try:
                self._write_batch(*batch)
            except Exception:  # noqa: BLE001 - the writer must outlive any one batch
                log.exception("journal: batch not written")
            finally:
                with self._cv:
                    self._inflight = False
                    self._cv.notify_all()
        self._finish()

    def _has_work(self) -> bool:
        return bool(self._events or self._episodes or self._exported)

    def _take(self) -> tuple[list[Event], list[Episode], list[str]]:
        """Under the condition: what the next transaction writes."""
        n = min(len(self._events), BATCH)
        events = [self._events.popleft() for _ in range(n)]
        episodes = list(self._episodes.values())
        self._episodes = {}
        exported, self._exported = self._exported, []
        self._inflight = True
        return events, episodes, exported

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed over so far is written (or failed); True if it was.
        Without a writer thread (not started, or stopped), writes it in this thread."""
        if self._thread is None or not self._thread.is_alive():
            while True:
                with self._cv:
                    if not self._has_work():
                        return True
                    batch = self._take()
                try:
                    self._write_batch(*batch)
                finally:
                    with self._cv:
                        self._inflight = False
        with self._cv:
            return self._cv.wait_for(lambda: not self._has_work() and not self._inflight,
                                     timeout)

    # ------------------------------------------------------------ Sink

    def on_event(self, event: Event) -> None:
        if not self.up or isinstance(event, NOT_JOURNALED):
            return
        with self._cv:
            if len(self._events) >= self.queue_size:
                self._drop()
                if self._tally is not None and type(event) is Transition:
                    # Not journaled, but counted (the agent counts it): a row below what a
                    # scrape showed would be a counter reset at the next start.
                    with self._tally_lock:
                        self._tally.handle(event)
                        self._recount = True
                return
            self._events.append(event)
            self._cv.notify()

    def on_update(self, update: EpisodeUpdate) -> None:
        self.save_episode(update.episode)

    def save_episode(self, ep: Episode) -> None:
        """Write the episode's current state (its latest copy replaces any pending one)."""
        if not self.up:
            return
        with self._cv:
            if ep.id not in self._episodes and len(self._episodes) >= self.queue_size:
                self._drop()
                return
            self._episodes[ep.id] = ep
            self._cv.notify()

    def mark_exported(self, episode_id: str) -> None:
        """The trace sink exported this episode; survives a restart (exactly once)."""
        self._marked.add(episode_id)
        if not self.up:
            return
        with self._cv:
            self._exported.append(episode_id)
            self._cv.notify()

    def is_exported(self, episode_id: str) -> bool:
        """Marked by this process, or by the last one for an episode it left open. From
        memory: the trace sink asks on the agent's thread, which must not wait for the disk."""
        return episode_id in self._marked

    def close(self) -> None:
        """Write what is pending, apply retention, close (SIGTERM's flush). Waits at most
        CLOSE_SECONDS for a writer thread: on a disk that slow, what is still queued is left
        (the transaction in flight is atomic; the next start reads what was committed) rather
        than outliving the pod's grace period."""
        thread, self._thread = self._thread, None
        if thread is None:
            self.flush()  # no writer thread: everything handed over, written here
            self._finish()
            return
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        thread.join(CLOSE_SECONDS)
        if thread.is_alive():
            log.warning("journal %s: %d write(s) still pending after %.0f s at shutdown (the "
                        "disk is too slow); left unwritten", self.path, self.pending,
                        CLOSE_SECONDS)

    def _finish(self) -> None:
        """The writer's last act: retention, then close (SQLite checkpoints the WAL)."""
        if not self.up:
            return
        with self._db:
            try:
                if self._store.is_open:
                    self._store.prune()
            except (OSError, sqlite3.Error) as e:
                self._write_failed(e, 0)
            self._store.close()

    def _drop(self) -> None:
        """Under the condition: the queue is full. Counted; one log line a minute at most."""
        self.dropped += 1
        self._drop_log.note("queue full", "journal %s: write queue full (%d pending: the disk is "
                            "slow or stuck); 1 write(s) dropped, %d in all", self.path,
                            len(self._events), self.dropped, level=logging.WARNING)

    # ------------------------------------------------------------ start-up reads

    def open_episodes(self) -> list[Episode]:
        """The episodes the last process left open (resumed by the composition root)."""
        if not self.up:
            return []
        return list(self._read(lambda c: reader.open_episodes(c, self._bad), []))

    def last_kernel_events(self) -> list[Event]:
        """The kernel state the last process journaled (exporter/correlate/down_changes.py)."""
        if not self.up:
            return []
        return list(self._read(lambda c: reader.last_kernel_events(c, self._bad), []))

    def carry(self, boot_id: str | None,
              changes: Mapping[counters.DownKey, int]) -> counters.Carried:
        """What the hotplug counters start from: this boot's row (every earlier process's
        committed transitions and changes while down) plus `changes` (this start's, each a
        transition too); written back at once, before the first scrape can show it. Without a
        boot id, a journal that is down, or a row that cannot be read: `changes` alone (the
        counters start at 0, a reset Prometheus handles), and the row is left as it is. A row
        that is not one this code writes is refused whole (`counters_refused` says why) and
        replaced."""
        fresh = counters.Carried().plus_down(changes)
        if boot_id is None or not self.up:
            return fresh
        with self._db:
            try:
                row = self._store.connect().execute(
                    "SELECT json FROM counters WHERE boot_id=?", (boot_id,)).fetchone()
            except JournalNewer as e:
                self._go_down(str(e))
                return fresh
            except (OSError, sqlite3.Error) as e:
                log.warning("journal %s: the counters of this boot not read (%s); they start "
                            "at 0", self.path, e)
                return fresh
            base = counters.Carried()
            if row is not None:
                try:
                    base = counters.decode(row[0])
                except counters.BadRow as e:
                    self.counters_refused = str(e)
                    log.warning("journal %s: the counters row of this boot refused (%s); the "
                                "counters start at 0", self.path, e)
            carried = base.plus_down(changes)
            self._boot, self._tally = boot_id, KernelLedger()
            self._tally.transitions = dict(carried.transitions)
            self._down = dict(carried.down_changes)
            text = counters.encode(carried.transitions, carried.down_changes)
            try:
                self._store.transaction(lambda c: (
                    c.execute("DELETE FROM counters WHERE boot_id != ?", (boot_id,)),
                    c.execute("INSERT OR REPLACE INTO counters(boot_id, json) VALUES (?, ?)",
                              (boot_id, text))))
            except JournalNewer as e:
                self._go_down(str(e))
            except (OSError, sqlite3.Error) as e:  # the next batch that commits writes it
                self._write_failed(e, 1)
        return carried

    def _read(self, fn: Callable[[sqlite3.Connection], list[T]], default: list[T]) -> list[T]:
        with self._db:
            try:
                return fn(self._store.connect())
            except JournalNewer as e:
                self._go_down(str(e))
            except (OSError, sqlite3.Error) as e:
                log.debug("journal %s: read failed: %s", self.path, e)
            return default

    # ------------------------------------------------------------ writing a batch

    def _write_batch(self, events: list[Event], episodes: list[Episode],
                     exported: list[str]) -> None:
        batch = self._encode(events, episodes, exported)
        if not batch.rows:
            return
        with self._db:
            if not self.up or not self._commit(batch):
                return
        if self._failing:
            self._failing = False
            log.warning("journal %s: writes succeed again after %d failures", self.path,
                        self.failed)
        for ep, written in batch.after:  # only once committed: a failed batch is rewritten whole
            if ep.ended is not None:
                self._written.pop(ep.id, None)
                self._full_checked.discard(ep.id)
            else:
                self._written[ep.id] = written

    def _encode(self, events: list[Event], episodes: list[Episode],
                exported: list[str]) -> _Batch:
        """The batch's rows; what does not encode is counted malformed and left out."""
        batch = _Batch(exported=exported)
        with self._tally_lock:
            counted, self._recount = self._recount, False
            if self._tally is not None:
                for event in events:
                    if type(event) is Transition:
                        # Counted even if this batch then fails: the agent counted it, and a
                        # row below what a scrape showed would be a counter reset at the next
                        # start.
                        self._tally.handle(event)
                        counted = True
            if counted and self._boot is not None and self._tally is not None:
                batch.counters = (self._boot,
                                  counters.encode(self._tally.transitions, self._down))
        for event in events:
            try:
                batch.events.append((event_time(event), type(event).__name__,
                                     codec.dumps(event)))
            except codec.CodecError as e:
                self.malformed += 1
                log.debug("journal: event not stored: %s", e)
        for ep in episodes:
            try:
                row, transitions, cut, written = self._episode_rows(ep)
            except codec.CodecError as e:
                self.malformed += 1
                log.debug("journal: episode %s not stored: %s", ep.id, e)
                continue
            batch.episodes.append(row)
            batch.transitions += transitions
            if cut is not None:
                batch.cuts.append(cut)
            batch.after.append((ep, written))
        return batch

    def _commit(self, batch: _Batch) -> bool:
        """One transaction (under the lock), then the counters and a prune when one is due;
        False when it failed (the sink went down, or the failure is counted)."""
        try:
            self._store.transaction(batch.insert)
        except JournalNewer as e:
            self._go_down(str(e))
            return False
        except (OSError, sqlite3.Error) as e:
            self._write_failed(e, batch.items)
            return False
        self.written += batch.rows
        self.bytes_written += batch.bytes
        self._since_prune += batch.rows
        if self._since_prune >= self.prune_every:
            self._since_prune = 0
            try:
                self._store.prune()
            except (OSError, sqlite3.Error) as e:
                self._write_failed(e, 0)
        return True

    def _episode_rows(self, ep: Episode) -> tuple[
            tuple[object, ...], list[tuple[str, int, str]], tuple[str, int] | None,
            list[Transition]]:
        """The episode row (without its transitions), the transition rows that changed since
        the last write, a cut when the list got shorter, and the list now written."""
        bare = dataclasses.replace(ep, transitions=[])
        row = (ep.id, ep.resource.value, ep.change.value, ep.opened, ep.ended,
               ep.outcome.value if ep.outcome else None, codec.dumps(bare))
        now = ep.transitions
        before = self._written.get(ep.id)
        changed: list[int]
        if before is None:  # first sight in this process (new, or resumed): all of it
            changed = list(range(len(now)))
        else:
            full = ep.phase is not Phase.KERNEL and ep.id not in self._full_checked
            if full:
                self._full_checked.add(ep.id)
            first = 0 if full else max(0, len(before) - RECHECK_TAIL)
            common = min(len(before), len(now))
            changed = [i for i in range(first, common) if now[i] is not before[i]]
            changed += range(common, len(now))
        rows = [(ep.id, i, codec.dumps(now[i])) for i in changed]
        cut = (ep.id, len(now)) if before is None or len(now) < len(before) else None
        # `now` is the update's own list (copy_episode gives every update a fresh one that
        # nobody changes afterwards): kept as it is, not copied again.
        return row, rows, cut, now

    def _write_failed(self, e: BaseException, rows: int) -> None:
        self.failed += rows
        if not self._failing:
            self._failing = True
            log.warning("journal %s: write failed (%s); counting further failures quietly and "
                        "retrying every write", self.path, e)
        else:
            log.debug("journal %s: write failed again: %s", self.path, e)
