"""Parsers of what the kernel writes: CPU lists, meminfo, hotplug states, uevent datagrams."""
import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import DeviceChange, Direction, Resource, Result, Transition
from exporter.sources.kernel.bpf.record import (
    HotplugRecord,
    RecordDecoder,
    cpuhp_targets,
    errno_name,
)
from exporter.sources.kernel.sysfs import (
    parse_block_state,
    parse_cpu_list,
    parse_hotplug_states,
    parse_meminfo,
)
from exporter.sources.kernel.uevent import parse_uevent, to_event


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        ("0", {0}),
        ("\n", set()),
        ("1,3", {1, 3}),
        ("0-0", {0}),
    ],
)
def test_cpu_list(text, expected):
    assert parse_cpu_list(text) == frozenset(expected)


@pytest.mark.parametrize("bad", ["3-1", "a", "1-", "-1", "1,,2x"])
def test_cpu_list_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_cpu_list(bad)


def test_meminfo_converts_kb_and_keeps_counts():
    info = parse_meminfo(
        "MemTotal:       24684084 kB\nHugePages_Total:       4\n"
        "Hugepagesize:       2048 kB\nSwapTotal:             0 kB\nbogus line\n"
    )
    assert info == {
        "MemTotal": 24684084 * 1024,
        "HugePages_Total": 4,
        "Hugepagesize": 2 * 1024 * 1024,
        "SwapTotal": 0,
    }


STATES = """  0: offline
  1: threads:prepare
  3: perf/x86/amd/uncore:prepare
 83: cpu:bringup
 85: ap:offline
235: sched:active
236: online
"""


def test_hotplug_states_and_targets():
    states = parse_hotplug_states(STATES)
    assert states[85] == "ap:offline" and states[236] == "online"
    # Down: state 1 has no teardown, so the last callback is the lowest named state above it.
    assert cpuhp_targets(states) == (236, 3)


def test_targets_need_an_online_state():
    with pytest.raises(ValueError):
        cpuhp_targets({0: "offline", 1: "threads:prepare"})


def datagram(header, **env):
    return header.encode() + b"\0" + b"\0".join(f"{k}={v}".encode() for k, v in env.items())


def test_uevent_cpu_offline():
    ev = parse_uevent(
        datagram(
            "offline@/devices/system/cpu/cpu1",
            ACTION="offline",
            DEVPATH="/devices/system/cpu/cpu1",
            SUBSYSTEM="cpu",
            SEQNUM="7",
        )
    )
    assert ev.env["SUBSYSTEM"] == "cpu"
    t = to_event(ev, 5.0)
    assert t == Transition("uevent", Resource.CPU, 1, Direction.OFFLINE, Result.SUCCESS, end=5.0)


def test_uevent_memory_add_is_a_device_change():
    ev = parse_uevent(
        datagram(
            "add@/devices/system/memory/memory40",
            ACTION="add",
            DEVPATH="/devices/system/memory/memory40",
            SUBSYSTEM="memory",
        )
    )
    assert to_event(ev, 1.0) == DeviceChange("uevent", Resource.MEMORY, 40, "add", 1.0)


@pytest.mark.parametrize(
    "header",
    [
        "change@/devices/system/cpu/cpu1",
        "online@/devices/system/cpu/cpufreq",
        "online@/devices/system/cpu/memory3",
        "add@/devices/pci0000:00/0000:00:01.0",
    ],
)
def test_uevents_of_other_devices_are_ignored(header):
    assert to_event(parse_uevent(datagram(header)), 1.0) is None


@pytest.mark.parametrize("raw", [b"", b"no-at-sign\0ACTION=add", b"\xff\xfe@x"])
def test_malformed_uevent_raises_value_error(raw):
    with pytest.raises((ValueError, UnicodeDecodeError)):
        parse_uevent(raw)


def test_record_decoder_memory_block_and_errno():
    clock = MonotonicWallClock()
    dec = RecordDecoder(clock, {}, block_size=128 << 20, page_size=4096)
    rec = HotplugRecord(
        start_ns=1_000_000,
        end_ns=9_000_000,
        pfn=(128 << 20) * 5 // 4096,
        nr_pages=32768,
        kind=2,
        online=0,
        ret=-16,
        failed_state=-1,
    )
    t = dec.decode(rec)
    assert (t.resource, t.unit, t.direction, t.result, t.error) == (
        Resource.MEMORY,
        5,
        Direction.OFFLINE,
        Result.FAILED,
        "EBUSY",
    )
    assert t.duration == pytest.approx(0.008, abs=1e-6)  # wall seconds: ~0.2 us resolution
    assert t.start == pytest.approx(clock.from_ktime_ns(1_000_000))
    assert errno_name(-11) == "EAGAIN" and errno_name(-9999) == "ret=-9999"


def test_record_decoder_names_failed_cpuhp_state():
    dec = RecordDecoder(MonotonicWallClock(), parse_hotplug_states(STATES), 0)
    t = dec.decode(
        HotplugRecord(
            start_ns=1, end_ns=2, kind=1, cpu=1, online=1, ret=-11, failed_state=83, steps=21
        )
    )
    assert t.failed_state == "83 (cpu:bringup)" and t.steps == 21 and t.unit == 1


@pytest.mark.parametrize("text, expected", [
    ("online\n", True), ("offline\n", False),
    # drivers/base/memory.c while offline_pages() runs: still online, and it stays so when
    # the kernel refuses (EBUSY); read as offline it made a flap that never happened.
    ("going-offline\n", True),
    ("ERROR-UNKNOWN-7\n", None), ("", None), ("onlinex", None)])
def test_memory_block_state(text, expected):
    assert parse_block_state(text) is expected


def test_a_block_going_offline_is_online_and_an_unknown_state_left_out(tmp_path):
    from exporter.sources.kernel.memory_blocks import read_hardware
    from exporter.sources.kernel.sysfs import SysfsReader
    mem = tmp_path / "sys/devices/system/memory"
    mem.mkdir(parents=True)
    (mem / "block_size_bytes").write_text("8000000\n")
    for n, state in ((0, "online"), (1, "going-offline"), (2, "offline"), (3, "ERROR-UNKNOWN-9")):
        (mem / f"memory{n}").mkdir()
        (mem / f"memory{n}" / "state").write_text(state + "\n")
    size, online, offline = SysfsReader(str(tmp_path / "sys"), str(tmp_path / "proc")) \
        .memory_blocks()
    assert size == 128 << 20 and online == {0, 1} and offline == {2}
    hw = read_hardware(str(tmp_path / "sys"))  # the plan's read of the same tree
    assert {b.number: b.online for b in hw.blocks} == {0: True, 1: True, 2: False}
    assert "memory block(s) 3" in hw.not_read["kernel"]
