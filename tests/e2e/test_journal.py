"""The SQLite journal: WAL, 0600, resume, exported flag, retention, read-only and full disks,
schema migration and rollback, the write queue, O(1) episode writes."""
from __future__ import annotations

import logging
import os
import sqlite3
import stat
import subprocess
from dataclasses import replace

import pytest

from exporter.clock import FakeClock
from exporter.config.decide import default_journal_path
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.events import EventsLost, MalformedInput
from exporter.sinks.journal.reader import JournalReader
from exporter.sinks.journal.schema import JournalError
from exporter.sinks.journal.sink import JournalSink
from testkit.postmortem_samples import (
    T0,
    cpu_offline_episode,
    cpu_online_open_episode,
    memory_failed_episode,
)

DAY = 86400.0


def lost(t: float, n: int = 1) -> EventsLost:
    return EventsLost(source="bpf", count=n, time=t)


def test_wal_mode_and_private_files(tmp_path):
    path = tmp_path / "state" / "nre" / "journal.db"
    old = os.umask(0o022)  # a permissive umask must not leak into the journal's modes
    try:
        j = JournalSink(path, clock=FakeClock(T0))
        j.on_event(lost(T0))
        assert j.flush(10)
        assert (tmp_path / "state" / "nre").stat().st_mode & 0o777 == 0o700
        for name in ("journal.db", "journal.db-wal", "journal.db-shm"):
            mode = stat.S_IMODE((path.parent / name).stat().st_mode)
            assert mode == 0o600, f"{name} has mode {oct(mode)}"
        with sqlite3.connect(path) as c:
            assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        j.close()
    finally:
        os.umask(old)
    assert j.errors == 0


def test_default_path_for_root_and_users(monkeypatch, tmp_path):
    if os.geteuid() == 0:
        assert str(default_journal_path()) == "/var/lib/node-resize-exporter/journal.db"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_journal_path() == tmp_path / "xdg" / "node-resize-exporter" / "journal.db"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_journal_path() == (tmp_path / "home" / ".local" / "state" /
                                      "node-resize-exporter" / "journal.db")


def test_events_and_episodes_survive_reopen_and_resume(tmp_path):
    path = tmp_path / "j.db"
    j = JournalSink(path, clock=FakeClock(T0))
    events = [lost(T0 + i, i) for i in range(5)] + [
        MalformedInput(source="uevent", detail="bad line", time=T0 + 9)]
    for e in events:
        j.on_event(e)
    done, failed, open_ = cpu_offline_episode(), memory_failed_episode(), cpu_online_open_episode()
    # The same episode written at several stages: the last state wins.
    early = replace(done, phase=cpu_online_open_episode().phase, outcome=None, ended=None)
    for ep in (early, done, failed, open_):
        j.on_update(EpisodeUpdate(kind=UpdateKind.TRANSITION, episode=ep, time=ep.opened))
    # No close(): a SIGKILL'd agent never gets to close. What the writer committed must be there.
    assert j.flush(10)
    j2 = JournalReader(path)
    assert list(j2.events()) == events
    assert list(j2.events(since=T0 + 2, until=T0 + 4)) == events[2:5]
    assert j2.count_events(since=T0 + 2) == 4
    assert j2.episodes() == [done, failed, open_]
    assert [e.id for e in j2.episodes(since=T0 + 50)] == [failed.id, open_.id]
    assert j2.episode(done.id) == done
    assert j2.episode("memory-") == failed  # a unique prefix is enough
    assert j2.episode("cpu-") is None  # ambiguous
    assert j2.episode("nope") is None
    j2.close()
    j3 = JournalSink(path, clock=FakeClock(T0 + 300))
    assert j3.open_episodes() == [open_]
    j3.close()
    j.close()


def test_exported_flag_survives_restart_and_either_sink_order(tmp_path):
    path = tmp_path / "j.db"
    j = JournalSink(path, clock=FakeClock(T0))
    ep = cpu_offline_episode()
    assert not j.is_exported(ep.id)
    j.mark_exported(ep.id)  # trace sink ran first: the episode row does not exist yet
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=ep, time=ep.ended))
    other = memory_failed_episode()
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=other, time=other.ended))
    # Exported, then killed before its ENDED row was written: still open in the journal.
    open_ = cpu_online_open_episode()
    j.save_episode(open_)
    j.mark_exported(open_.id)
    j.close()
    r = JournalReader(path)
    assert r.is_exported(ep.id) and not r.is_exported(other.id)
    assert r.episode(ep.id) == ep
    r.close()
    j = JournalSink(path, clock=FakeClock(T0))
    assert j.open_episodes() == [open_]
    assert j.is_exported(open_.id)  # a resumed episode is not traced a second time
    assert not j.is_exported(other.id)
    j.mark_exported(other.id)
    assert j.is_exported(other.id)
    j.close()
    r = JournalReader(path)
    assert r.is_exported(other.id)
    r.close()


def test_retention_by_age_keeps_open_episodes(tmp_path):
    path = tmp_path / "j.db"
    clock = FakeClock(T0)
    j = JournalSink(path, clock=clock, max_age=30 * DAY)
    for i in range(10):
        j.on_event(lost(T0 + i * DAY))
    old_done = cpu_offline_episode(T0, "old-done")
    old_open = cpu_online_open_episode(T0 + 1, "old-open")
    recent = memory_failed_episode(T0 + 35 * DAY, "recent")
    for ep in (old_done, old_open, recent):
        j.save_episode(ep)
    j.close()
    clock.t = T0 + 35 * DAY  # 30-day cutoff = T0 + 5 days; retention runs at start
    j = JournalSink(path, clock=clock, max_age=30 * DAY)
    assert j.pruned_events == 5 and j.pruned_episodes == 1
    j.close()
    r = JournalReader(path)
    assert [e.time for e in r.events()] == [T0 + i * DAY for i in range(5, 10)]
    assert [e.id for e in r.episodes()] == ["old-open", "recent"]
    with sqlite3.connect(path) as c:  # the pruned episode's transitions went with it
        assert {row[0] for row in c.execute("SELECT episode FROM transitions")} == \
            {"old-open", "recent"}
    r.close()


def test_retention_by_size_keeps_database_under_bound(tmp_path):
    path = tmp_path / "j.db"
    bound = 256 * 1024
    clock = FakeClock(T0)
    j = JournalSink(path, clock=clock, max_bytes=bound, prune_every=200)
    j.save_episode(cpu_online_open_episode())
    peak = 0
    n = 6000  # ~0.5 MB of rows written against a 256 KiB bound
    for i in range(n):
        j.on_event(MalformedInput(source="uevent", detail=f"line {i} " + "x" * 40, time=T0 + i))
        if (i + 1) % 200 == 0:  # just after a prune
            assert j.flush(10)
            peak = max(peak, j._store.size_bytes())
    j.close()
    assert j.errors == 0
    assert peak <= bound
    assert path.stat().st_size <= bound  # the file itself shrank (incremental vacuum)
    j = JournalReader(path)
    times = [e.time for e in j.events()]
    assert 0 < len(times) < n
    assert times[-1] == T0 + n - 1  # newest kept, oldest gone
    assert times == sorted(times) and times[0] > T0
    assert [e.id for e in j.open_episodes()] == ["cpu-increase-1"]
    j.close()


def test_open_existing_refuses_missing_or_foreign_files(tmp_path):
    with pytest.raises(JournalError, match="no journal at"):
        JournalReader(tmp_path / "missing.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(JournalError, match="cannot read the journal"):
        JournalReader(junk)


def test_malformed_rows_are_counted_and_skipped(tmp_path):
    path = tmp_path / "j.db"
    j = JournalSink(path, clock=FakeClock(T0))
    j.on_event(lost(T0))
    j.save_episode(cpu_offline_episode())
    assert j.flush(10)
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO events(time, type, json) VALUES (?, 'X', '{\"type\": \"X\"}')",
                  (T0 + 1,))
        c.execute("INSERT INTO episodes(id, json) VALUES ('bad', '{oops')")
    j.on_event(lost(T0 + 2))
    j.close()
    r = JournalReader(path)
    assert [e.time for e in r.events()] == [T0, T0 + 2]
    assert [e.id for e in r.episodes()] == ["cpu-decrease-1"]
    assert r.malformed == 2
    r.close()


@pytest.fixture
def tiny_mount(tmp_path):
    """A real small tmpfs, unmounted afterwards whatever happens."""
    mounts = []

    def mount(name: str, options: str):
        target = tmp_path / name
        target.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "nre-test", str(target)],
                       check=True)
        mounts.append(target)
        return target

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], check=False)


def test_read_only_disk_is_logged_once_counted_and_retried(tiny_mount, caplog):
    ro = tiny_mount("ro", "ro,size=1m,mode=0755")
    caplog.set_level(logging.DEBUG, logger="exporter.sinks.journal")
    j = JournalSink(ro / "nre" / "journal.db", clock=FakeClock(T0))  # must not raise
    start = j.errors
    assert start >= 1
    for i in range(5):
        j.on_event(lost(T0 + i))
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=cpu_offline_episode(), time=T0))
    assert j.flush(10)
    assert j.errors == start + 6  # every write was attempted and counted
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "write failed" in warnings[0].getMessage()
    assert j.open_episodes() == [] and not j.is_exported("x")
    j.close()


def test_full_disk_is_logged_once_counted_and_recovers(tiny_mount, caplog):
    disk = tiny_mount("full", "size=512k,mode=0700")
    caplog.set_level(logging.DEBUG, logger="exporter.sinks.journal")
    j = JournalSink(disk / "journal.db", clock=FakeClock(T0), prune_every=10**9)
    j.on_event(lost(T0))
    assert j.flush(10)
    assert j.errors == 0
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # fill the rest of the disk
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    stored_before = j.written
    i = 0
    while j.errors < 20 and i < 20000:  # the WAL may take a few writes into its last pages
        i += 1
        j.on_event(MalformedInput(source="uevent", detail="y" * 500, time=T0 + i))
        assert j.flush(10)  # one event a batch: each failure counts one
    assert j.errors == 20
    errors_at_full = j.errors
    j.on_event(lost(T0 + 10**6))
    assert j.flush(10)
    assert j.errors == errors_at_full + 1  # still attempted, still counted
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "write failed" in warnings[0].getMessage()
    filler.unlink()  # space comes back: the journal writes again without a restart
    j.on_event(lost(T0 + 2 * 10**6, 7))
    assert j.flush(10)
    assert j.errors == errors_at_full + 1
    assert "writes succeed again" in caplog.records[-1].getMessage()
    j.close()
    r = JournalReader(disk / "journal.db")
    events = list(r.events())
    assert events[-1] == lost(T0 + 2 * 10**6, 7)
    assert len(events) >= stored_before + 1
    r.close()


# ------------------------------------------------------------ The journal's path


def test_a_symlink_journal_is_refused_and_its_target_untouched(tmp_path):
    from exporter.sinks.journal.schema import JournalRefused
    target = tmp_path / "passwd-like"
    target.write_text("root:x:0:0\n")
    target.chmod(0o644)
    link = tmp_path / "journal.db"
    link.symlink_to(target)
    with pytest.raises(JournalRefused, match="symbolic link"):
        JournalSink(link, clock=FakeClock(T0))
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "root:x:0:0\n"
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "not-there")
    with pytest.raises(JournalRefused, match="symbolic link"):
        JournalSink(dangling, clock=FakeClock(T0))
    assert not (tmp_path / "not-there").exists()
    (tmp_path / "wal-link.db-wal").symlink_to(target)  # a planted -wal link counts too
    with pytest.raises(JournalRefused, match="wal-link.db-wal is a symbolic link"):
        JournalSink(tmp_path / "wal-link.db", clock=FakeClock(T0))


def test_a_fifo_or_a_directory_as_journal_is_refused(tmp_path):
    from exporter.sinks.journal.schema import JournalRefused
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    with pytest.raises(JournalRefused, match="not a regular file \\(a FIFO\\)"):
        JournalSink(fifo, clock=FakeClock(T0))
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(JournalRefused, match="a directory"):
        JournalSink(tmp_path / "dir.db", clock=FakeClock(T0))


def test_a_directory_writable_by_others_is_refused_or_tightened(tmp_path):
    from exporter.sinks.journal.schema import JournalRefused
    loose = tmp_path / "shared"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(JournalRefused, match="writable by others \\(mode 777\\)"):
        JournalSink(loose / "journal.db", clock=FakeClock(T0))
    assert not (loose / "journal.db").exists()
    assert stat.S_IMODE(loose.stat().st_mode) == 0o777  # not ours to change
    own = tmp_path / "node-resize-exporter"  # the exporter's own directory: tightened
    own.mkdir()
    own.chmod(0o777)
    j = JournalSink(own / "journal.db", clock=FakeClock(T0))
    j.on_event(lost(T0))
    j.close()
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    assert j.errors == 0


def test_a_journal_of_a_newer_schema_is_left_untouched_and_the_sink_is_down(tmp_path, caplog):
    """Item 12, and rollback safety: a newer exporter's journal is not relabelled (user_version
    stays, no table of ours), and the older binary does not exit either: the journal is a
    hostPath, so an exit would crash-loop every node of a rolled-back DaemonSet."""
    from exporter.sinks.journal.schema import SCHEMA_VERSION
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE future(x)")
        c.execute("INSERT INTO future VALUES (1)")
        c.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    caplog.set_level(logging.INFO, logger="exporter.sinks.journal")
    j = JournalSink(path, clock=FakeClock(T0), must_open=True)  # not even a named path exits
    assert not j.up
    assert f"schema version {SCHEMA_VERSION + 1}, newer" in j.down_reason
    assert "roll forward" in j.down_reason and "move the file away" in j.down_reason
    for i in range(3):
        j.on_event(lost(T0 + i))
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=cpu_offline_episode(), time=T0))
    j.mark_exported("x")
    assert j.open_episodes() == [] and j.last_kernel_events() == []
    assert j.flush(10)
    j.close()
    assert j.errors == 0  # down says it once; not a counter racing up
    lines = [r for r in caplog.records if "journal" in r.getMessage()]
    assert len(lines) == 1 and "journal sink down" in lines[0].getMessage()
    assert path.read_bytes() == before
    assert not (tmp_path / "journal.db-wal").exists()
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"future"}


V1_SCHEMA = """
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
                     type TEXT NOT NULL, json TEXT NOT NULL);
CREATE INDEX events_time ON events(time);
CREATE TABLE episodes (id TEXT PRIMARY KEY, resource TEXT, change TEXT, opened REAL, ended REAL,
                       outcome TEXT, json TEXT, exported INTEGER NOT NULL DEFAULT 0);
CREATE INDEX episodes_opened ON episodes(opened);
CREATE INDEX episodes_ended ON episodes(ended);
PRAGMA user_version=1;
"""


def test_a_version_1_journal_is_migrated_forward_and_reads_the_same(tmp_path):
    """A journal the previous release wrote (each episode row with its transitions inline)
    opens: it is migrated to the current schema in place, its rows read as they were, and a
    resumed episode continues in the new layout."""
    from exporter import codec
    from exporter.sinks.journal.schema import SCHEMA_VERSION
    path = tmp_path / "journal.db"
    done, open_ = memory_failed_episode(), cpu_online_open_episode()
    with sqlite3.connect(path) as c:
        c.executescript(V1_SCHEMA)
        for ep in (done, open_):
            c.execute("INSERT INTO episodes(id, resource, change, opened, ended, outcome, json,"
                      " exported) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      (ep.id, ep.resource.value, ep.change.value, ep.opened, ep.ended,
                       ep.outcome.value if ep.outcome else None, codec.dumps(ep),
                       int(ep is done)))
        c.execute("INSERT INTO events(time, type, json) VALUES (?, ?, ?)",
                  (T0, "EventsLost", codec.dumps(lost(T0))))
    r = JournalReader(path)  # the reader reads version 1 as it is, without migrating
    assert r.episodes() == [done, open_] and list(r.events()) == [lost(T0)]
    r.close()
    j = JournalSink(path, clock=FakeClock(T0))
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert j.open_episodes() == [open_]
    grown = replace(open_, transitions=open_.transitions + [replace(
        open_.transitions[0], unit=2, end=open_.transitions[0].end + 0.01)])
    j.save_episode(grown)
    j.close()
    r = JournalReader(path)
    assert r.episodes() == [done, grown]
    assert list(r.events()) == [lost(T0)]
    assert r.is_exported(done.id) and not r.is_exported(open_.id)
    r.close()
    with sqlite3.connect(path) as c:  # the resumed episode now has its rows in `transitions`
        assert c.execute("SELECT count(*) FROM transitions WHERE episode=?",
                         (open_.id,)).fetchone()[0] == 2


def _growing_episode(n: int):
    """Updates of one memory hot-unplug of `n` blocks, as the correlator hands them over: a
    fresh copy of the episode each time, sharing the transition objects."""
    from exporter.correlate.model import Episode, Phase
    from exporter.events import Change, Direction, Resource, Result, Transition
    ts: list = []
    ep = Episode(id=f"memory-decrease-{n}", resource=Resource.MEMORY, change=Change.DECREASE,
                 opened=T0)
    for i in range(n):
        ts.append(Transition("bpf", Resource.MEMORY, i, Direction.OFFLINE, Result.SUCCESS,
                             end=T0 + i * 0.001 + 0.0005, start=T0 + i * 0.001, pfn=i * 32768,
                             nr_pages=32768))
        yield replace(ep, transitions=list(ts))
    yield replace(ep, transitions=list(ts), phase=Phase.ENDED, ended=T0 + n * 0.001)


def test_an_episode_update_writes_what_changed_not_the_whole_episode(tmp_path):
    """A memory hot-unplug of n blocks is n updates; each used to rewrite the whole episode
    (4,096 blocks: 4.2 GiB written). Now 4x the blocks writes about 4x the bytes."""
    written = {}
    for n in (256, 1024):
        path = tmp_path / f"j{n}.db"
        j = JournalSink(path, clock=FakeClock(T0), start=False)
        for ep in _growing_episode(n):
            j.save_episode(ep)
            j.flush()  # a batch per update: the worst case for what each write costs
        j.close()
        written[n] = j.bytes_written
        r = JournalReader(path)
        (got,) = r.episodes()
        assert len(got.transitions) == n and got.transitions[-1].unit == n - 1
        r.close()
    assert written[1024] < 6 * written[256], written  # linear, not quadratic


def test_a_transition_replaced_in_place_is_rewritten(tmp_path):
    """The correlator replaces a uevent's transition with the BPF record of the same change
    (enrich): the journal keeps the better record too."""
    base = cpu_online_open_episode()
    uevent = replace(base.transitions[0], source="uevent", start=None, steps=None)
    path = tmp_path / "j.db"
    j = JournalSink(path, clock=FakeClock(T0))
    j.save_episode(replace(base, transitions=[uevent]))
    assert j.flush(10)
    j.save_episode(replace(base, transitions=[base.transitions[0]]))
    j.close()
    r = JournalReader(path)
    assert r.episodes() == [base]
    r.close()


def test_a_full_queue_drops_counts_and_logs_once_a_minute(tmp_path, caplog):
    """Without a writer (a disk stuck in D state looks the same to the agent), the queue fills:
    on_event returns at once, the rest is dropped and counted, one log line; what was queued
    is written when the writer runs."""
    caplog.set_level(logging.INFO, logger="exporter.sinks.journal")
    path = tmp_path / "j.db"
    j = JournalSink(path, clock=FakeClock(T0), queue_size=100, start=False)
    for i in range(250):
        j.on_event(lost(T0 + i))
    assert j.dropped == 150 and j.errors == 150 and j.pending == 100
    lines = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert len(lines) == 1 and "1 write(s) dropped" in lines[0]
    j.start()
    assert j.flush(10)
    j.close()
    r = JournalReader(path)
    assert [e.time for e in r.events()] == [T0 + i for i in range(100)]
    r.close()


@pytest.mark.parametrize("where", ["/proc/nope/j.db", "/proc/j.db", "/sys/j.db",
                                   "/sys/nope/j.db"])
def test_a_named_journal_that_cannot_be_created_is_refused(where):
    """As root, access() says yes under /proc and /sys; creating anything there fails. The
    sink tries, so a named path that can never work is refused with the fix."""
    from exporter.sinks.journal.schema import JournalRefused
    with pytest.raises(JournalRefused, match="cannot create .*Fix: .*--no-journal"):
        JournalSink(where, must_open=True, start=False)


def test_the_kernel_state_the_last_process_knew(tmp_path):
    """The last snapshot plus the transitions journaled after it; what sysfs
    says at the next start is compared with that."""
    from exporter.correlate.down_changes import changes_while_down, state_at_stop
    from exporter.events import Direction, KernelSnapshot, Resource, Result, Transition

    def _snap(t: float, cpus: set[int], blocks: set[int]) -> KernelSnapshot:
        return KernelSnapshot(t, frozenset(cpus), frozenset({0, 1, 2, 3} - cpus),
                              frozenset({0, 1, 2, 3}), frozenset({0, 1, 2, 3}), 128 << 20,
                              frozenset(blocks), frozenset(), 1 << 30, 0)

    j = JournalSink(tmp_path / "j.db", clock=FakeClock(T0))
    assert state_at_stop(j.last_kernel_events()) is None  # no snapshot yet: nothing to say
    j.on_event(_snap(T0, {0, 1, 2, 3}, {0, 1}))
    j.on_event(_snap(T0 + 1, {0, 1, 2}, {0, 1}))
    j.on_event(Transition("bpf", Resource.CPU, 2, Direction.OFFLINE, Result.SUCCESS, end=T0 + 2))
    j.on_event(Transition("bpf", Resource.CPU, 1, Direction.OFFLINE, Result.FAILED, end=T0 + 3))
    j.on_event(lost(T0 + 4))
    assert j.flush(10)
    events = j.last_kernel_events()
    assert [type(e).__name__ for e in events] == ["KernelSnapshot", "Transition", "Transition"]
    before = state_at_stop(events)
    assert before.cpus_online == {0, 1} and before.memory_blocks_online == {0, 1}
    changes = changes_while_down(before, _snap(T0 + 100, {0, 1, 2, 3}, {0}))
    assert changes == {(Resource.CPU, Direction.ONLINE): 2, (Resource.MEMORY, Direction.OFFLINE): 1}
    j.close()


def test_a_snapshot_ahead_of_what_was_counted_does_not_hide_a_down_change(tmp_path):
    """A SIGKILL right after a storm: the reconciler journaled a snapshot read after cpu1 came
    back online, but the online transition itself was still queued and died with the process
    (it had counted cpu1 offline last). The restart must count cpu1's online while down: the
    state compared with sysfs is the one the process counted (its start snapshot and every
    transition after it), not the newest snapshot. And the next process, which counted that
    down change and journaled its own start, counts it no second time."""
    from exporter.correlate.down_changes import changes_while_down, state_at_stop
    from exporter.events import (
        Direction,
        Resource,
        Result,
        SourceStatus,
        Transition,
    )

    now = _snap(T0 + 100, {0, 1})  # sysfs at the restart: cpu1 online
    j = JournalSink(tmp_path / "j.db", clock=FakeClock(T0))
    j.on_event(SourceStatus("sysfs", True, T0))  # the killed process starts ...
    j.on_event(_snap(T0, {0, 1}))
    for i in range(3):  # ... a storm: it counts offline, online, offline, online, offline
        j.on_event(Transition("uevent", Resource.CPU, 1, Direction.OFFLINE, Result.SUCCESS,
                              end=T0 + 1 + i))
        if i < 2:
            j.on_event(Transition("uevent", Resource.CPU, 1, Direction.ONLINE, Result.SUCCESS,
                                  end=T0 + 1.5 + i))
    j.on_event(_snap(T0 + 3.5, {0, 1}))  # read after the last online; its transition was lost
    assert j.flush(10)
    before = state_at_stop(j.last_kernel_events())
    assert before is not None and before.cpus_online == {0}  # what it counted last: offline
    assert changes_while_down(before, now) == {(Resource.CPU, Direction.ONLINE): 1}
    # The restarted process counts that, then journals its own start: nothing more is due.
    j.on_event(SourceStatus("sysfs", True, T0 + 100))
    j.on_event(now)
    assert j.flush(10)
    assert changes_while_down(state_at_stop(j.last_kernel_events()), _snap(T0 + 200, {0, 1})) \
        == {}
    j.close()


def test_a_journal_without_a_start_marker_falls_back_to_the_newest_snapshot(tmp_path):
    from exporter.correlate.down_changes import state_at_stop
    from exporter.events import KernelSnapshot

    j = JournalSink(tmp_path / "j.db", clock=FakeClock(T0))
    for t, cpus in ((T0, {0, 1}), (T0 + 1, {0})):
        j.on_event(KernelSnapshot(t, frozenset(cpus), frozenset({0, 1} - cpus),
                                  frozenset({0, 1}), frozenset({0, 1}), 128 << 20,
                                  frozenset({0}), frozenset(), 1 << 30, 0))
    assert j.flush(10)
    before = state_at_stop(j.last_kernel_events())
    assert before is not None and before.cpus_online == {0}
    j.close()


def test_a_restart_on_a_journal_whose_tail_lacks_the_last_transition_counts_it(tmp_path):
    """A real `run` restarted on a journal written as a process killed right after a storm
    leaves it: it had counted cpu1 offline last, then journaled a snapshot read after cpu1 came
    back online, and the online transition died in its queue. This machine's sysfs (read, not
    changed) says cpu1 is online: the restart counts that online as a change while down."""
    import time

    from exporter.events import (
        Direction,
        Resource,
        Result,
        SourceStatus,
        Transition,
    )
    from exporter.sources.kernel.sysfs import SysfsReader
    from testkit.exporter_proc import RunningExporter

    now = SysfsReader("/sys", "/proc").read(time.time() - 60)  # the killed process's start
    if 1 not in now.cpus_online:
        pytest.skip("cpu1 is not online on this machine")
    path = tmp_path / "journal.db"
    j = JournalSink(path, clock=FakeClock(now.time))
    j.on_event(SourceStatus("sysfs", True, now.time))
    j.on_event(now)
    j.on_event(Transition("uevent", Resource.CPU, 1, Direction.OFFLINE, Result.SUCCESS,
                          end=now.time + 1))
    j.on_event(replace(now, time=now.time + 1.01))  # read after the lost online: ahead
    assert j.flush(10)
    j.close()
    with RunningExporter("--source", "sysfs", "--kubernetes", "off",
                         "--journal", str(path)) as exp:
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="sysfs") == 1, timeout=60)
    assert s.value("node_resize_exporter_down_changes_total", resource="cpu",
                   direction="online") == 1
    assert s.total("node_resize_exporter_down_changes_total", resource="cpu") == 1


def test_a_backward_clock_step_between_restarts_counts_no_change_twice(tmp_path):
    """L2 (issue 36): process A ran with the clock 100 s ahead and journaled cpu1 offline;
    the clock stepped back before B started (sysfs: cpu1 offline, nothing to count); B saw
    cpu1 come online. C starts with sysfs saying cpu1 online: nothing changed while down.
    Before, the state C compared took A's offline too (its time is after B's start snapshot by
    the wall clock) and counted an online while down that B had already counted live."""
    from exporter.correlate.down_changes import changes_while_down, state_at_stop
    from exporter.events import (
        Direction,
        Resource,
        Result,
        SourceStatus,
        Transition,
    )

    def cpu1(direction: Direction, end: float) -> Transition:
        return Transition("uevent", Resource.CPU, 1, direction, Result.SUCCESS, end=end)

    j = JournalSink(tmp_path / "j.db", clock=FakeClock(T0))
    runs = [(T0 + 100, {0, 1}, cpu1(Direction.OFFLINE, T0 + 101)),  # A, clock ahead
            (T0, {0}, cpu1(Direction.ONLINE, T0 + 1))]  # B, the clock stepped back
    for started, cpus, transition in runs:
        now = _snap(started, cpus)
        assert changes_while_down(state_at_stop(j.last_kernel_events()), now) == {}
        j.on_event(SourceStatus("sysfs", True, started))
        j.on_event(now)
        j.on_event(transition)
        assert j.flush(10)
    # C, and every later start: sysfs says what B counted last.
    for started in (T0 + 2, T0 + 3):
        before = state_at_stop(j.last_kernel_events())
        assert changes_while_down(before, _snap(started, {0, 1})) == {}
    j.close()


def _snap(t: float, cpus: set[int]):
    """A two-CPU host's kernel snapshot at `t` with `cpus` online (one memory block)."""
    from exporter.events import KernelSnapshot
    return KernelSnapshot(t, frozenset(cpus), frozenset({0, 1} - cpus), frozenset({0, 1}),
                          frozenset({0, 1}), 128 << 20, frozenset({0}), frozenset(), 1 << 30, 0)
