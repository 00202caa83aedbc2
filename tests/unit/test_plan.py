"""The pure planner: which CPUs and memory blocks it takes, what it expects the kernel to
refuse, the pods and containers the change would hurt, the kubelet's restart after it."""
from __future__ import annotations

from collections import Counter

import pytest

from exporter.correlate.running_pods_view import RunningPodsView
from exporter.events import (
    ContainerCgroup,
    ContainerSizing,
    CpuManagerCheckpoint,
    MemoryManagerCheckpoint,
    RunningContainers,
)
from exporter.plan.model import BadChange, Change, parse_change
from exporter.plan.pages import (
    KPF_BUDDY,
    KPF_LRU,
    KPF_NOPAGE,
    KPF_PGTABLE,
    KPF_RESERVED,
    KPF_SLAB,
    count_pages,
)
from exporter.plan.planner import Inputs, judge_block, plan
from exporter.sources.kernel.memory_blocks import HotplugHardware, MemoryBlock
from exporter.sources.kernel.memory_devices import MemoryDevice, MemoryDevices
from testkit.forecast import GiB, MiB, T, forecaster, node, pod, snapshot

BLOCK = 128 * MiB
PAGES = BLOCK // 4096


def block(n: int, zone: str = "Normal", *, online: bool = True, **kinds: int) -> MemoryBlock:
    """A block whose pages are `kinds` (free, lru, slab, pgtable, reserved, other, hole)."""
    bits = {"free": KPF_BUDDY, "lru": KPF_LRU, "slab": KPF_SLAB, "pgtable": KPF_PGTABLE,
            "reserved": KPF_RESERVED, "other": 0, "hole": KPF_NOPAGE}
    flags = None
    if kinds:
        flags = Counter({bits[k]: v for k, v in kinds.items()})
        flags[KPF_BUDDY] += PAGES - sum(kinds.values())
    return MemoryBlock(n, online, (zone,), True, flags)


def devices(numbers, dimms=None) -> MemoryDevices:
    """Blocks below 4 GiB are boot memory, `dimms` (id -> block range) DIMMs, the rest one
    virtio-mem device (which gives blocks one at a time)."""
    dimms, numbers = dimms or {}, sorted(numbers)
    out, owner = [], {}
    for name, r in dimms.items():
        mine = tuple(n for n in numbers if n in r)
        out.append(MemoryDevice(name, "dimm", mine, r.start * BLOCK, len(r) * BLOCK,
                                len(r) * BLOCK, slot=len(out)))
        owner.update({n: name for n in mine})
    rest = [n for n in numbers if n not in owner]
    virtio = tuple(n for n in rest if n * BLOCK >= 4 * GiB)
    if virtio:
        out.append(MemoryDevice("virtio0", "virtio-mem", virtio, 4 * GiB, 64 * GiB,
                                len(virtio) * BLOCK, device_block_size=2 * MiB))
        owner.update({n: "virtio0" for n in virtio})
    boot = tuple(n for n in rest if n * BLOCK < 4 * GiB)
    if boot:
        out.append(MemoryDevice("boot", "boot", boot, 0, len(boot) * BLOCK, len(boot) * BLOCK))
    return MemoryDevices(tuple(out), owner, {}, BLOCK)


def hardware(*blocks: MemoryBlock, hotpluggable=frozenset({1}), dimms=None,
             available: int | None = 6 * GiB, auto_online="offline") -> HotplugHardware:
    return HotplugHardware(hotpluggable, BLOCK, tuple(blocks), auto_online,
                           devices=devices([b.number for b in blocks], dimms),
                           mem_available=available)


def inputs(hw: HotplugHardware, cpus: int = 2, memory: int = 8 * GiB, **kw) -> Inputs:
    """A host with no kubelet (nothing of Kubernetes to read) unless `kw` says otherwise."""
    snap = snapshot(cpus, memory)
    online = frozenset(b.number for b in hw.blocks if b.online)
    offline = frozenset(b.number for b in hw.blocks if not b.online)
    from dataclasses import replace
    snap = replace(snap, memory_blocks_online=online, memory_blocks_offline=offline)
    kw.setdefault("no_kubelet", not {"forecast", "running", "cpu_checkpoint",
                                     "memory_checkpoint"} & set(kw))
    return Inputs(snap, hw, **kw)


# ---------------------------------------------------------------- the change


@pytest.mark.parametrize("cpu, memory, want", [
    ("-2", None, Change(-2, 0)), ("+1", "-4Gi", Change(1, -4 * GiB)),
    (None, "+512Mi", Change(0, 512 * MiB)), ("", "-134217728", Change(0, -BLOCK)),
])
def test_changes_parse(cpu, memory, want):
    assert parse_change(cpu, memory) == want


@pytest.mark.parametrize("cpu, memory, fix", [
    ("1.5", None, "no fractions"), ("2", None, "with its sign"), (None, "-1Qi", "not a size"),
    (None, None, "no change given"), ("-0", None, "the change is zero"),
    (None, "4Gi", "a size with its sign"), ("-99999999", None, "with its sign"),
])
def test_bad_changes_name_the_fix(cpu, memory, fix):
    with pytest.raises(BadChange, match=fix):
        parse_change(cpu, memory)


# ---------------------------------------------------------------- memory blocks


def test_page_kinds_are_counted_by_flag():
    pages = count_pages({KPF_BUDDY: 10, KPF_LRU | (1 << 14): 5, KPF_SLAB: 2, KPF_PGTABLE: 3,
                         KPF_RESERVED | KPF_LRU: 1, 0: 4, KPF_NOPAGE: 6, 1 << 17: 7})
    assert (pages.free, pages.lru, pages.slab, pages.page_tables, pages.reserved, pages.other,
            pages.holes) == (10, 5 + 7, 2, 3, 1, 4, 6)
    assert pages.unmovable == 2 + 3 + 1 + 4


@pytest.mark.parametrize("b, ok, reason", [
    (block(50, "Movable"), True, ""),
    (MemoryBlock(50, True, ("none",)), False, "spans_zones"),
    (MemoryBlock(50, True, ("DMA", "DMA32")), False, "dma"),
    (block(5, "Movable"), False, "dma"),  # below 4 GiB, whatever its zone
    (MemoryBlock(50, True, ()), False, "zones_not_read"),  # not "spans zones"
    (block(50), False, "pages_not_read"),
    (block(50, lru=100), True, ""),
    (block(50, pgtable=1), False, "unmovable_pages"),
    (block(50, other=PAGES), False, "unmovable_pages"),
    (block(50, hole=10), False, "holes"),
])
def test_a_block_is_judged_by_its_zone_and_pages(b, ok, reason):
    verdict = judge_block(b, b.page_flags, BLOCK)
    assert (verdict.ok, verdict.reason) == (ok, reason)


def test_memory_is_taken_movable_first_then_the_least_used_and_never_unmovable():
    hw = hardware(block(1, "DMA32", lru=0), block(40, lru=500), block(41, lru=10),
                  block(42, slab=1), block(60, "Movable"), MemoryBlock(0, True, ("none",)))
    p = plan(Change(0, -3 * BLOCK), inputs(hw))
    assert p.memory_take == (60, 41, 40)
    assert p.memory_bytes == 3 * BLOCK and p.safe and p.verdict == "safe"
    assert p.capacity_after["memory"] == 8 * GiB - 3 * BLOCK
    assert p.memory_move_bytes == 510 * 4096
    # Boot memory (below 4 GiB, DMA32 or not) is never taken: short, with the reasons.
    p = plan(Change(0, -6 * BLOCK), inputs(hw))
    assert p.memory_take == (60, 41, 40)
    assert p.memory_short_bytes == 3 * BLOCK and p.verdict == "harmful"
    assert {(r.unit, r.reason) for r in p.refusals} == {(42, "unmovable_pages"),
                                                       (0, "boot_memory")}


def test_a_dimm_goes_whole_or_the_answer_names_the_blocks_that_keep_it():
    dimms = {"PNP0C80:00": range(40, 44), "PNP0C80:01": range(48, 52)}
    hw = hardware(*(block(n, lru=1) for n in range(40, 44)), block(48, "Movable"),
                  block(49, "Movable"), block(50, pgtable=3), block(51, "Movable"),
                  dimms=dimms)
    p = plan(Change(0, -BLOCK), inputs(hw))  # one block asked: the whole DIMM it is in
    assert p.memory_take == (43, 42, 41, 40) and p.safe
    assert [(d.id, d.blocks, d.bytes, d.whole) for d in p.memory_devices] == \
        [("PNP0C80:00", (40, 41, 42, 43), 4 * BLOCK, True)]
    assert any("a DIMM goes whole" in n for n in p.notes)
    p = plan(Change(0, -6 * BLOCK), inputs(hw))
    assert p.memory_take == (43, 42, 41, 40) and p.memory_short_bytes == 2 * BLOCK
    kept = [r for r in p.refusals if r.reason == "device_kept"]
    assert [(r.unit, "PNP0C80:01" in r.detail, "memory50" in r.detail) for r in kept] == \
        [(50, True, True)]


def test_pages_to_move_must_fit_in_what_stays():
    hw = hardware(*(block(n, "Movable") for n in range(40, 48)), available=1 * GiB)
    p = plan(Change(0, -4 * BLOCK), inputs(hw))  # 512 MiB of 1 GiB: the margin holds
    assert p.safe and p.memory_available_after == GiB - 4 * BLOCK
    p = plan(Change(0, -7 * BLOCK), inputs(hw))
    assert p.verdict == "harmful" and "cannot hold what moves" in p.harm[0]
    p = plan(Change(0, -BLOCK), inputs(hardware(block(40, "Movable"), available=None)))
    assert p.verdict == "unknown" and any("MemAvailable" in u for u in p.unjudged)


def test_page_flags_are_read_only_until_enough_blocks_can_go_and_within_the_budget():
    hw = hardware(*(block(n) for n in range(110, 120)))
    read: list[int] = []

    def flags(n: int):
        read.append(n)
        return Counter({KPF_BUDDY: PAGES}) if n % 2 else Counter({KPF_SLAB: PAGES})

    p = plan(Change(0, -2 * BLOCK), inputs(hw), flags, page_budget=100)
    assert p.memory_take == (119, 117) and read == [119, 118, 117]
    read.clear()
    # The budget ends before enough is found: the rest is "not read", never "cannot".
    p = plan(Change(0, -2 * BLOCK), inputs(hw), flags, page_budget=2)
    assert read == [119, 118] and p.memory_take == (119,) and p.memory_short_bytes == 0
    assert p.verdict == "unknown" and any("page flags" in u for u in p.unjudged)
    assert p.inputs["page_flags"].startswith("8 blocks of removable devices not read")


def test_a_size_that_is_not_whole_blocks_takes_whole_blocks_and_says_so():
    p = plan(Change(0, -BLOCK - 1), inputs(hardware(block(107, "Movable"),
                                                    block(108, "Movable"))))
    assert p.memory_blocks_needed == 2 and p.memory_bytes == 2 * BLOCK
    assert any("blocks of" in n for n in p.notes)


def test_more_than_the_machine_is_harmful_with_the_most():
    p = plan(Change(-2, 0), inputs(hardware()))
    assert p.verdict == "harmful" and "take at most 1" in p.harm[0]
    p = plan(Change(0, -8 * GiB), inputs(hardware()))
    assert p.verdict == "harmful" and "the machine has 8Gi" in p.impossible


def test_a_memory_hot_add_onlines_offline_blocks_and_advises_movable():
    hw = hardware(block(70, "Normal", online=False), block(71, "Normal", online=False),
                  auto_online="online")
    p = plan(Change(0, 2 * BLOCK), inputs(hw, no_kubelet=False, not_read={}))
    assert p.memory_add == (70, 71)
    assert p.capacity_after["memory"] == 8 * GiB + 2 * BLOCK
    assert any("online_movable" in n for n in p.notes)
    assert not p.kubelet_picks_up_without_restart
    assert any("restart the kubelet" in s for s in p.steps)
    assert [(a.do, a.path, a.value) for a in p.actions if a.do == "write"] == [
        ("write", "/sys/devices/system/memory/memory70/state", "online_movable"),
        ("write", "/sys/devices/system/memory/memory71/state", "online_movable")]
    # More than is present: only the hypervisor knows whether it can add it. Not safe.
    p = plan(Change(0, 1 << 40), inputs(hw))
    assert any("hypervisor must add" in n for n in p.notes)
    assert p.verdict == "unknown" and any("cannot see how much" in u for u in p.unjudged)


# ---------------------------------------------------------------- CPUs


def test_cpu0_without_an_online_file_is_never_taken():
    hw = hardware(hotpluggable=frozenset({1, 2, 3}))
    p = plan(Change(-2, 0), inputs(hw, cpus=4))
    assert p.cpu_take == (3, 2) and p.safe
    hw = hardware(hotpluggable=frozenset({2, 3}))
    p = plan(Change(-3, 0), inputs(hw, cpus=4))
    assert p.cpu_take == (3, 2) and p.cpu_short == 1 and not p.safe
    assert [(r.unit, r.reason) for r in p.refusals] == [(0, "no_online_file"),
                                                        (1, "no_online_file")]


def _running(snap, containers, pods=(), checkpoint=None) -> RunningPodsView:
    view = RunningPodsView()
    for event in (snap, RunningContainers(T, 2, tuple(containers)), *pods):
        view.handle(event)
    if checkpoint is not None:
        view.handle(checkpoint)
    return view


def test_an_exclusively_pinned_cpu_is_taken_last_and_named_when_it_must_go():
    hw = hardware(hotpluggable=frozenset({1, 2, 3}))
    snap = snapshot(4, possible=4)
    cp = CpuManagerCheckpoint(T, "/var/lib/kubelet/cpu_manager_state", True, "static",
                              frozenset({0, 1, 2}), frozenset({3}))
    pinned = ContainerCgroup("uid-g", "c" * 64, "guaranteed", cpus=frozenset({3}))
    shared = ContainerCgroup("uid-b", "d" * 64, "burstable", cpus=frozenset({0, 1, 2}))
    running = _running(snap, [pinned, shared], checkpoint=cp)
    ins = Inputs(snap, hw, running=running, cpu_checkpoint=cp)
    p = plan(Change(-1, 0), ins)
    assert p.cpu_take == (2,)
    assert p.stale_containers == ()
    p = plan(Change(-3, 0), ins)
    assert p.cpu_take == (2, 1, 3)
    assert [(c.pod, c.kind) for c in p.stale_containers] == [("uid-g", "cpuset_exclusive")]
    # The static checkpoint names the CPUs that go: no restart until it is deleted.
    assert not p.kubelet_restarts and "offline" in p.kubelet_problem
    assert any("delete /var/lib/kubelet/cpu_manager_state" in s for s in p.steps)


def test_limits_above_the_new_capacity_are_stale_and_existing_findings_are_not_the_changes():
    hw = hardware(block(90, "Movable"), hotpluggable=frozenset({1, 2, 3}))
    snap = snapshot(4, memory=8 * GiB, possible=4)
    from dataclasses import replace
    snap = replace(snap, memory_blocks_online=frozenset({90}))
    big = ContainerCgroup("uid-a", "a" * 64, "burstable", cpu_limit=4.0,
                          memory_limit=8 * GiB - 64 * MiB)
    old = ContainerCgroup("uid-b", "b" * 64, "burstable", cpu_limit=5.0)  # stale already
    p = plan(Change(-1, -BLOCK), Inputs(snap, hw, running=_running(snap, [big, old])))
    assert sorted(c.kind for c in p.stale_containers) == ["cpu_limit_above_online",
                                                         "memory_limit_above_capacity"]
    assert {c.pod for c in p.stale_containers} == {"uid-a"}
    assert not p.safe


def test_a_burstable_oom_score_from_the_old_memory_is_stale_after_a_memory_change():
    hw = hardware(*(block(n, "Movable") for n in range(40, 72)))
    snap = snapshot(2, memory=8 * GiB)
    from dataclasses import replace

    from exporter.events import PodStatus
    snap = replace(snap, memory_blocks_online=frozenset(range(40, 72)))
    request = 2 * GiB
    adj = 1000 - 1000 * request // (8 * GiB)
    status = PodStatus(T, "uid-m", "default", "mem", "Running", "", True, qos_class="Burstable",
                       containers=(ContainerSizing("app", "e" * 64, request),))
    cg = ContainerCgroup("uid-m", "e" * 64, "burstable", oom_score_adj=adj)
    p = plan(Change(0, -4 * GiB), Inputs(snap, hw, running=_running(snap, [cg], [status])))
    assert [(c.pod, c.container, c.kind) for c in p.stale_containers] == \
        [("mem", "app", "oom_score_adj")]


def test_a_static_memory_manager_will_not_restart_on_other_memory():
    hw = hardware(block(90, "Movable"))
    mp = MemoryManagerCheckpoint(T, "/var/lib/kubelet/memory_manager_state", True, "Static",
                                 {"memory": 8 * GiB})
    p = plan(Change(0, -BLOCK), inputs(hw, memory_checkpoint=mp))
    assert not p.kubelet_restarts and "memory manager" in p.kubelet_problem


# ---------------------------------------------------------------- the forecast, same code


def test_the_forecast_runs_on_the_hypothetical_kernel_and_is_given_back():
    f = forecaster(node(cpu="2", allocatable_cpu="1"), snapshot(2),
                   [pod("a", {"cpu": "500m"}, created="08:00:00"),
                    pod("b", {"cpu": "500m"}, created="08:00:01")], static=True)
    ins = Inputs(snapshot(2), hardware(), forecast=f)
    p = plan(Change(-1, 0), ins)
    assert [(r.name, r.reason) for r in p.rejected_pods] == [("a", "OutOfcpu"),
                                                             ("b", "OutOfcpu")]
    assert p.rejected_now == 0 and p.harm[0].startswith("2 pods rejected")
    assert all(r.uid for r in p.rejected_pods)
    assert f.result() is not None and f.result().rejected_total == 0  # the real kernel again
    assert plan(Change(1, 0), Inputs(snapshot(1), hardware(), forecast=f)).cpu_add == (1,)


def test_the_unpluggable_cpus_honour_the_kubelets_checkpoint():
    """Issue 38: the gauge promised no harm while a static CPU manager checkpoint names every
    CPU (the kubelet would not restart after any CPU goes): it is the plan's own verdict."""
    from exporter.plan.planner import unpluggable
    hw = hardware(hotpluggable=frozenset({1, 2, 3}))
    none = CpuManagerCheckpoint(T, "/var/lib/kubelet/cpu_manager_state", True, "none")
    static = CpuManagerCheckpoint(T, "/var/lib/kubelet/cpu_manager_state", True, "static",
                                  frozenset({0, 1, 2, 3}))
    mp = MemoryManagerCheckpoint(T, "/var/lib/kubelet/memory_manager_state", False)
    for cp, want in ((none, 3), (static, 0)):
        ins = inputs(hw, cpus=4, cpu_checkpoint=cp, memory_checkpoint=mp, no_kubelet=True)
        assert unpluggable(ins, [])[0] == want
