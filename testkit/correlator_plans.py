"""Random plans of kernel, Node, pod and kubelet events for the correlator (hypothesis
strategies), and how one step becomes an event."""
from __future__ import annotations

from hypothesis import strategies as st

from exporter.events import (
    ContainerResize,
    Direction,
    KernelSnapshot,
    NodeStatus,
    PodResourcesAllocatable,
    PodsRelisted,
    PodStatus,
    Resource,
    Result,
    SourceStatus,
    Transition,
)
from testkit.correlator import config as correlator_config
from testkit.correlator_stream import BLOCK, GiB

CPU, MEM = Resource.CPU, Resource.MEMORY
UIDS = ("a", "b", "c", "bal")
# Repeats weight the draw towards pods that run and pods that admission rejects.
PHASES = ("Pending", "Running", "Running", "Succeeded", "Failed", "Failed")
REASONS = ("", "OutOfcpu", "OutOfcpu", "OutOfmemory", "OutOfpods", "UnexpectedAdmissionError",
           "Evicted")

configs = st.builds(
    correlator_config,
    coalesce_window=st.sampled_from([0.5, 2.0]),
    resync_deadline=st.sampled_from([5.0, 60.0]),
    readmission_settle=st.sampled_from([1.0, 10.0]),
    kubernetes=st.booleans())

# Each step: (seconds to advance the clock, how far in the past the event is stamped, event).
transitions = st.tuples(st.just("transition"), st.sampled_from([CPU, MEM]),
                        st.integers(0, 3), st.sampled_from(list(Direction)),
                        st.sampled_from([Result.SUCCESS] * 3 + [Result.FAILED]),
                        st.sampled_from([None, 0.03125]))
# Narrow value ranges, so that kernel and Node often agree and episodes reach every phase.
snapshots = st.tuples(st.just("snapshot"), st.integers(1, 3), st.integers(191, 193))
nodes = st.tuples(st.just("node"), st.integers(1, 3), st.integers(191, 193))
# A kubelet restart: the Node reports what the kernel has (both events, same values).
restarts = st.tuples(st.just("restart"), st.integers(1, 3), st.integers(191, 193))
pods = st.tuples(st.just("pod"), st.sampled_from(UIDS), st.sampled_from(PHASES),
                 st.sampled_from(REASONS), st.booleans(), st.booleans(),
                 st.sampled_from(["", "Deferred", "Infeasible"]), st.booleans(),
                 st.integers(1, 3), st.integers(1, 3))
relists = st.tuples(st.just("relist"), st.frozensets(st.sampled_from(UIDS)))
podresources = st.tuples(st.just("podresources"),
                         st.one_of(st.none(), st.frozensets(st.integers(0, 4))))
others = st.tuples(st.just("other"))
ticks = st.tuples(st.just("tick"))
steps = st.lists(st.tuples(
    st.sampled_from([0.0, 0.25, 0.25, 1.0, 1.0, 3.0, 20.0]), st.sampled_from([0.0, 0.0, 0.5]),
    # Listed twice: drawn more often.
    st.one_of(transitions, transitions, snapshots, nodes, restarts, restarts, pods, pods, pods,
              relists, podresources, others, ticks)),
    min_size=20, max_size=80)


def build(step: tuple, t: float):
    kind = step[0]
    if kind == "transition":
        _, resource, unit, direction, result, duration = step
        return Transition(source="bpf", resource=resource, unit=unit, direction=direction,
                          result=result, end=t, start=None if duration is None else t - duration,
                          error=None if result is Result.SUCCESS else "EBUSY")
    if kind == "snapshot":
        _, cpus, blocks = step
        online, possible = frozenset(range(cpus)), frozenset(range(4))
        return KernelSnapshot(time=t, cpus_online=online, cpus_offline=possible - online,
                              cpus_present=possible, cpus_possible=possible,
                              memory_block_size=BLOCK,
                              memory_blocks_online=frozenset(range(blocks)),
                              memory_blocks_offline=frozenset(), mem_total_bytes=blocks * BLOCK,
                              swap_total_bytes=0)
    if kind == "node":
        _, cpus, blocks = step
        capacity = {CPU: float(cpus), MEM: float(blocks * BLOCK)}
        return NodeStatus(time=t, node="n1", capacity=capacity, allocatable=capacity)
    if kind == "pod":
        _, uid, phase, reason, ready, deleted, pending, error, desired, applied = step
        balloon = uid == "bal"
        return PodStatus(time=t, uid=uid, namespace="ns", name=uid, phase=phase, reason=reason,
                         ready=ready, deleted=deleted, balloon=balloon,
                         requests={CPU: float(applied), MEM: 1.0 * GiB},
                         resize=ContainerResize(pending_reason=pending, in_progress_error=error,
                                                desired={CPU: float(desired)},
                                                applied={CPU: float(applied)}))
    if kind == "relist":
        return PodsRelisted(time=t, uids=step[1])
    if kind == "podresources":
        return PodResourcesAllocatable(time=t, cpu_ids=step[1])
    if kind == "other":
        return SourceStatus(source="bpf", up=True, time=t)
    return None  # tick
