"""auto_online_blocks: the kernel's policy for hot-added memory, read from the real sysfs."""
from __future__ import annotations

from pathlib import Path

import pytest

from exporter.clock import MonotonicWallClock
from exporter.correlate.kubelet_view import KubeletView
from exporter.events import MalformedInput, MemoryAutoOnline
from exporter.sources.kernel.memory_auto_online import MemoryAutoOnlineSource, parse_auto_online

REAL = Path("/sys/devices/system/memory/auto_online_blocks")


@pytest.mark.parametrize("policy", ["offline", "online", "online_kernel", "online_movable"])
def test_each_policy_is_one_series_at_1(policy):
    view = KubeletView()
    view.handle(parse_auto_online(policy + "\n", 1.0))
    values = view.memory_auto_online()
    assert values[policy] == 1 and sum(values.values()) == 1 and len(values) == 4


def test_an_unknown_policy_is_refused_not_a_new_label():
    with pytest.raises(ValueError, match="unknown"):
        parse_auto_online("x" * 10_000, 1.0)


def test_reads_the_real_file_once_per_change(tmp_path):
    emitted: list = []
    source = MemoryAutoOnlineSource(MonotonicWallClock())
    source.read(emitted.append)
    source.read(emitted.append)  # unchanged: nothing new
    assert emitted == [MemoryAutoOnline(emitted[0].time, REAL.read_text().strip())]
    source.close()


def test_a_fixture_tree_without_memory_hotplug_emits_nothing(tmp_path):
    emitted: list = []
    source = MemoryAutoOnlineSource(MonotonicWallClock(), sysfs=str(tmp_path))
    source.read(emitted.append)
    assert emitted == []
    (tmp_path / "devices/system/memory").mkdir(parents=True)
    (tmp_path / "devices/system/memory/auto_online_blocks").write_text("sometimes\n")
    source.read(emitted.append)
    assert [type(e) for e in emitted] == [MalformedInput]
    source.close()


def test_it_runs_whatever_source_list_is_chosen():
    """A state reader, not an event source: `--source sysfs` (or any list) keeps it, and it
    is no --source choice."""
    from exporter.sources.registry import kernel_source_names
    from testkit.exporter_proc import RunningExporter

    assert "memory_auto_online" not in kernel_source_names()
    policy = Path("/sys/devices/system/memory/auto_online_blocks").read_text().strip()
    with RunningExporter("--source", "sysfs", "--kubernetes", "off") as exp:
        exp.wait_for(lambda s: s.value("node_resize_kernel_memory_auto_online", policy=policy) == 1)


def test_only_the_kernel_events_that_can_change_a_source_poke_it():
    """A CPU transition does not wake the auto_online_blocks reader, nor a memory one the
    kubepods cpuset reader; the checkpoint reader (CPU and memory managers) and the sysfs
    reconciler take both; no source is poked by its own event. The agent reads each source's
    `poked_by` from its registration."""
    from exporter.agent import Agent
    from exporter.events import Direction, Resource, Result, Transition
    from exporter.sources import registry

    poked: list[tuple[str, Resource]] = []

    class Recorder:
        def __init__(self, name: str):
            self.name = name

        def poke(self, resource: Resource) -> None:
            poked.append((self.name, resource))

    names = ("kubelet_checkpoint", "kubepods_cgroup", "memory_auto_online", "sysfs")
    pokes = [(Recorder(n), registry.spec(n).poked_by) for n in names]

    class Correlator:
        def handle(self, event, name):
            return []

    agent = Agent(Correlator(), [], [], MonotonicWallClock(), pokes=pokes)
    for source, resource, want in (
            ("bpf", Resource.CPU, ["kubelet_checkpoint", "kubepods_cgroup", "sysfs"]),
            ("bpf", Resource.MEMORY, ["kubelet_checkpoint", "memory_auto_online", "sysfs"]),
            ("sysfs", Resource.CPU, ["kubelet_checkpoint", "kubepods_cgroup"])):
        poked.clear()
        agent._process(source, Transition(source, resource, 1, Direction.OFFLINE,
                                          Result.SUCCESS, end=1.0))
        assert poked == [(name, resource) for name in want]
