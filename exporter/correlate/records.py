"""Words for an episode's failed transitions (its detail, and the detail of its end)."""
from __future__ import annotations

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
