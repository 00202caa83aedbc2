"""The journal off the path to /metrics: a slow disk delays the journal, never what /metrics
shows. A real `run`, real cpu1 transitions, the journal on a FUSE file system whose every write
and fsync takes 300 ms (testkit/slowfs.py: this kernel has no device-mapper for a dm-delay
target).

Before the writer thread, each event was written before it was acted on, so /metrics could never
be ahead of the journal, and with this disk each offline took 2.2, then 13.8, 24.6, 28.2 s to
show. The assertion is not a time: it is that /metrics showed transitions the journal did not
hold yet (only possible when the agent does not wait for the disk), and that the journal caught
up with every one of them (or counted what it dropped).
"""
from __future__ import annotations

import time

import pytest

from exporter.events import Direction, Resource, Transition
from exporter.sinks.journal.reader import JournalReader
from exporter.sinks.journal.sink import JournalSink
from testkit.exporter_proc import RunningExporter
from testkit.slowfs import SlowFs

FLAPS = 10
WRITE_DELAY = 0.3


def _cpu1_offlines(path) -> int:
    """cpu1 offlines the uevent source delivered, as the journal holds them now."""
    r = JournalReader(path)
    try:
        return sum(1 for e in r.events() if isinstance(e, Transition) and e.source == "uevent"
                   and e.resource is Resource.CPU and e.unit == 1
                   and e.direction is Direction.OFFLINE)
    finally:
        r.close()


def _offlines(s) -> float:
    return s.value("node_resize_kernel_transitions_total", resource="cpu", direction="offline",
                   result="success", default=0)


@pytest.mark.kernel
def test_a_slow_journal_disk_does_not_hold_metrics_back(cpu1, tmp_path):
    backing, mount = tmp_path / "backing", tmp_path / "mnt"
    # Made on the fast disk first: opening an existing journal writes nothing, so start-up (which
    # opens it before serving) is not what this measures.
    JournalSink(backing / "nre" / "journal.db", start=False).close()
    with SlowFs(backing, mount, write_delay=WRITE_DELAY):
        journal = mount / "nre" / "journal.db"
        with RunningExporter("--source", "uevent", "--kubernetes", "off",
                             "--journal", str(journal)) as exp:
            exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="uevent") == 1)
            ahead, shown_after = [], []
            for k in range(1, FLAPS + 1):
                written = time.monotonic()
                cpu1.set_online(False)
                s = exp.wait_for(lambda s: _offlines(s) >= k, timeout=120)
                shown_after.append(round(time.monotonic() - written, 2))  # printed, not asserted
                ahead.append(k - _cpu1_offlines(journal))
                cpu1.set_online(True)
                time.sleep(1.0)  # the brief's storm: one flap a second
            print(f"offline -> /metrics: {shown_after} s; /metrics ahead of the journal by "
                  f"{ahead} offlines")
            assert _offlines(s) == k == FLAPS
            assert max(ahead) > 0, "the journal held every offline before /metrics showed it: " \
                "the agent waited for the disk"
            # The journal catches up by itself while the exporter runs (nothing was dropped:
            # the queue holds minutes of this), on the same slow disk.
            deadline = time.monotonic() + 120
            while _cpu1_offlines(journal) < FLAPS and time.monotonic() < deadline:
                time.sleep(0.5)
            errors = exp.scrape().value("node_resize_exporter_sink_errors_total", sink="journal")
            assert _cpu1_offlines(journal) == FLAPS and errors == 0, errors
        assert exp.proc.returncode == 0, exp.logs_tail()
