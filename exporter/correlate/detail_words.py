"""Words for an episode's detail: its failed transitions, its flapping, and what moved memory
that no block did (virtio-mem sub-blocks, balloons)."""
from __future__ import annotations

from exporter.correlate.model import Episode
from exporter.events import Resource, Result, Transition


def describe_failures(transitions: list[Transition]) -> str:
    failed = [t for t in transitions if t.result is Result.FAILED]
    words = []
    for t in failed[:4]:
        what = f"{'cpu' if t.resource is Resource.CPU else 'memory block '}{t.unit} " \
               f"{t.direction.value} failed"
        why = " ".join(x for x in (
            f"cpuhp state {t.failed_state}" if t.failed_state else "", t.error or "") if x)
        words.append(f"{what}: {why}" if why else what)
    if len(failed) > 4:
        words.append(f"and {len(failed) - 4} more")
    return "; ".join(words)


def flap_words(ep: Episode) -> str:
    """"flapping: 100 offline and 100 online transitions in 15.2 s, ended online"."""
    last = max(ep.transitions, key=lambda t: t.end, default=None)
    took = (ep.kernel_done if ep.kernel_done is not None else ep.opened) - ep.opened
    words = f"flapping: {ep.offline_transitions} offline and {ep.online_transitions} online " \
            f"transitions in {took:.1f} s"
    return words + (f", ended {last.direction.value}" if last is not None else "")


def mechanism_words(transitions: list[Transition]) -> str:
    """"virtio-balloon: -256 MiB; virtio-mem: +64 MiB" for the changes no memory
    block made (Transition.mechanism); "" when every transition was a block's or a CPU's."""
    moved: dict[str, int] = {}
    for t in transitions:
        if t.mechanism and t.nr_pages and t.result is Result.SUCCESS:
            sign = 1 if t.direction.value == "online" else -1
            moved[t.mechanism] = moved.get(t.mechanism, 0) + sign * t.nr_pages
    return "; ".join(f"{name}: {pages * PAGE_KIB / 1024:+g} MiB" for name, pages in moved.items())


PAGE_KIB = 4  # the page size the managed page count is kept in (x86-64, arm64 4K kernels)
