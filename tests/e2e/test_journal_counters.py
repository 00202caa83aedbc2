"""The hotplug counters carried across restarts within one boot (issue 36 M6): the journal's
`counters` row, what `carry` starts from, hostile rows, another boot, no boot id."""
from __future__ import annotations

import json
import os
import sqlite3
import uuid

import pytest

from exporter.app import boot_id
from exporter.clock import FakeClock
from exporter.correlate.ledger import KernelLedger
from exporter.events import Direction, Resource, Result, Transition
from exporter.sinks.journal import counters
from exporter.sinks.journal.sink import JournalSink
from testkit.postmortem_samples import T0

BOOT, OTHER = str(uuid.uuid4()), str(uuid.uuid4())
CPU_ON, CPU_OFF = (Resource.CPU, Direction.ONLINE), (Resource.CPU, Direction.OFFLINE)


def _t(source: str, direction: Direction, end: float,
       result: Result = Result.SUCCESS) -> Transition:
    return Transition(source, Resource.CPU, 1, direction, result, end=end)


# What a killed process handed its journal: cpu1 off and on twice, each seen by two sources
# (the agent counts each once), and one refused offline.
STORM = [_t("uevent", Direction.OFFLINE, T0 + 1), _t("bpf", Direction.OFFLINE, T0 + 1),
         _t("uevent", Direction.ONLINE, T0 + 2), _t("bpf", Direction.ONLINE, T0 + 2),
         _t("bpf", Direction.OFFLINE, T0 + 3), _t("uevent", Direction.OFFLINE, T0 + 3),
         _t("uevent", Direction.ONLINE, T0 + 4),
         _t("uevent", Direction.OFFLINE, T0 + 5, Result.FAILED)]


def _rows(path) -> dict[str, str]:
    with sqlite3.connect(path) as c:
        return dict(c.execute("SELECT boot_id, json FROM counters").fetchall())


def test_the_counters_go_on_from_what_this_boots_processes_committed(tmp_path):
    path = tmp_path / "j.db"
    a = JournalSink(path, clock=FakeClock(T0))
    assert a.carry(BOOT, {}).transitions == {}  # the first start of this boot: from 0
    for event in STORM:
        a.on_event(event)
    assert a.flush(10)
    a.close()
    # What the agent counted is what the row carries: the same deduplication across sources.
    agent = KernelLedger()
    for event in STORM:
        agent.handle(event)
    assert agent.transitions == {
        (Resource.CPU, Direction.OFFLINE, Result.SUCCESS): 2,
        (Resource.CPU, Direction.ONLINE, Result.SUCCESS): 2,
        (Resource.CPU, Direction.OFFLINE, Result.FAILED): 1}
    b = JournalSink(path, clock=FakeClock(T0 + 100))
    carried = b.carry(BOOT, {CPU_OFF: 1})  # cpu1 went offline while no exporter ran
    expected = dict(agent.transitions)
    expected[(Resource.CPU, Direction.OFFLINE, Result.SUCCESS)] += 1  # a transition too
    assert carried.transitions == expected
    assert carried.down_changes == {CPU_OFF: 1}
    b.close()  # B counted nothing more; C finds no change while down
    c = JournalSink(path, clock=FakeClock(T0 + 200))
    again = c.carry(BOOT, {})
    assert again.transitions == expected and again.down_changes == {CPU_OFF: 1}
    c.close()
    # A reboot: another boot id starts at 0, and the old boot's row goes.
    d = JournalSink(path, clock=FakeClock(T0 + 300))
    assert d.carry(OTHER, {}) == counters.Carried()
    d.close()
    assert list(_rows(path)) == [OTHER]


def test_the_row_is_committed_with_the_transitions_it_counts(tmp_path):
    """What a SIGKILL leaves: no close, the row is what the last transaction committed."""
    path = tmp_path / "j.db"
    a = JournalSink(path, clock=FakeClock(T0))
    a.carry(BOOT, {CPU_ON: 2})
    a.on_event(STORM[0])
    assert a.flush(10)
    row = counters.decode(_rows(path)[BOOT])
    assert row.transitions == {(Resource.CPU, Direction.ONLINE, Result.SUCCESS): 2,
                               (Resource.CPU, Direction.OFFLINE, Result.SUCCESS): 1}
    assert row.down_changes == {CPU_ON: 2}
    a.close()


HOSTILE = {
    "not-json": "{",
    "a-list": "[]",
    "negative": '{"transitions": [["cpu", "offline", "success", -1]]}',
    "past-2^53": '{"transitions": [["cpu", "offline", "success", %d]]}' % 2**60,
    "a-float": '{"transitions": [["cpu", "offline", "success", 1.5]]}',
    "a-bool": '{"transitions": [["cpu", "offline", "success", true]]}',
    "unknown-resource": '{"transitions": [["gpu", "offline", "success", 1]]}',
    "twice": '{"transitions": [["cpu", "online", "success", 1], ["cpu", "online", "success", 2]]}',
    "short-entry": '{"transitions": [["cpu", "online"]]}',
    "bad-down": '{"transitions": [], "down_changes": [["cpu", "sideways", 1]]}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "deep-under-64k": "[" * 30_000 + "]" * 30_000,
    "a-blob": b'{"transitions": []}',
    "huge": json.dumps({"transitions": [], "pad": "x" * (1 << 20)}),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_counters_row_is_refused_whole_and_replaced(tmp_path, text):
    path = tmp_path / "j.db"
    JournalSink(path, clock=FakeClock(T0)).close()
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO counters VALUES (?, ?)", (BOOT, text))
    j = JournalSink(path, clock=FakeClock(T0))
    carried = j.carry(BOOT, {CPU_ON: 1})  # only this start's change: from 0 otherwise
    assert carried.transitions == {(Resource.CPU, Direction.ONLINE, Result.SUCCESS): 1}
    assert j.counters_refused
    j.close()
    assert counters.decode(_rows(path)[BOOT]) == carried  # replaced with a row of ours


def test_without_a_boot_id_nothing_is_carried_and_the_row_is_left(tmp_path):
    path = tmp_path / "j.db"
    a = JournalSink(path, clock=FakeClock(T0))
    a.carry(BOOT, {CPU_ON: 3})
    a.close()
    before = _rows(path)
    b = JournalSink(path, clock=FakeClock(T0))
    assert b.carry(None, {CPU_OFF: 1}).transitions == {
        (Resource.CPU, Direction.OFFLINE, Result.SUCCESS): 1}
    b.on_event(STORM[0])
    assert b.flush(10)
    b.close()
    assert _rows(path) == before


def test_the_boot_id_is_read_bounded_and_checked(tmp_path):
    procfs = tmp_path / "proc"
    where = procfs / counters.BOOT_ID_PATH
    assert boot_id(str(procfs)) is None  # missing
    where.parent.mkdir(parents=True)
    os.mkfifo(where)
    assert boot_id(str(procfs)) is None  # a FIFO: refused at once, never waited on
    where.unlink()
    where.write_text("not a uuid\n")
    assert boot_id(str(procfs)) is None
    where.write_text(BOOT + "\n")
    assert boot_id(str(procfs)) == BOOT
    real = boot_id("/proc")
    assert real is not None and real == open("/proc/sys/kernel/random/boot_id").read().strip()


def test_a_run_on_a_journal_with_a_hostile_row_counts_it_and_starts_at_zero(tmp_path):
    """The real `run`: this boot's row (the kernel's boot id) holds a count past 2^53. It is
    counted in malformed_total{source="journal"} and the counters start at 0, then carry."""
    from testkit.exporter_proc import RunningExporter

    path = tmp_path / "journal.db"
    JournalSink(path, clock=FakeClock(T0)).close()
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO counters VALUES (?, ?)", (boot_id("/proc"), HOSTILE["past-2^53"]))
    args = ("--source", "sysfs", "--kubernetes", "off", "--journal", str(path))
    with RunningExporter(*args) as exp:
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="sysfs") == 1, timeout=60)
        logs = exp.logs()
    assert s.value("node_resize_exporter_malformed_total", source="journal") == 1
    assert s.total("node_resize_kernel_transitions_total") == 0
    assert "counters row of this boot refused" in logs


def test_transitions_the_full_queue_dropped_are_in_the_row_all_the_same(tmp_path):
    """A stuck disk: the queue holds 2, the agent counted (and a scrape may have shown) 5.
    The row must not fall below that, or the next start is a counter reset."""
    path = tmp_path / "j.db"
    j = JournalSink(path, clock=FakeClock(T0), queue_size=2, start=False)
    j.carry(BOOT, {})
    for i in range(5):
        j.on_event(_t("uevent", Direction.OFFLINE if i % 2 == 0 else Direction.ONLINE,
                      T0 + i))
    assert j.dropped == 3
    assert j.flush(10)
    j.close()
    assert counters.decode(_rows(path)[BOOT]).transitions == {
        (Resource.CPU, Direction.OFFLINE, Result.SUCCESS): 3,
        (Resource.CPU, Direction.ONLINE, Result.SUCCESS): 2}
