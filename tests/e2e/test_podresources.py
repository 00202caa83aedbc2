"""The podresources client against a real gRPC server on a unix socket (the kubelet's shape)."""
from __future__ import annotations

import grpc
import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import MalformedInput, PodResourcesAllocatable, SourceStatus
from exporter.sources.kubelet.podresources import PodResourcesSource
from exporter.sources.kubelet.proto import podresources_pb2 as pb
from testkit.event_log import EventLog
from testkit.fakes.podresources import Kubelet, Server

SERVICE = "v1.PodResourcesLister"






@pytest.fixture
def sock(tmp_path):
    return str(tmp_path / "kubelet.sock")


@pytest.fixture
def servers():
    started = []
    yield started
    for server in started:
        server.stop()


def test_socket_missing_then_appearing(sock, servers):
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock, timeout=5)
    source.poll(log.emit)
    down = log.of(SourceStatus)[-1]
    assert not down.up and "missing" in down.reason and sock in down.reason
    source.poll(log.emit)  # still missing: no second status event
    assert len(log.of(SourceStatus)) == 1

    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(
        cpu_ids=[0, 1],
        memory=[pb.ContainerMemory(memory_type="memory", size=8 << 30),
                pb.ContainerMemory(memory_type="hugepages-2Mi", size=1 << 30)])
    servers.append(Server(sock, servicer=kubelet))
    source.poll(log.emit)
    assert log.of(SourceStatus)[-1].up
    event = log.of(PodResourcesAllocatable)[-1]
    assert event.cpu_ids == {0, 1}
    assert event.memory_bytes == {"memory": 8 << 30, "hugepages-2Mi": 1 << 30}
    source.poll(log.emit)  # unchanged: not emitted again
    assert len(log.of(PodResourcesAllocatable)) == 1
    assert kubelet.calls == 2

    kubelet.answer = pb.AllocatableResourcesResponse()  # policy "none": nothing reported
    source.poll(log.emit)
    empty = log.of(PodResourcesAllocatable)[-1]
    assert empty.cpu_ids is None and empty.memory_bytes == {}
    source.close()


def test_an_answer_that_is_not_the_proto(sock, servers):
    def garbage(request, context):
        return b"\x0f\xff\xff not a protobuf"

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(garbage)})
    servers.append(Server(sock, handler=handler))
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock)
    source.poll(log.emit)
    bad = log.of(MalformedInput)
    assert len(bad) == 1 and "not the podresources v1 proto" in bad[0].detail
    assert log.of(PodResourcesAllocatable) == []
    source.close()


def test_kubelet_without_the_method_is_down(sock, servers):
    handler = grpc.method_handlers_generic_handler(SERVICE, {})
    servers.append(Server(sock, handler=handler))
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock)
    source.poll(log.emit)
    down = log.of(SourceStatus)[-1]
    assert not down.up and "GetAllocatableResources" in down.reason
    source.close()


def test_not_a_socket(tmp_path):
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    log = EventLog()
    PodResourcesSource(MonotonicWallClock(), socket_path=str(path)).poll(log.emit)
    assert "not a unix socket" in log.of(SourceStatus)[-1].reason


def test_runs_as_a_thread_and_stops(sock, servers):
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[1])
    servers.append(Server(sock, servicer=kubelet))
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock, interval=0.05)
    source.start(log.emit)
    try:
        assert log.wait_for(PodResourcesAllocatable).cpu_ids == {1}
    finally:
        source.stop()
    assert not source._thread.is_alive()


# ------------------------------------------------------------ Amplification


def _possible(tmp_path, text: str = "0-3") -> str:
    root = tmp_path / "sys"
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/possible").write_text(text + "\n")
    return str(root)


def test_ids_the_kernel_cannot_have_are_dropped_and_counted_once(sock, servers, tmp_path):
    """100k negative ids made 272,033 events in 20 s: now one MalformedInput per distinct bad
    answer, and the event holds only ids in /sys/devices/system/cpu/possible."""
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(
        cpu_ids=[0, 1, 2, 99, 4096] + list(range(-100_000, 0)))
    servers.append(Server(sock, servicer=kubelet))
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock,
                                sysfs_root=_possible(tmp_path, "0-3"))
    for _ in range(5):
        source.poll(log.emit)
    assert kubelet.calls == 5
    assert [e.cpu_ids for e in log.of(PodResourcesAllocatable)] == [{0, 1, 2}]
    bad = log.of(MalformedInput)
    assert len(bad) == 1, [b.detail for b in bad]  # the same bad answer, counted once
    assert "100002 CPU id(s) the kernel cannot have (possible: 0-3) dropped: -100000" in \
        bad[0].detail
    assert len(bad[0].detail) < 300
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1, 2, -7])  # a new bad answer
    source.poll(log.emit)
    assert len(log.of(MalformedInput)) == 2
    source.close()


def test_a_huge_answer_is_refused_by_size(sock, servers, tmp_path):
    """1M changing CPU ids grew the journal by 162 MiB in 30 s: an answer over 1 MiB is refused
    before it is decoded, the source is down saying so."""
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=range(1_000_000))
    servers.append(Server(sock, servicer=kubelet))
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock,
                                sysfs_root=_possible(tmp_path))
    source.poll(log.emit)
    down = log.of(SourceStatus)[-1]
    assert not down.up and "larger than 1048576 bytes" in down.reason
    assert log.of(PodResourcesAllocatable) == []
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
    source.poll(log.emit)
    assert log.of(PodResourcesAllocatable)[-1].cpu_ids == {0, 1}
    source.close()


def test_memory_entries_are_bounded(sock, servers, tmp_path):
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(
        memory=[pb.ContainerMemory(memory_type=f"hugepages-{i}", size=1) for i in range(1000)])
    servers.append(Server(sock, servicer=kubelet))
    log = EventLog()
    source = PodResourcesSource(MonotonicWallClock(), socket_path=sock,
                                sysfs_root=_possible(tmp_path))
    source.poll(log.emit)
    assert len(log.of(PodResourcesAllocatable)[-1].memory_bytes) == 64
    assert "1000 memory entries, only the first 64 kept" in log.of(MalformedInput)[-1].detail
    source.close()


# ------------------------------------------------------------ gRPC stays out of the exporter

_POLL_IN_A_FRESH_PROCESS = """
import sys
from exporter.clock import MonotonicWallClock
from exporter.events import PodResourcesAllocatable
from exporter.sources import registry
from exporter.sources.kubelet.podresources import PodResourcesSource
registry.load()
events = []
PodResourcesSource(MonotonicWallClock(), socket_path=sys.argv[1]).poll(events.append)
cpus = [sorted(e.cpu_ids) for e in events if isinstance(e, PodResourcesAllocatable)]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "google"))
print(cpus, loaded)
"""


def test_the_exporter_process_never_imports_grpc(sock, servers):
    """Every source registered and a poll answered, in a fresh process: the call was made (by
    the poll's child), and neither gRPC nor protobuf is among the process's modules."""
    import subprocess
    import sys
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0])
    servers.append(Server(sock, servicer=kubelet))
    done = subprocess.run([sys.executable, "-c", _POLL_IN_A_FRESH_PROCESS, sock],
                          capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[[0]] []", done.stdout + done.stderr
    assert kubelet.calls == 1
