"""The real kernel end to end: hotplug cpu1 and memory blocks under a running exporter and read
what its /metrics says over HTTP. Runs as root; under CI=true a skip here is a failure."""
import errno
import os
import time

import pytest

from testkit.exporter_proc import RunningExporter

pytestmark = pytest.mark.kernel

TX = "node_resize_kernel_transitions_total"
DUR = "node_resize_kernel_transition_duration_seconds_count"
N = 3


def tx(scrape, resource, direction, result="success"):
    return scrape.value(TX, resource=resource, direction=direction, result=result)


def cycle_cpu(exp, cpu, n, wait_each=False):
    """Offline and online cpu1 n times; with wait_each, wait until the exporter saw each step
    (a sysfs-only exporter sees only what its timer catches)."""
    for i in range(n):
        for on, direction in ((False, "offline"), (True, "online")):
            cpu.set_online(on)
            if wait_each:
                exp.wait_for(lambda s: tx(s, "cpu", direction) == i + 1)
            else:
                time.sleep(0.05)


@pytest.mark.parametrize("source,args,durations,wait_each", [
    ("bpf", ["--source", "bpf"], True, False),
    ("uevent", ["--source", "uevent"], False, False),
    ("sysfs", ["--source", "sysfs", "--sysfs-interval", "0.1"], False, True),
    ("auto", [], True, False),
])
def test_cpu1_cycles_counted_exactly_once_per_source(cpu1, source, args, durations, wait_each):
    with RunningExporter(*args) as exp:
        # /healthz answers once the source threads started, not once the agent has taken
        # their first events: sysfs says it is up from its own thread.
        before = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                                source="sysfs") == 1)
        assert tx(before, "cpu", "offline") == 0 and tx(before, "cpu", "online") == 0
        cycle_cpu(exp, cpu1, N, wait_each)
        # Durations come only from BPF, on its own thread: under auto the uevent copy can
        # complete the counts first, so wait for the BPF copies too.
        after = exp.wait_for(lambda s: tx(s, "cpu", "online") >= N
                             and s.value("node_resize_kernel_cpus", state="online") == 2
                             and (not durations or (
                                 s.value(DUR, 0, resource="cpu", direction="offline") >= N
                                 and s.value(DUR, 0, resource="cpu", direction="online") >= N)),
                             timeout=30)
        time.sleep(0.5)  # late duplicates (uevent after BPF, sysfs re-read) must not count
        after = exp.scrape()
        assert tx(after, "cpu", "offline") == N
        assert tx(after, "cpu", "online") == N
        assert after.value("node_resize_kernel_cpus", state="offline") == 0
        assert after.value("node_resize_kernel_capacity", resource="cpu", unit="core") == 2
        if durations:
            assert after.value(DUR, resource="cpu", direction="offline") == N
            assert after.value(DUR, resource="cpu", direction="online") == N
            total = after.value("node_resize_kernel_transition_duration_seconds_sum",
                                resource="cpu", direction="offline")
            assert 0 < total / N < 1.0  # ~6-33 ms each here; a second would be absurd
        else:
            assert after.value(DUR, resource="cpu", direction="offline") is None
        if source != "auto":
            # the chosen event source, the sysfs reconciler, and the state readers that run
            # whatever --source says (not --source choices)
            expected = {source, "sysfs", "memory_auto_online", "paravirt_memory"}
            assert {dict(k)["source"] for k in after.series("node_resize_exporter_source_up")} \
                == expected


def test_cpu1_goes_offline_in_the_gauges(cpu1):
    with RunningExporter() as exp:
        cpu1.set_online(False)
        s = exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="online") == 1)
        assert s.value("node_resize_kernel_cpus", state="offline") == 1
        assert s.value("node_resize_kernel_capacity", resource="cpu", unit="core") == 1
        cpu1.set_online(True)
        exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="online") == 2)


def test_refused_cpu_offline_is_a_failed_transition(cpu1):
    """The kernel's own fault injection (hotplug/fail) makes a cpuhp step fail: a real refusal
    and rollback. BPF records it with the state; nothing else changes."""
    with RunningExporter() as exp:
        cpu1.fail_next(235)  # sched:active here; any state with a teardown callback works
        assert cpu1.try_set_online(False) == errno.EAGAIN
        s = exp.wait_for(lambda s: tx(s, "cpu", "offline", "failed") == 1)
        assert tx(s, "cpu", "offline") == 0
        assert s.value("node_resize_kernel_cpus", state="online") == 2
        # After the refusal, ordinary transitions are still seen (the rollback was swallowed).
        cpu1.set_online(False)
        cpu1.set_online(True)
        # The count can come from the uevent copy before BPF's record (the only one with a
        # duration) is read: wait for that record too.
        s = exp.wait_for(lambda s: tx(s, "cpu", "online") == 1
                         and s.value(DUR, 0, resource="cpu", direction="online") == 1)
        assert tx(s, "cpu", "offline") == 1 and tx(s, "cpu", "offline", "failed") == 1
        assert s.value(DUR, resource="cpu", direction="offline") == 2


def test_memory_block_offline_online(memory_block):
    with RunningExporter() as exp:
        s0 = exp.wait_for(_has_snapshot)
        mem0 = s0.value("node_resize_kernel_capacity", resource="memory", unit="byte")
        blocks0 = s0.value("node_resize_kernel_memory_blocks", state="online")
        block_bytes = int(open("/sys/devices/system/memory/block_size_bytes").read(), 16)
        memory_block.set_online(False)
        s = exp.wait_for(lambda s: tx(s, "memory", "offline") == 1
                         and s.value("node_resize_kernel_memory_blocks", state="offline") == 1)
        assert s.value("node_resize_kernel_capacity", resource="memory", unit="byte") == \
            mem0 - block_bytes
        assert s.value("node_resize_kernel_memory_blocks", state="online") == blocks0 - 1
        assert s.value("node_resize_kernel_memory_blocks_bytes") == (blocks0 - 1) * block_bytes
        memory_block.set_online(True)
        s = exp.wait_for(lambda s: tx(s, "memory", "online") == 1
                         and s.value("node_resize_kernel_memory_blocks", state="offline") == 0)
        assert s.value("node_resize_kernel_capacity", resource="memory", unit="byte") == mem0
        time.sleep(0.5)
        s = exp.scrape()
        assert tx(s, "memory", "offline") == 1 and tx(s, "memory", "online") == 1


def test_refused_memory_offline_leaves_every_gauge_right(refused_memory_block):
    with RunningExporter("--sysfs-interval", "0.2") as exp:
        s0 = exp.wait_for(_has_snapshot)
        assert refused_memory_block.try_offline() != 0
        time.sleep(1.0)  # several reconciles
        s = exp.scrape()
        for name, labels in [
            ("node_resize_kernel_capacity", {"resource": "memory", "unit": "byte"}),
            ("node_resize_kernel_memory_blocks", {"state": "online"}),
            ("node_resize_kernel_memory_blocks", {"state": "offline"}),
            ("node_resize_kernel_memory_blocks_bytes", {}),
        ]:
            assert s.value(name, **labels) == s0.value(name, **labels), name
        assert tx(s, "memory", "offline") == 0
        assert refused_memory_block.state() == "online"


def test_sigterm_stops_cleanly_and_detaches_bpf():
    exp = RunningExporter().start()
    try:
        pid = exp.proc.pid
        # Said by the BPF source's thread after /healthz may already answer: wait for it.
        exp.wait_for(
            lambda s: (
                s.value("node_resize_exporter_bpf_program_attached", program="cpuhp_exit") == 1
            )
        )
        # While running, the process holds BPF program fds (anon_inode:bpf-prog).
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert any("bpf-prog" in f for f in fds)
    finally:
        code = exp.stop()
        logs = exp.logs()
        exp.tmp.cleanup()
    assert code == 0, logs
    assert "stopped" in logs


def test_running_exporter_maps_no_llvm_and_holds_every_attachment(cpu1):
    """bcc compiles in a loader child that exits (sources/kernel/bpf/loader.py): the running
    exporter has no LLVM, clang or bcc mapped, no child left, and holds the perf events the
    tracepoint programs are attached through, so transitions still arrive through BPF."""
    with RunningExporter("--source", "bpf") as exp:
        pid = exp.proc.pid
        maps = open(f"/proc/{pid}/maps").read()
        for lib in ("libLLVM", "libclang", "libbcc"):
            assert lib not in maps, lib
        children = "".join(
            open(f"/proc/{pid}/task/{t}/children").read() for t in os.listdir(f"/proc/{pid}/task")
        )
        assert children.strip() == ""
        links = _fd_links(pid)
        assert sum("perf_event" in f for f in links) >= 3  # cpuhp_enter, multi_enter, exit
        assert sum("bpf-map" in f for f in links) >= 2  # records, lost
        cpu1.set_online(False)
        cpu1.set_online(True)
        s = exp.wait_for(lambda s: s.value(DUR, resource="cpu", direction="online") == 1)
        assert s.value(DUR, resource="cpu", direction="offline") == 1


def test_a_flap_storm_counts_every_transition_once_with_its_duration(cpu1):
    """Fast flapping puts the BPF source into batched reads (>= 10 wake-ups within a second:
    records read every 100 ms, sources/kernel/bpf/source.py); no transition is lost or doubled, and
    each keeps its kernel duration."""
    cycles = 15
    with RunningExporter("--source", "bpf") as exp:
        for _ in range(cycles):
            cpu1.set_online(False)
            cpu1.set_online(True)
        exp.wait_for(lambda s: tx(s, "cpu", "online") >= cycles)
        time.sleep(0.5)  # a late duplicate must not count
        s = exp.scrape()
        assert tx(s, "cpu", "offline") == cycles and tx(s, "cpu", "online") == cycles
        assert s.value(DUR, resource="cpu", direction="offline") == cycles
        assert s.value(DUR, resource="cpu", direction="online") == cycles
        assert s.value("node_resize_exporter_events_lost_total", source="bpf") == 0


def _has_snapshot(scrape) -> bool:
    """The sysfs reconciler's first read has reached the gauges. /healthz answers as soon as
    the source threads started, before the agent took their first events."""
    return scrape.value("node_resize_kernel_capacity", resource="memory", unit="byte") is not None


def _fd_links(pid: int) -> list[str]:
    """What each open fd of `pid` points at. An fd closed between the listing and the
    readlink (a scrape's socket, a sysfs read) is simply gone: skip it."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            continue
    return links
