"""Episodes as text: the `episodes list` table and the `episodes show` timeline."""
from __future__ import annotations

import time
from typing import Any, Iterable

from exporter import codec
from exporter.correlate.model import Episode, PodVerdict, ResyncedBy
from exporter.correlate.readmission_forecast import LISTED_MAX
from exporter.events import Resource, Result
from exporter.report.timeline import (
    forecast_words,
    headline,
    node_unchanged,
    seconds,
    unit_name,
)

COLUMNS = ("ID", "RESOURCE", "DIRECTION", "START", "KERNEL", "RESYNC", "READMISSION", "OUTCOME")


def clock_time(t: float, date: bool = True) -> str:
    """UTC, to the millisecond, marked Z: a journal copied off a node reads the same anywhere."""
    fmt = "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S"
    return time.strftime(fmt, time.gmtime(t)) + f".{int(round(t % 1 * 1000)) % 1000:03d}Z"


def duration(s: float | None) -> str:
    return "-" if s is None else seconds(s)


def outcome(ep: Episode) -> str:
    return ep.outcome.value if ep.outcome else f"open ({ep.phase.value})"


def capacity(resource: Resource, value: float | None) -> str:
    if value is None:
        return "?"
    if resource is Resource.CPU:
        return f"{value:g}"
    return f"{value / 2**30:.2f} GiB"


def table(episodes: Iterable[Episode]) -> str:
    rows = [COLUMNS] + [
        (ep.id, ep.resource.value, ep.change.value, clock_time(ep.opened),
         duration(ep.kernel_seconds), duration(ep.resync_seconds),
         duration(ep.readmission_seconds), outcome(ep))
        for ep in episodes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def as_json(ep: Episode) -> dict[str, Any]:
    """The episode as stored (codec), plus the phase durations a reader wants first."""
    return {**codec.encode(ep), "kernel_seconds": ep.kernel_seconds,
            "resync_seconds": ep.resync_seconds, "readmission_seconds": ep.readmission_seconds}


def timeline(ep: Episode) -> str:
    """A chronological account of one episode, for a terminal."""
    lines = [f"episode {ep.id}: {ep.resource.value} {ep.change.value}, {outcome(ep)}",
             f"  {headline(ep)[0]}",
             f"  opened {clock_time(ep.opened)}"
             + (f", ended {clock_time(ep.ended)}" if ep.ended is not None else ""),
             f"  kernel {duration(ep.kernel_seconds)}, resync {duration(ep.resync_seconds)}, "
             f"readmission {duration(ep.readmission_seconds)}",
             f"  capacity: kernel {capacity(ep.resource, ep.kernel_before)} -> "
             f"{capacity(ep.resource, ep.kernel_after)}, kubelet "
             f"{capacity(ep.resource, ep.kubelet_before)} -> "
             f"{capacity(ep.resource, ep.kubelet_after)}"]
    if ep.detail:
        lines.append(f"  detail: {ep.detail}")
    if ep.forecast is not None:
        lines.append(f"  {forecast_words(ep, named=LISTED_MAX)}")
    lines.append("")
    entries: list[tuple[float, int, str, str]] = []  # (time, order, lane, words)
    for t in ep.transitions:
        name = unit_name(t.resource, t.unit, t.mechanism)
        if t.start is not None:
            entries.append((t.start, 0, "kernel", f"{name} {t.direction.value} started"))
        if t.result is Result.FAILED:
            why = ", ".join(x for x in (t.error, t.failed_state and
                                        f"cpuhp state {t.failed_state}") if x)
            words = f"{name} {t.direction.value} FAILED" + (f": {why}" if why else "")
        else:
            words = f"{name} {t.direction.value} done"
            if t.duration is not None:
                words += f" in {seconds(t.duration)}"
        if t.steps is not None:
            words += f" ({t.steps} cpuhp steps)"
        words += f" [{t.source}]"
        entries.append((t.end, 1, "kernel", words))
    if ep.kernel_done is not None:
        entries.append((ep.kernel_done, 2, "kernel", "kernel phase done"))
    if ep.resynced is not None:
        if node_unchanged(ep):
            words = f"Node capacity {capacity(ep.resource, ep.kubelet_after)}, never changed"
        else:
            by = {ResyncedBy.RESTART: ", by a kubelet restart", ResyncedBy.LIVE: ", live"}
            words = (f"Node capacity {capacity(ep.resource, ep.kubelet_after)} "
                     f"(after {duration(ep.resync_seconds)}{by.get(ep.resynced_by, '')})")
        entries.append((ep.resynced, 3, "resync", words))
    for p in ep.pods:
        verdict = "REJECTED" if p.outcome is PodVerdict.REJECTED else "kept"
        entries.append((p.time, 4, "readmission", f"pod {p.namespace}/{p.name} {verdict}"
                        + (f": {p.reason}" if p.reason else "")))
    if ep.readmission_settled is not None:
        entries.append((ep.readmission_settled, 5, "readmission", "settled"))
    if ep.ended is not None:
        entries.append((ep.ended, 6, "episode", f"ended: {outcome(ep)}"))
    for at, _, lane, words in sorted(entries, key=lambda e: (e[0], e[1])):
        lines.append(f"  {'+' + format(at - ep.opened, '.3f') + 's':>12}  "
                     f"{clock_time(at, date=False)}  {lane:<11}  {words}")
    return "\n".join(lines)
