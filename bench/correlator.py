"""Correlator throughput and episode-state memory. No kernel, no I/O.

The synthetic stream repeats what one node sends in a busy hour, in these shares: kernel
transitions 50% (BPF records, and the same transitions again from uevents, which the ledger
drops as duplicates), sysfs snapshots 30% (re-read after every event), Node status updates 10%,
pod status updates 10% (a few of them admission rejections). Events are built ahead in chunks;
only Correlator.handle is timed.
"""
from __future__ import annotations

import gc
import time
import tracemalloc

from bench.stats import Summary
from exporter.clock import FakeClock
from exporter.config.decide import correlator_config
from exporter.config.options import Options
from exporter.correlate.correlator import Correlator
from exporter.correlate.ids import episode_id
from exporter.correlate.model import Episode, Phase, UpdateKind
from exporter.events import (
    Change,
    Direction,
    KernelSnapshot,
    NodeStatus,
    PodStatus,
    Resource,
    Result,
    Transition,
)

T0 = 1_700_000_000.0
STEP = 0.05  # seconds between events: a flap every ~0.5 s
GiB = 2**30
BLOCK = 128 * 2**20


def _snapshot(t: float, cpus: int, blocks: int) -> KernelSnapshot:
    possible = frozenset(range(2))
    online = frozenset(range(cpus))
    return KernelSnapshot(
        time=t, cpus_online=online, cpus_offline=possible - online, cpus_present=possible,
        cpus_possible=possible, memory_block_size=BLOCK,
        memory_blocks_online=frozenset(range(blocks)), memory_blocks_offline=frozenset(),
        mem_total_bytes=blocks * BLOCK, swap_total_bytes=0)


def _round(i: int, t: float) -> list[tuple[object, str | None]]:
    """Twenty events (one round: cpu1 and a memory block out and back, as sources see it)."""
    ev: list[tuple[object, str | None]] = []

    def tr(resource: Resource, unit: int, direction: Direction, source: str) -> None:
        nonlocal t
        t += STEP
        start = t - 0.02 if source == "bpf" else None
        ev.append((Transition(source, resource, unit, direction, Result.SUCCESS, end=t,
                              start=start, steps=100 if source == "bpf" else None), None))

    def snap(cpus: int, blocks: int) -> None:
        nonlocal t
        t += STEP
        ev.append((_snapshot(t, cpus, blocks), "sysfs"))

    def node(cpu: float) -> None:
        nonlocal t
        t += STEP
        ev.append((NodeStatus(t, "n1", {Resource.CPU: cpu, Resource.MEMORY: 24.0 * GiB},
                              {Resource.CPU: cpu, Resource.MEMORY: 23.0 * GiB}), "kube_node"))

    def pod(k: int, reason: str = "") -> None:
        nonlocal t
        t += STEP
        failed = bool(reason)
        ev.append((PodStatus(t, f"uid-{k}", "default", f"pod-{k}",
                             "Failed" if failed else "Running", reason, not failed,
                             requests={Resource.CPU: 0.1}), "kube_pods"))

    for direction, cpus in ((Direction.OFFLINE, 1), (Direction.ONLINE, 2)):
        tr(Resource.CPU, 1, direction, "bpf")
        tr(Resource.CPU, 1, direction, "uevent")
        snap(cpus, 192)
        node(2.0)
        pod(i % 50, "OutOfcpu" if i % 20 == 0 and direction is Direction.OFFLINE else "")
    for direction, blocks in ((Direction.OFFLINE, 191), (Direction.ONLINE, 192)):
        tr(Resource.MEMORY, 7, direction, "uevent")
        tr(Resource.MEMORY, 7, direction, "bpf")
        tr(Resource.MEMORY, 7, direction, "sysfs")
        snap(2, blocks)
        snap(2, blocks)
        tr(Resource.CPU, 1, Direction.OFFLINE if blocks == 191 else Direction.ONLINE, "uevent")
        snap(2, blocks)
        pod((i + 25) % 50)
    return ev


def stream(n: int, first_round: int = 0, t: float = T0) -> list[tuple[object, str | None]]:
    out: list[tuple[object, str | None]] = []
    i = first_round
    while len(out) < n:
        out += _round(i, t + i * 20 * STEP)
        i += 1
    return out[:n]


# The throughput stream flaps cpu1 every 0.25 s: with the default 2 s window that is one flap
# storm, a single episode (README, "Flap storms"), which storm_state() times. A window shorter
# than the flaps makes each transition an episode of its own again, so the episode machinery
# (open, supersede, end) is what is timed, as it was before storms were one episode.
THROUGHPUT_WINDOW = 0.1


def throughput(events: int = 1_000_000, chunk: int = 100_000, repeats: int = 3) -> dict:
    rates = []
    for _ in range(repeats):
        clock = FakeClock(T0)
        correlator = Correlator(correlator_config(Options(coalesce_window=THROUGHPUT_WINDOW),
                                                  kubernetes=True), clock)
        handled, busy, rounds, ended = 0, 0.0, 0, 0
        while handled < events:
            batch = stream(min(chunk, events - handled), rounds)
            rounds += len(batch) // 20 + 1
            gc.collect()
            t0 = time.thread_time()
            for event, source in batch:
                clock.t = getattr(event, "end", None) or event.time
                for update in correlator.handle(event, source):
                    ended += update.kind is UpdateKind.ENDED
            busy += time.thread_time() - t0
            handled += len(batch)
        rates.append(handled / busy)
    return {"events": events, "repeats": repeats,
            "events_per_s": Summary.of(rates).as_dict(),
            "episodes_ended": ended}


def episode_memory(open_episodes: int = 10_000, probe_events: int = 2_000) -> dict:
    """Bytes the correlator holds for `open_episodes` episodes waiting for a resync, and what
    one event costs while they are open.

    Each is a CPU hot-plug on a node whose kubelet never resyncs (today's kubelets): one BPF
    transition, resync deadline far away. They are put in through resume(), the journal's path
    after a restart (quicker to set up than 10k plugs). The first snapshot after a resume
    dates each resumed episode's kernel capacity once (O(open), once): it is fed before the
    probe. The probe is a mix of every kind of event, none of which touches the CPU episodes:
    sysfs snapshots, Node heartbeats, pod updates, and a memory block going out and back (its
    episodes open, close their kernel phase, and supersede each other).
    """
    clock = FakeClock(T0 + open_episodes * 3.0 + 10)
    config = correlator_config(Options(resync_deadline=1e9, coalesce_window=2.0), kubernetes=True)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    correlator = Correlator(config, clock)
    correlator.handle(NodeStatus(T0, "n1", {Resource.CPU: 1.0}, {Resource.CPU: 1.0}), "kube_node")
    episodes = []
    for k in range(open_episodes):
        end = T0 + 1 + k * 3.0
        t = Transition("bpf", Resource.CPU, 1, Direction.ONLINE, Result.SUCCESS, end=end,
                       start=end - 0.01, steps=100)
        episodes.append(Episode(id=episode_id(Resource.CPU, Change.INCREASE, t.start),
                                resource=Resource.CPU,
                                change=Change.INCREASE, opened=t.start, transitions=[t],
                                kernel_done=end, kernel_before=1.0, kernel_after=2.0,
                                kubelet_before=1.0, phase=Phase.RESYNC))
    correlator.resume(episodes)
    del episodes  # resume() keeps its own copies
    correlator.handle(_snapshot(clock.t, 2, 192), "sysfs")
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    n_open = correlator.episodes_open()
    probes = _probes(clock.t, probe_events)
    t0 = time.thread_time()
    for probe, source in probes:
        clock.t = max(clock.t, getattr(probe, "end", None) or probe.time)
        correlator.handle(probe, source)
    per_event = (time.thread_time() - t0) / probe_events
    return {"open_episodes": n_open, "bytes": held,
            "bytes_per_episode": held / n_open if n_open else 0.0,
            "ms_per_event_while_open": per_event * 1e3,
            "us_per_event_while_open": per_event * 1e6,
            "still_open": correlator.episodes_open()}


def _probes(t: float, n: int) -> list[tuple[object, str | None]]:
    out: list[tuple[object, str | None]] = []
    for k in range(n):
        t += STEP
        kind = k % 4
        if kind == 0:
            out.append((_snapshot(t, 2, 192), "sysfs"))
        elif kind == 1:
            out.append((NodeStatus(t, "n1", {Resource.CPU: 1.0}, {Resource.CPU: 1.0}),
                        "kube_node"))
        elif kind == 2:
            out.append((PodStatus(t, f"uid-{k % 50}", "default", f"pod-{k % 50}", "Running", "",
                                  True, requests={Resource.CPU: 0.1}), "kube_pods"))
        else:
            direction = Direction.OFFLINE if k % 8 == 3 else Direction.ONLINE
            out.append((Transition("bpf", Resource.MEMORY, 7, direction, Result.SUCCESS, end=t,
                                   start=t - 0.002), None))
    return out


def storm_state(transitions: int = 10_000) -> dict:
    """A flap storm through the real correlator: cpu1 out and back, each transition from BPF
    and again from a uevent (the ledger drops the copy), 50 ms apart: 1,000 to warm up, then
    `transitions` timed, then `transitions` more under tracemalloc. What the correlator holds
    per transition once the episode's sample is full, how many episodes the storm made, and the
    size of the storm episode's journal row (the codec's JSON, as the journal stores it)."""
    from exporter import codec

    clock = FakeClock(T0)
    correlator = Correlator(correlator_config(Options(), kubernetes=True), clock)
    correlator.handle(_snapshot(T0, 2, 192), "sysfs")
    correlator.handle(NodeStatus(T0, "n1", {Resource.CPU: 2.0}, {Resource.CPU: 2.0}),
                      "kube_node")
    opened = 0

    def flap(k: int) -> None:
        nonlocal opened
        t = T0 + 1 + k * STEP
        direction = Direction.OFFLINE if k % 2 == 0 else Direction.ONLINE
        clock.t = t
        for event in (Transition("bpf", Resource.CPU, 1, direction, Result.SUCCESS, end=t,
                                 start=t - 0.02, steps=100),
                      Transition("uevent", Resource.CPU, 1, direction, Result.SUCCESS,
                                 end=t + 0.001)):
            for update in correlator.handle(event):
                opened += update.kind is UpdateKind.OPENED

    warm = 1_000  # the sample fills and the ledger knows every key
    for k in range(warm):
        flap(k)
    t0 = time.thread_time()  # timed apart: tracemalloc slows every allocation
    for k in range(warm, warm + transitions):
        flap(k)
    busy = time.thread_time() - t0
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for k in range(warm + transitions, warm + 2 * transitions):
        flap(k)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    [ep] = correlator.open_episodes()
    return {"transitions": warm + 2 * transitions, "episodes_opened": opened,
            "bytes_grown": grown, "bytes_per_transition": grown / transitions,
            "transitions_kept": len(ep.transitions),
            "counted": ep.offline_transitions + ep.online_transitions,
            "journal_row_bytes": len(codec.dumps(ep)),
            "us_per_transition": busy / transitions * 1e6}
