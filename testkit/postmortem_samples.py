"""Hand-made episodes for the postmortem tests (journal, traces, CLI, report).

Times are fixed wall-clock seconds so assertions can name them exactly.
"""
from __future__ import annotations

from exporter.correlate.model import Episode, Outcome, Phase, PodOutcome, PodVerdict
from exporter.events import Change, Direction, Resource, Result, Transition

T0 = 1_795_000_000.0  # 2026-11-18, a time the tests can recognise


def cpu_offline_episode(t0: float = T0, episode_id: str = "cpu-decrease-1") -> Episode:
    """cpu1 offline (30 ms), Node capacity catches up after 4 s, one pod rejected, one kept."""
    tr = Transition(source="bpf", resource=Resource.CPU, unit=1, direction=Direction.OFFLINE,
                    result=Result.SUCCESS, start=t0, end=t0 + 0.030, steps=95)
    return Episode(
        id=episode_id, resource=Resource.CPU, change=Change.DECREASE, opened=t0,
        transitions=[tr], kernel_done=t0 + 0.030, kernel_before=2.0, kernel_after=1.0,
        kubelet_before=2.0, phase=Phase.ENDED, resynced=t0 + 4.0, kubelet_after=1.0,
        readmission_settled=t0 + 14.0,
        pods=[PodOutcome(time=t0 + 4.5, namespace="default", name="web-0", uid="u-web-0",
                         outcome=PodVerdict.REJECTED, reason="OutOfcpu"),
              PodOutcome(time=t0 + 5.0, namespace="kube-system", name="dns-1", uid="u-dns-1",
                         outcome=PodVerdict.KEPT, reason="")],
        outcome=Outcome.CONVERGED, ended=t0 + 14.0, detail="")


def memory_failed_episode(t0: float = T0 + 100, episode_id: str = "memory-decrease-7") -> Episode:
    """Two memory blocks: one offlined, one refused with EBUSY (no start time: uevent/sysfs)."""
    ok = Transition(source="bpf", resource=Resource.MEMORY, unit=7, direction=Direction.OFFLINE,
                    result=Result.SUCCESS, start=t0, end=t0 + 0.012, pfn=7 * 32768,
                    nr_pages=32768)
    refused = Transition(source="sysfs", resource=Resource.MEMORY, unit=150,
                         direction=Direction.OFFLINE, result=Result.FAILED, end=t0 + 0.5,
                         error="EBUSY")
    return Episode(
        id=episode_id, resource=Resource.MEMORY, change=Change.DECREASE, opened=t0,
        transitions=[ok, refused], kernel_done=t0 + 0.5, kernel_before=8 * 2.0**30,
        kernel_after=8 * 2.0**30 - 2.0**27, kubelet_before=8 * 2.0**30, phase=Phase.ENDED,
        outcome=Outcome.KERNEL_FAILED, ended=t0 + 0.5, detail="memory150 offline refused: EBUSY")


def cpu_online_open_episode(t0: float = T0 + 200, episode_id: str = "cpu-increase-1") -> Episode:
    """cpu1 back online; still waiting for the kubelet (open)."""
    tr = Transition(source="bpf", resource=Resource.CPU, unit=1, direction=Direction.ONLINE,
                    result=Result.SUCCESS, start=t0, end=t0 + 0.008, steps=90)
    return Episode(id=episode_id, resource=Resource.CPU, change=Change.INCREASE, opened=t0,
                   transitions=[tr], kernel_done=t0 + 0.008, kernel_before=1.0,
                   kernel_after=2.0, kubelet_before=1.0, phase=Phase.RESYNC)


def cpu_restart_episode(t0: float = T0 + 300, episode_id: str = "cpu-decrease-2") -> Episode:
    """cpu1 offline (31.9 ms); a kubelet restart resyncs the Node 3.97 s later and rejects both
    pods OutOfcpu at their own times (as tests/fixtures/kubelet-v1.36 recorded)."""
    tr = Transition(source="bpf", resource=Resource.CPU, unit=1, direction=Direction.OFFLINE,
                    result=Result.SUCCESS, start=t0, end=t0 + 0.0319, steps=95)
    done = t0 + 0.0319
    return Episode(
        id=episode_id, resource=Resource.CPU, change=Change.DECREASE, opened=t0,
        transitions=[tr], kernel_done=done, kernel_before=2.0, kernel_after=1.0,
        kubelet_before=2.0, phase=Phase.ENDED, resynced=done + 3.97, kubelet_after=1.0,
        resynced_by="kubelet_restart", readmission_settled=done + 14.0,
        pods=[PodOutcome(time=done + 5.0, namespace="default", name="sleeper-2", uid="u-s2",
                         outcome=PodVerdict.REJECTED, reason="OutOfcpu"),
              PodOutcome(time=done + 6.0, namespace="default", name="sleeper-1", uid="u-s1",
                         outcome=PodVerdict.REJECTED, reason="OutOfcpu")],
        outcome=Outcome.CONVERGED, ended=done + 14.0, offline_transitions=1,
        detail="readmission: 0 pods kept, 2 rejected")


def memory_uevent_only_episode(t0: float = T0 + 400, episode_id: str = "memory-decrease-9"
                               ) -> Episode:
    """Kubernetes off, no BPF: two memory blocks offlined, seen only by uevents (no start
    times), 8 GiB -> 7.75 GiB."""
    blocks = [Transition(source="uevent", resource=Resource.MEMORY, unit=unit,
                         direction=Direction.OFFLINE, result=Result.SUCCESS, end=t0 + k * 0.2)
              for k, unit in enumerate((60, 61))]
    return Episode(
        id=episode_id, resource=Resource.MEMORY, change=Change.DECREASE, opened=t0,
        transitions=blocks, kernel_done=t0 + 0.2, kernel_before=8 * 2.0**30,
        kernel_after=8 * 2.0**30 - 2 * 2.0**27, phase=Phase.ENDED,
        outcome=Outcome.KERNEL_ONLY, ended=t0 + 0.2, offline_transitions=2,
        detail="no Kubernetes source configured")


def cpu_flapping_superseded_episode(t0: float = T0 + 500, episode_id: str = "cpu-decrease-3"
                                    ) -> Episode:
    """cpu1 offline/online three times in 1.2 s, then superseded by a lasting hot-plug."""
    trs = [Transition(source="bpf", resource=Resource.CPU, unit=1,
                      direction=Direction.OFFLINE if k % 2 == 0 else Direction.ONLINE,
                      result=Result.SUCCESS, start=t0 + k * 0.2, end=t0 + k * 0.2 + 0.03,
                      steps=95)
           for k in range(6)]
    return Episode(
        id=episode_id, resource=Resource.CPU, change=Change.DECREASE, opened=t0,
        transitions=trs, kernel_done=trs[-1].end, kernel_before=2.0, kernel_after=2.0,
        kubelet_before=2.0, phase=Phase.ENDED, outcome=Outcome.SUPERSEDED, ended=t0 + 1.2,
        offline_transitions=3, online_transitions=3,
        detail="superseded by an increase of cpu (flapping: 3 offline and 3 online transitions "
               "in 1.03 s, ended online)")
