"""The managed-pages fallback on this host's real kernel: no kprobes here, so MemTotal is polled;
a memory block's own offline and online move MemTotal by 128 MiB and must not be reported as a
change no block made (the block sources count them). Runs as root (memory hotplug); holds the
machine-wide hotplug lock through the memory_block fixture."""
from __future__ import annotations

import pytest

from exporter.clock import MonotonicWallClock
from exporter.sources.kernel.managed_pages import ManagedPagesPoll, kprobes_here
from exporter.sources.kernel.sysfs import parse_meminfo

pytestmark = pytest.mark.kernel


def mem_total() -> int:
    return parse_meminfo(open("/proc/meminfo").read())["MemTotal"]


def test_this_host_has_no_kprobes_so_the_poll_runs():
    assert kprobes_here() is False  # ENVIRONMENT: CONFIG_KPROBES=n on these hosts


def test_a_block_offline_and_online_is_no_managed_change(memory_block):
    poll = ManagedPagesPoll(MonotonicWallClock(), 1.0)
    poll.open()
    out: list = []
    before = mem_total()
    memory_block.set_online(False)
    try:
        assert mem_total() == before - (128 << 20)
        poll.poll(out.append)
        poll.poll(out.append)
    finally:
        memory_block.set_online(True)
    poll.poll(out.append)
    poll.poll(out.append)
    assert mem_total() == before
    assert out == [], out
    assert not poll.settler.pending
