"""The SQLite journal: WAL, 0600, resume, exported flag, retention, read-only and full disks."""
from __future__ import annotations

import logging
import os
import sqlite3
import stat
import subprocess
from dataclasses import replace

import pytest

from exporter.clock import FakeClock
from exporter.correlate.model import EpisodeUpdate, UpdateKind
from exporter.events import EventsLost, MalformedInput
from exporter.sinks.journal.store import Journal, JournalError, default_journal_path
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
        j = Journal(path, clock=FakeClock(T0))
        j.on_event(lost(T0))
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
    j = Journal(path, clock=FakeClock(T0))
    events = [lost(T0 + i, i) for i in range(5)] + [
        MalformedInput(source="uevent", detail="bad line", time=T0 + 9)]
    for e in events:
        j.on_event(e)
    done, failed, open_ = cpu_offline_episode(), memory_failed_episode(), cpu_online_open_episode()
    # The same episode written at several stages: the last state wins.
    early = replace(done, phase=cpu_online_open_episode().phase, outcome=None, ended=None)
    for ep in (early, done, failed, open_):
        j.on_update(EpisodeUpdate(kind=UpdateKind.TRANSITION, episode=ep, time=ep.opened))
    # No close(): a SIGKILL'd agent never gets to close. A new process must still see it all.
    j2 = Journal.open_existing(path)
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
    j3 = Journal(path, clock=FakeClock(T0 + 300))
    assert j3.open_episodes() == [open_]
    j3.close()
    j.close()


def test_exported_flag_survives_restart_and_either_sink_order(tmp_path):
    path = tmp_path / "j.db"
    j = Journal(path, clock=FakeClock(T0))
    ep = cpu_offline_episode()
    assert not j.is_exported(ep.id)
    j.mark_exported(ep.id)  # trace sink ran first: the episode row does not exist yet
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=ep, time=ep.ended))
    other = memory_failed_episode()
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=other, time=other.ended))
    j.close()
    j = Journal(path, clock=FakeClock(T0))
    assert j.is_exported(ep.id)
    assert not j.is_exported(other.id)
    assert j.episode(ep.id) == ep
    j.mark_exported(other.id)
    assert j.is_exported(other.id)
    j.close()


def test_retention_by_age_keeps_open_episodes(tmp_path):
    path = tmp_path / "j.db"
    clock = FakeClock(T0)
    j = Journal(path, clock=clock, max_age=30 * DAY)
    for i in range(10):
        j.on_event(lost(T0 + i * DAY))
    old_done = cpu_offline_episode(T0, "old-done")
    old_open = cpu_online_open_episode(T0 + 1, "old-open")
    recent = memory_failed_episode(T0 + 35 * DAY, "recent")
    for ep in (old_done, old_open, recent):
        j.save_episode(ep)
    j.close()
    clock.t = T0 + 35 * DAY  # 30-day cutoff = T0 + 5 days; retention runs at start
    j = Journal(path, clock=clock, max_age=30 * DAY)
    assert [e.time for e in j.events()] == [T0 + i * DAY for i in range(5, 10)]
    assert [e.id for e in j.episodes()] == ["old-open", "recent"]
    assert j.pruned_events == 5 and j.pruned_episodes == 1
    j.close()


def test_retention_by_size_keeps_database_under_bound(tmp_path):
    path = tmp_path / "j.db"
    bound = 256 * 1024
    clock = FakeClock(T0)
    j = Journal(path, clock=clock, max_bytes=bound, prune_every=200)
    j.save_episode(cpu_online_open_episode())
    peak = 0
    n = 6000  # ~0.5 MB of rows written against a 256 KiB bound
    for i in range(n):
        j.on_event(MalformedInput(source="uevent", detail=f"line {i} " + "x" * 40, time=T0 + i))
        if (i + 1) % 200 == 0:  # just after a prune
            peak = max(peak, j.size_bytes())
    j.close()
    assert j.errors == 0
    assert peak <= bound
    assert path.stat().st_size <= bound  # the file itself shrank (incremental vacuum)
    j = Journal.open_existing(path)
    times = [e.time for e in j.events()]
    assert 0 < len(times) < n
    assert times[-1] == T0 + n - 1  # newest kept, oldest gone
    assert times == sorted(times) and times[0] > T0
    assert [e.id for e in j.open_episodes()] == ["cpu-increase-1"]
    j.close()


def test_open_existing_refuses_missing_or_foreign_files(tmp_path):
    with pytest.raises(JournalError, match="no journal at"):
        Journal.open_existing(tmp_path / "missing.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(JournalError, match="cannot read the journal"):
        Journal.open_existing(junk)


def test_malformed_rows_are_counted_and_skipped(tmp_path):
    path = tmp_path / "j.db"
    j = Journal(path, clock=FakeClock(T0))
    j.on_event(lost(T0))
    j.save_episode(cpu_offline_episode())
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO events(time, type, json) VALUES (?, 'X', '{\"type\": \"X\"}')",
                  (T0 + 1,))
        c.execute("INSERT INTO episodes(id, json) VALUES ('bad', '{oops')")
    j.on_event(lost(T0 + 2))
    assert [e.time for e in j.events()] == [T0, T0 + 2]
    assert [e.id for e in j.episodes()] == ["cpu-decrease-1"]
    assert j.malformed == 2
    j.close()


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
    caplog.set_level(logging.DEBUG, logger="exporter.sinks.journal.store")
    j = Journal(ro / "nre" / "journal.db", clock=FakeClock(T0))  # must not raise
    start = j.errors
    assert start >= 1
    for i in range(5):
        j.on_event(lost(T0 + i))
    j.on_update(EpisodeUpdate(kind=UpdateKind.ENDED, episode=cpu_offline_episode(), time=T0))
    assert j.errors == start + 6  # every write was attempted and counted
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "write failed" in warnings[0].getMessage()
    assert j.open_episodes() == [] and not j.is_exported("x")
    j.close()


def test_full_disk_is_logged_once_counted_and_recovers(tiny_mount, caplog):
    disk = tiny_mount("full", "size=512k,mode=0700")
    caplog.set_level(logging.DEBUG, logger="exporter.sinks.journal.store")
    j = Journal(disk / "journal.db", clock=FakeClock(T0), prune_every=10**9)
    j.on_event(lost(T0))
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
    stored_before = j.count_events()
    i = 0
    while j.errors < 20 and i < 20000:  # the WAL may take a few writes into its last pages
        i += 1
        j.on_event(MalformedInput(source="uevent", detail="y" * 500, time=T0 + i))
    assert j.errors == 20
    errors_at_full = j.errors
    j.on_event(lost(T0 + 10**6))
    assert j.errors == errors_at_full + 1  # still attempted, still counted
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "write failed" in warnings[0].getMessage()
    filler.unlink()  # space comes back: the journal writes again without a restart
    j.on_event(lost(T0 + 2 * 10**6, 7))
    assert j.errors == errors_at_full + 1
    events = list(j.events())
    assert events[-1] == lost(T0 + 2 * 10**6, 7)
    assert len(events) >= stored_before + 1
    assert "writes succeed again" in caplog.records[-1].getMessage()
    j.close()


# ------------------------------------------------------------ issue 16: the journal's path


def test_a_symlink_journal_is_refused_and_its_target_untouched(tmp_path):
    from exporter.sinks.journal.store import JournalRefused
    target = tmp_path / "passwd-like"
    target.write_text("root:x:0:0\n")
    target.chmod(0o644)
    link = tmp_path / "journal.db"
    link.symlink_to(target)
    with pytest.raises(JournalRefused, match="symbolic link"):
        Journal(link, clock=FakeClock(T0))
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "root:x:0:0\n"
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "not-there")
    with pytest.raises(JournalRefused, match="symbolic link"):
        Journal(dangling, clock=FakeClock(T0))
    assert not (tmp_path / "not-there").exists()
    (tmp_path / "wal-link.db-wal").symlink_to(target)  # a planted -wal link counts too
    with pytest.raises(JournalRefused, match="wal-link.db-wal is a symbolic link"):
        Journal(tmp_path / "wal-link.db", clock=FakeClock(T0))


def test_a_fifo_or_a_directory_as_journal_is_refused(tmp_path):
    from exporter.sinks.journal.store import JournalRefused
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    with pytest.raises(JournalRefused, match="not a regular file \\(a FIFO\\)"):
        Journal(fifo, clock=FakeClock(T0))
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(JournalRefused, match="a directory"):
        Journal(tmp_path / "dir.db", clock=FakeClock(T0))


def test_a_directory_writable_by_others_is_refused_or_tightened(tmp_path):
    from exporter.sinks.journal.store import JournalRefused
    loose = tmp_path / "shared"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(JournalRefused, match="writable by others \\(mode 777\\)"):
        Journal(loose / "journal.db", clock=FakeClock(T0))
    assert not (loose / "journal.db").exists()
    assert stat.S_IMODE(loose.stat().st_mode) == 0o777  # not ours to change
    own = tmp_path / "node-resize-exporter"  # the exporter's own directory: tightened
    own.mkdir()
    own.chmod(0o777)
    j = Journal(own / "journal.db", clock=FakeClock(T0))
    j.on_event(lost(T0))
    j.close()
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    assert j.errors == 0


def test_a_journal_of_a_newer_schema_is_refused_not_relabelled(tmp_path):
    """Item 12: user_version 2 stays 2, and nothing is written into it."""
    from exporter.sinks.journal.store import SCHEMA_VERSION, JournalRefused
    path = tmp_path / "journal.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE future(x)")
        c.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(JournalRefused, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        Journal(path, clock=FakeClock(T0))
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"future"}


def test_the_kernel_state_the_last_process_knew(tmp_path):
    """Issue 16, item 14: the last snapshot plus the transitions journaled after it; what sysfs
    says at the next start is compared with that."""
    from exporter.correlate.down_changes import changes_while_down, state_at_stop
    from exporter.events import Direction, KernelSnapshot, Resource, Result, Transition

    def snap(t: float, cpus: set[int], blocks: set[int]) -> KernelSnapshot:
        return KernelSnapshot(t, frozenset(cpus), frozenset({0, 1, 2, 3} - cpus),
                              frozenset({0, 1, 2, 3}), frozenset({0, 1, 2, 3}), 128 << 20,
                              frozenset(blocks), frozenset(), 1 << 30, 0)

    j = Journal(tmp_path / "j.db", clock=FakeClock(T0))
    assert state_at_stop(j.last_kernel_events()) is None  # no snapshot yet: nothing to say
    j.on_event(snap(T0, {0, 1, 2, 3}, {0, 1}))
    j.on_event(snap(T0 + 1, {0, 1, 2}, {0, 1}))
    j.on_event(Transition("bpf", Resource.CPU, 2, Direction.OFFLINE, Result.SUCCESS, end=T0 + 2))
    j.on_event(Transition("bpf", Resource.CPU, 1, Direction.OFFLINE, Result.FAILED, end=T0 + 3))
    j.on_event(lost(T0 + 4))
    events = j.last_kernel_events()
    assert [type(e).__name__ for e in events] == ["KernelSnapshot", "Transition", "Transition"]
    before = state_at_stop(events)
    assert before.cpus_online == {0, 1} and before.memory_blocks_online == {0, 1}
    changes = changes_while_down(before, snap(T0 + 100, {0, 1, 2, 3}, {0}))
    assert changes == {(Resource.CPU, Direction.ONLINE): 2, (Resource.MEMORY, Direction.OFFLINE): 1}
    j.close()
