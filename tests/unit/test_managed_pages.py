"""Memory that moves without a memory block (virtio-mem sub-blocks, balloons): the settling of
the managed page sum into Transitions, the mechanism's name, the MemTotal poll where no kprobe
sees it, and what the correlator makes of such a change (an episode naming the mechanism, drift
against the kubelet, counted once whoever saw it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from exporter.clock import FakeClock
from exporter.correlate.model import Outcome
from exporter.events import (
    MANAGED_PAGE_PROGRAMS,
    Direction,
    ProgramStatus,
    Resource,
    Result,
    Transition,
)
from exporter.sources.kernel.managed_pages import (
    BALLOON,
    MANAGED_UNIT,
    SETTLE_SECONDS,
    UNKNOWN,
    VIRTIO_BALLOON,
    VIRTIO_MEM,
    Drivers,
    ManagedPagesPoll,
    Settler,
    balloon_pages,
    mechanism,
)
from testkit.correlator_stream import T0, GiB, MiB, Stream

MEM = Resource.MEMORY
PAGES_32M = 32 * MiB // 4096


def test_a_change_settles_once_the_sum_stood_still():
    s = Settler("bpf")
    s.wake(10.0)
    assert not s.read(-4096, 10.125)  # still moving
    assert not s.read(-8192, 10.25)
    assert not s.read(-8192, 10.25 + SETTLE_SECONDS / 2)
    assert s.read(-8192, 10.25 + SETTLE_SECONDS * 1.5)
    t = s.finish(-8192, VIRTIO_BALLOON)
    assert t == Transition("bpf", MEM, MANAGED_UNIT, Direction.OFFLINE, Result.SUCCESS,
                           end=10.25, start=10.0, nr_pages=8192, mechanism=VIRTIO_BALLOON)
    assert not s.pending
    # the next change is reported from where this one ended, not from zero
    s.wake(20.0)
    assert s.read(-8192 + PAGES_32M, 20.0) is False
    assert s.read(-8192 + PAGES_32M, 21.0)
    t = s.finish(-8192 + PAGES_32M, VIRTIO_MEM)
    assert t is not None and t.direction is Direction.ONLINE and t.nr_pages == PAGES_32M


def test_a_change_that_came_back_to_where_it_was_is_no_transition():
    s = Settler("bpf")
    s.wake(1.0)
    s.read(512, 1.0)
    s.read(0, 1.1)
    assert s.read(0, 2.0)
    assert s.finish(0, UNKNOWN) is None and not s.pending


def test_balloon_pages_are_inflated_minus_deflated():
    assert balloon_pages("nr_free_pages 5\nballoon_inflate 65536\nballoon_deflate 1024\n"
                         "balloon_migrate 3\n") == 64512
    assert balloon_pages("nr_free_pages 5\n") == 0  # no balloon counters in this kernel
    assert balloon_pages("balloon_inflate x\nballoon_deflate 7\n") == 0  # never negative


def test_the_mechanism_is_the_balloon_when_its_counters_moved():
    both = Drivers(virtio_mem=1, virtio_balloon=1)
    assert mechanism(True, both) == VIRTIO_BALLOON
    assert mechanism(True, Drivers()) == BALLOON  # Hyper-V's, VMware's
    assert mechanism(False, both) == VIRTIO_MEM
    assert mechanism(False, Drivers()) == UNKNOWN


def test_drivers_count_the_bound_virtio_devices(tmp_path):
    for driver, devices in (("virtio_mem", ("virtio4", "virtio5")), ("virtio_balloon", ())):
        d = tmp_path / "bus/virtio/drivers" / driver
        d.mkdir(parents=True)
        (d / "bind").write_text("")
        for dev in devices:
            (d / dev).mkdir()
    assert Drivers.read(tmp_path) == Drivers(virtio_mem=2, virtio_balloon=0)
    assert Drivers.read(tmp_path / "none") == Drivers()


# ---------------------------------------------------------------- the poll (no kprobes)


def _tree(root: Path, mem_kb: int, blocks: dict[int, str], inflated: int = 0) -> None:
    proc, mem = root / "proc", root / "sys/devices/system/memory"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "meminfo").write_text(f"MemTotal: {mem_kb} kB\nSwapTotal: 0 kB\n")
    (proc / "vmstat").write_text(f"balloon_inflate {inflated}\nballoon_deflate 0\n")
    mem.mkdir(parents=True, exist_ok=True)
    (mem / "block_size_bytes").write_text("8000000\n")
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "online").write_text("0\n")
    for n, state in blocks.items():
        (mem / f"memory{n}").mkdir(exist_ok=True)
        (mem / f"memory{n}" / "state").write_text(state + "\n")
    balloon = root / "sys/bus/virtio/drivers/virtio_balloon/virtio3"
    balloon.mkdir(parents=True, exist_ok=True)


def test_the_poll_reports_a_memtotal_move_no_block_made_and_names_the_balloon(tmp_path):
    _tree(tmp_path, 1_048_576, {0: "online", 1: "online"})
    clock = FakeClock(T0)
    poll = ManagedPagesPoll(clock, 1.0, str(tmp_path / "sys"), str(tmp_path / "proc"))
    poll.open()
    out: list = []
    poll.poll(out.append)
    assert out == []
    _tree(tmp_path, 1_048_576 - 262_144, {0: "online", 1: "online"}, inflated=65536)
    clock.t = T0 + 1
    poll.poll(out.append)  # it moved: not settled yet
    assert out == []
    clock.t = T0 + 2
    poll.poll(out.append)  # stood still for an interval: one transition
    [t] = out
    assert (t.source, t.unit, t.direction, t.nr_pages, t.mechanism) == (
        "managed_pages", MANAGED_UNIT, Direction.OFFLINE, 65536, VIRTIO_BALLOON)
    assert t.start == t.end == T0 + 1


def test_the_poll_leaves_a_block_transition_to_the_block_sources(tmp_path):
    _tree(tmp_path, 1_048_576, {0: "online", 1: "online"})
    poll = ManagedPagesPoll(FakeClock(T0), 1.0, str(tmp_path / "sys"), str(tmp_path / "proc"))
    poll.open()
    _tree(tmp_path, 1_048_576 - 131_072, {0: "online", 1: "offline"})
    out: list = []
    poll.poll(out.append)
    poll.poll(out.append)
    assert out == []


class _OnliningKernel:
    """Blocks coming online one after another, as the kernel does it: each block's pages join
    MemTotal, then its state file says online. A read of MemTotal lets the kernel take
    `mem_steps` steps first, a scan of the block states `scan_steps` (a directory of hundreds
    of blocks is slow to read), so the poll's reads interleave with the onlining."""

    def __init__(self, mem_kb: int, online: set[int], coming: list[int], mem_steps: int,
                 scan_steps: int):
        self.mem_kb, self.online = mem_kb, set(online)
        self.steps = [step for n in coming for step in (("mem", n), ("state", n))]
        self.mem_steps, self.scan_steps = mem_steps, scan_steps

    def _step(self, n: int) -> None:
        for what, block in self.steps[:n]:
            if what == "mem":
                self.mem_kb += 128 * 1024
            else:
                self.online.add(block)
        del self.steps[:n]

    def mem_total(self) -> int:
        self._step(self.mem_steps)
        return self.mem_kb * 1024

    def blocks(self) -> tuple[int, frozenset[int], frozenset[int]]:
        self._step(self.scan_steps)
        return 128 * MiB, frozenset(self.online), frozenset()


@pytest.mark.parametrize("mem_steps,scan_steps", [(1, 1), (1, 3), (2, 5), (1, 16), (3, 1)])
def test_blocks_onlined_between_the_polls_reads_are_no_managed_change(tmp_path, mem_steps,
                                                                        scan_steps):
    """The lab's false "+768 MiB" of virtio-mem: eight blocks came online while the poll read
    MemTotal and the block states; pages of blocks whose state was not read online yet were
    taken for a change no block made."""
    _tree(tmp_path, 1_048_576, {0: "online"})
    clock = FakeClock(T0)
    poll = ManagedPagesPoll(clock, 1.0, str(tmp_path / "sys"), str(tmp_path / "proc"))
    poll.open()
    kernel = _OnliningKernel(1_048_576, {0}, list(range(48, 56)), mem_steps, scan_steps)
    poll._mem_total = kernel.mem_total  # type: ignore[method-assign]
    poll.reader.memory_blocks = kernel.blocks  # type: ignore[method-assign]
    out: list = []
    for second in range(1, 30):
        clock.t = T0 + second
        poll.poll(out.append)
    assert kernel.online == {0, *range(48, 56)} and not kernel.steps  # all done, then still
    assert out == []


def test_a_still_memtotal_reads_no_block_state(tmp_path):
    """The poll's cost where nothing moves (bench/README.md: 34 us a second): one MemTotal read,
    never the block states' directory, which is thousands of files on a large node."""
    _tree(tmp_path, 1_048_576, {n: "online" for n in range(64)})
    poll = ManagedPagesPoll(FakeClock(T0), 1.0, str(tmp_path / "sys"), str(tmp_path / "proc"))
    poll.open()
    scans: list[int] = []
    scan = poll.reader.memory_blocks
    poll.reader.memory_blocks = lambda: scans.append(1) or scan()  # type: ignore[method-assign]
    out: list = []
    for _ in range(10):
        poll.poll(out.append)
    assert scans == [] and out == []
    _tree(tmp_path, 1_048_576 - 8192, {n: "online" for n in range(64)}, inflated=2048)
    poll.poll(out.append)  # it moved: now the blocks are read, before and after MemTotal
    assert len(scans) == 2


# ---------------------------------------------------------------- the correlator


def _managed(s: Stream, offset: float, pages: int, source: str = "bpf",
             what: str = VIRTIO_BALLOON) -> None:
    end = T0 + offset
    s.feed(offset, Transition(source, MEM, MANAGED_UNIT,
                              Direction.ONLINE if pages > 0 else Direction.OFFLINE,
                              Result.SUCCESS, end=end, start=end - 0.25, nr_pages=abs(pages),
                              mechanism=what))


def test_a_balloon_inflate_is_an_episode_naming_it_and_drift_against_the_kubelet():
    s = Stream(kubernetes=True)
    s.snapshot(0, mem=4 * GiB)
    s.node(0, mem=4 * GiB)
    _managed(s, 1.0, -65536)  # 256 MiB into the balloon
    s.snapshot(1.0625, mem=4 * GiB - 256 * MiB)
    s.tick(3.5)
    assert s.view.drift()[MEM] == -256 * MiB  # kernel minus kubelet: it still says 4 GiB
    s.node(5.0, mem=4 * GiB - 256 * MiB)  # the kubelet follows: no drift, converged
    assert s.view.drift()[MEM] == 0
    s.tick(1000.0)
    [ep] = s.ended()
    assert ep.change.value == "decrease" and ep.outcome is Outcome.CONVERGED
    assert ep.kernel_before == 4 * GiB and ep.kernel_after == 4 * GiB - 256 * MiB
    assert "virtio-balloon: -256 MiB" in ep.detail


def _kprobes(s: Stream, attached: bool = True) -> None:
    """The bpf source reports its managed-page programs (as it does once it loaded them)."""
    for program in MANAGED_PAGE_PROGRAMS:
        s.correlator.handle(ProgramStatus(program, attached, s.clock.t), "bpf")


def test_one_change_seen_by_the_kprobe_and_the_poll_is_counted_once():
    s = Stream()
    s.snapshot(0, mem=4 * GiB)
    _kprobes(s)
    _managed(s, 1.0, PAGES_32M, what=VIRTIO_MEM)
    _managed(s, 1.5, PAGES_32M, source="managed_pages", what=VIRTIO_MEM)
    assert s.correlator._ledger.transitions[(MEM, Direction.ONLINE, Result.SUCCESS)] == 1
    s.tick(10.0)
    [ep] = s.ended()
    assert ep.outcome is Outcome.KERNEL_ONLY
    assert ep.detail.endswith("(virtio-mem: +32 MiB)")


def test_the_polls_extra_changes_do_not_swallow_the_kprobes_next_one():
    """The lab (ci16): the poll had reported a change the kprobes did not (a block's pages read
    as moving) and half of a flap; counted per source with the largest kept, the kprobes' next
    virtio-mem plug was taken for a duplicate and was in no episode. With the kprobes attached,
    theirs are the changes believed."""
    s = Stream()
    s.snapshot(0, mem=4 * GiB)
    _kprobes(s)
    _managed(s, 1.0, 6 * 4 * PAGES_32M, source="managed_pages", what=VIRTIO_MEM)  # false
    _managed(s, 20.0, PAGES_32M, source="managed_pages", what=VIRTIO_MEM)  # a flap's half
    _managed(s, 20.1, -PAGES_32M, what=VIRTIO_MEM)
    s.tick(40.0)
    _managed(s, 60.0, PAGES_32M, what=VIRTIO_MEM)  # the plug
    s.tick(100.0)
    plugs = [ep for ep in s.ended() if "virtio-mem: +32 MiB" in ep.detail]
    assert len(plugs) == 1, [ep.detail for ep in s.ended()]
    assert not any("+768 MiB" in ep.detail for ep in s.ended())
    ledger = s.correlator._ledger
    assert ledger.transitions[(MEM, Direction.ONLINE, Result.SUCCESS)] == 1
    assert ledger.transitions[(MEM, Direction.OFFLINE, Result.SUCCESS)] == 1


def test_without_the_kprobes_the_polls_changes_are_taken():
    """Where the managed-page programs did not attach (or one detached), the poll is all there
    is: its changes are counted and make episodes."""
    for attached in (None, False):
        s = Stream()
        s.snapshot(0, mem=4 * GiB)
        if attached is not None:
            _kprobes(s, attached)
        _managed(s, 1.0, PAGES_32M, source="managed_pages", what=VIRTIO_MEM)
        s.tick(30.0)
        [ep] = s.ended()
        assert ep.detail.endswith("(virtio-mem: +32 MiB)")
        assert s.correlator._ledger.transitions[(MEM, Direction.ONLINE, Result.SUCCESS)] == 1


def test_a_managed_change_is_no_block_to_replay_at_restart_nor_a_hotplug_duration():
    """Unit -1 is no memory block: replaying the journal at a restart must not put a block -1
    online (a 'change while down' against sysfs), and a balloon filling for seconds is no
    sample of the kernel's hotplug duration."""
    from exporter.correlate.down_changes import changes_while_down, state_at_stop
    from exporter.correlate.ledger import KernelLedger
    from exporter.events import KernelSnapshot
    snap = KernelSnapshot(T0, frozenset({0}), frozenset(), frozenset({0}), frozenset({0}),
                          128 << 20, frozenset({8}), frozenset(), 1 << 30, 0)
    grew = Transition("bpf", MEM, MANAGED_UNIT, Direction.ONLINE, Result.SUCCESS, end=T0 + 1,
                      start=T0 + 0.5, nr_pages=PAGES_32M, mechanism=VIRTIO_MEM)
    before = state_at_stop([snap, grew])
    assert before is not None and before.memory_blocks_online == {8}
    assert changes_while_down(before, snap) == {}
    ledger = KernelLedger()
    assert ledger.handle(grew)
    assert ledger.transitions == {(MEM, Direction.ONLINE, Result.SUCCESS): 1}
    assert ledger.durations == {}


def test_the_programs_the_ledger_believes_are_the_bpf_sources_managed_page_probes():
    from exporter.sources.kernel.bpf.programs import MANAGED_PROBES
    assert set(MANAGED_PAGE_PROGRAMS) == set(MANAGED_PROBES)
