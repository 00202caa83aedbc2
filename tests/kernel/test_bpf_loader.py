"""The BPF loader child (exporter/sources/kernel/bpf/loader.py) and the libbpf binding, on the real
kernel: what it hands over, what it says when bcc refuses, and that this process never maps
LLVM. Runs as root (loading BPF); under CI=true a skip here is a failure."""
from __future__ import annotations

import os

import pytest

from exporter.sources.kernel.bpf import libbpf
from exporter.sources.kernel.bpf import programs as bpf
from exporter.sources.kernel.bpf.loader import LoadError, _unpack, load
from exporter.sources.kernel.sysfs import parse_hotplug_states

pytestmark = pytest.mark.kernel


def _program():
    states = parse_hotplug_states(open("/sys/devices/system/cpu/hotplug/states").read())
    return bpf.program_text(), bpf.program_cflags(states, 8)


def test_the_child_hands_over_maps_programs_and_attachments():
    text, cflags = _program()
    loaded = load(text, cflags, bpf.KPROBES, kprobes_ok=False)
    try:
        assert set(loaded.maps) == {"records", "lost", "managed", "managed_armed"}
        assert set(loaded.links) == {"cpuhp:cpuhp_enter", "cpuhp:cpuhp_multi_enter",
                                     "cpuhp:cpuhp_exit"}
        assert {p for p, (ok, _) in loaded.attached.items() if ok} == set(bpf.CPUHP_PROGRAMS)
        assert loaded.attached["online_pages_enter"] == (False,
                                                         "kernel built without CONFIG_KPROBES")
        for fd in loaded.links.values():
            assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[perf_event]"
        assert libbpf.lookup_u64(loaded.maps["lost"]) == 0
        assert loaded.attached["managed_adjust_enter"][0] is False
        assert libbpf.lookup_s64(loaded.maps["managed"]) == 0
        libbpf.update_u64(loaded.maps["managed_armed"], 1)  # what the source clears
        assert libbpf.lookup_u64(loaded.maps["managed_armed"]) == 1
        with pytest.raises(OSError):  # an array map is not a ring buffer: libbpf says so
            libbpf.RingBuffer(loaded.maps["lost"], lambda data, size: None)
        ring = libbpf.RingBuffer(loaded.maps["records"], lambda data, size: None)
        assert ring.consume() == 0
        ring.close()
        held = [*loaded.maps.values(), *loaded.progs.values(), *loaded.links.values()]
    finally:
        loaded.close()
    for fd in held:  # closed: that is what detaches
        with pytest.raises(OSError):
            os.fstat(fd)
    maps = open("/proc/self/maps").read()
    assert "libLLVM" not in maps and "libbcc" not in maps


def test_a_compile_error_is_reported_with_bccs_message():
    with pytest.raises(LoadError) as e:
        load("this is not C;", [], {}, kprobes_ok=False)
    assert "error" in str(e.value).lower()


def test_a_reply_that_does_not_match_its_fds_is_refused():
    r, w = os.pipe()
    with pytest.raises(LoadError, match="named 2 fds but sent 1"):
        _unpack({"attached": {}, "fds": [["map", "records"], ["map", "lost"]]}, [r])
    os.close(w)
    with pytest.raises(OSError):
        os.fstat(r)  # closed, not leaked
