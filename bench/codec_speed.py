"""exporter.codec encode/decode speed on the objects the journal writes most.

    .venv/bin/python -m bench.codec_speed

Prints microseconds per dumps() and per loads() for a uevent Transition, a BPF Transition, a
KernelSnapshot (sets of CPU ids and memory blocks, as a 2-CPU, 192-block host has), a
NodeStatus and an ended Episode. The journal calls dumps() once per raw event.
"""
from __future__ import annotations

import timeit

from exporter import codec
from exporter import events as ev
from exporter.correlate.model import EpisodeUpdate, UpdateKind

T0 = 1_795_000_000.0


def samples() -> dict[str, object]:
    from exporter.correlate.model import Episode, Outcome, Phase, PodOutcome, PodVerdict
    bpf = ev.Transition(source="bpf", resource=ev.Resource.CPU, unit=1,
                        direction=ev.Direction.OFFLINE, result=ev.Result.SUCCESS,
                        start=T0, end=T0 + 0.03, steps=95)
    uevent = ev.Transition(source="uevent", resource=ev.Resource.MEMORY, unit=150,
                           direction=ev.Direction.ONLINE, result=ev.Result.SUCCESS, end=T0)
    snap = ev.KernelSnapshot(
        time=T0, cpus_online=frozenset({0, 1}), cpus_offline=frozenset(),
        cpus_present=frozenset({0, 1}), cpus_possible=frozenset({0, 1}),
        memory_block_size=1 << 27, memory_blocks_online=frozenset(range(192)),
        memory_blocks_offline=frozenset(), mem_total_bytes=25_276_502_016,
        swap_total_bytes=0, hugepages_bytes={ev.Resource.HUGEPAGES_2MI: 0})
    node = ev.NodeStatus(time=T0, node="n1",
                         capacity={ev.Resource.CPU: 2.0, ev.Resource.MEMORY: 25276502016.0},
                         allocatable={ev.Resource.CPU: 2.0, ev.Resource.MEMORY: 2.4e10},
                         resource_version="12345")
    ep = Episode(id="cpu-decrease-1", resource=ev.Resource.CPU, change=ev.Change.DECREASE,
                 opened=T0, transitions=[bpf], kernel_done=T0 + 0.03, kernel_before=2.0,
                 kernel_after=1.0, kubelet_before=2.0, phase=Phase.ENDED, resynced=T0 + 4,
                 kubelet_after=1.0, readmission_settled=T0 + 14,
                 pods=[PodOutcome(time=T0 + 4.5, namespace="default", name="web-0",
                                  uid="u-web-0", outcome=PodVerdict.REJECTED,
                                  reason="OutOfcpu")],
                 outcome=Outcome.CONVERGED, ended=T0 + 14)
    return {"Transition (uevent)": uevent, "Transition (bpf)": bpf,
            "KernelSnapshot (192 blocks)": snap, "NodeStatus": node, "Episode": ep,
            "EpisodeUpdate": EpisodeUpdate(kind=UpdateKind.ENDED, episode=ep, time=T0 + 14)}


def per_call_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    print(f"{'object':30} {'dumps us':>9} {'loads us':>9}")
    for name, obj in samples().items():
        text = codec.dumps(obj)
        assert codec.loads(text) == obj
        enc = per_call_us(lambda obj=obj: codec.dumps(obj), 5000)
        dec = per_call_us(lambda text=text: codec.loads(text), 5000)
        print(f"{name:30} {enc:9.2f} {dec:9.2f}")


if __name__ == "__main__":
    main()
