"""A picture of one episode: kernel transitions, resync and readmission on one time axis.

`build(episode, node)` lays the episode out (rows of bars and markers, times relative to its
start, an honest headline); exporter/report/figure.py draws that layout with matplotlib, the one
renderer of both PNG and SVG (the `report` extra), and writes it. Tests check the layout and the
drawing apart.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from exporter.correlate.model import Episode, Outcome, Phase, PodVerdict
from exporter.events import Resource, Result

KERNEL_LANE = "kernel"
RESYNC_LANE = "kubelet.resync"
READMISSION_LANE = "kubelet.readmission"


class ReportError(Exception):
    """The picture cannot be made (unknown format, matplotlib missing)."""


@dataclass(frozen=True)
class Bar:
    row: int
    label: str
    start: float  # seconds since the episode opened
    end: float
    kind: str  # "transition", "failed", "resync", "waiting", "readmission"


@dataclass(frozen=True)
class Marker:
    row: int
    label: str
    at: float  # seconds since the episode opened
    kind: str  # "rejected" or "kept"


@dataclass
class Timeline:
    title: str  # the headline: outcome and what it cost ("converged; 2 pods rejected OutOfcpu")
    origin: float  # wall-clock seconds of t = 0
    length: float  # seconds shown on the axis
    rows: list[str] = field(default_factory=list)  # row labels, top to bottom
    bars: list[Bar] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    subtitle: str = ""  # node, resource and change, episode id, UTC start
    bad: bool = False  # the headline reports harm: drawn in red
    forecast: str = ""  # what a kubelet restart would reject, as forecast before the resync


def utc(t: float, date: bool = True) -> str:
    """Wall-clock seconds as UTC, to the millisecond, saying so."""
    fmt = "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S"
    return time.strftime(fmt, time.gmtime(t)) + f".{int(round(t % 1 * 1000)) % 1000:03d} UTC"


def rejected_words(ep: Episode) -> str:
    """"2 pods rejected OutOfcpu", "3 pods rejected (2 OutOfcpu, 1 OutOfmemory)", or ""."""
    reasons = Counter(p.reason or "no reason" for p in ep.pods
                      if p.outcome is PodVerdict.REJECTED)
    total = sum(reasons.values())
    if not total:
        return ""
    pods = f"{total} pod{'s' if total != 1 else ''} rejected"
    if len(reasons) == 1:
        return f"{pods} {next(iter(reasons))}"
    return f"{pods} ({', '.join(f'{n} {why}' for why, n in reasons.most_common())})"


OPEN_WORDS = {Phase.KERNEL: "open: kernel transitions may still join",
              Phase.RESYNC: "open: waiting for the kubelet to resync",
              Phase.READMISSION: "open: readmission not settled yet"}


def headline(ep: Episode) -> tuple[str, bool]:
    """What happened, in the words an on-call engineer needs first; True when it did harm."""
    if ep.outcome is None:
        words, bad = OPEN_WORDS.get(ep.phase, f"open ({ep.phase.value})"), False
    elif ep.outcome is Outcome.RESYNC_TIMEOUT:
        waited = (ep.ended - ep.kernel_done) if ep.ended and ep.kernel_done else None
        words = "resync_timeout: the kubelet did not resync" + (
            f" within {seconds(waited)}" if waited is not None else "")
        bad = ep.change.value == "decrease"
    elif ep.outcome is Outcome.KERNEL_FAILED:
        words, bad = "kernel_failed" + (f": {ep.detail}" if ep.detail else ""), True
    elif ep.outcome is Outcome.MISMATCH:
        words, bad = f"mismatch: the kubelet settled on {ep.kubelet_after:g}, the kernel has " \
                     f"{ep.kernel_after:g}" if ep.kubelet_after is not None and \
                     ep.kernel_after is not None else "mismatch", True
    else:
        words, bad = ep.outcome.value, False
    rejected = rejected_words(ep)
    if rejected:
        words, bad = f"{words}; {rejected}", True
    return words, bad


def unit_name(resource: Resource, unit: int) -> str:
    return f"cpu{unit}" if resource is Resource.CPU else f"memory{unit}"


def seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    tenths = round(s * 10)  # round once, so 599.97 s reads 10m00.0s, not 9m60.0s
    return f"{tenths // 600}m{tenths % 600 / 10:04.1f}s"


def forecast_words(ep: Episode, named: int = 4) -> str:
    """The episode's readmission forecast in one line ("" when it has none): what a kubelet
    restart would have rejected, as the exporter said before the resync."""
    f = ep.forecast
    if f is None:
        return ""
    head = "forecast before the resync: a kubelet restart would reject "
    if not f.rejected_total:
        return head + f"none of {f.pods} pods"
    pods = ", ".join(f"{r.namespace}/{r.name} {r.reason}" for r in f.rejected[:named])
    more = f.rejected_total - min(named, len(f.rejected))
    return (head + f"{f.rejected_total} of {f.pods} pods: {pods}"
            + (f" and {more} more" if more else ""))


def build(ep: Episode, node: str | None = None) -> Timeline:
    """Lay the episode out: one row per kernel transition, then resync, then readmission."""
    t0 = ep.opened
    outcome = ep.outcome.value if ep.outcome else f"open ({ep.phase.value})"
    words, bad = headline(ep)
    change = "hot-plug" if ep.change.value == "increase" else "hot-unplug"
    subtitle = (f"node {node or '(unknown: no Node status recorded)'}  |  {ep.resource.value} "
                f"{change}  |  episode {ep.id}  |  opened {utc(t0)}")
    tl = Timeline(title=words, origin=t0, length=0.0, subtitle=subtitle, bad=bad,
                  forecast=forecast_words(ep))
    latest = [0.0]

    def rel(t: float) -> float:
        latest[0] = max(latest[0], t - t0)
        return t - t0

    for t in ep.transitions:
        row = len(tl.rows)
        name = unit_name(t.resource, t.unit)
        tl.rows.append(f"{KERNEL_LANE} {name}")
        start = t.start if t.start is not None else t.end
        failed = t.result is Result.FAILED
        words = f"{name} {t.direction.value}"
        if failed:
            words += f" refused ({t.error or t.failed_state or 'failed'})"
        elif t.duration is not None:
            words += f" {seconds(t.duration)}"
        tl.bars.append(Bar(row, words, rel(start), rel(t.end), "failed" if failed else
                           "transition"))
    waited = ep.outcome in (Outcome.RESYNC_TIMEOUT, Outcome.MISMATCH, Outcome.SUPERSEDED) or (
        ep.outcome is None and ep.phase is Phase.RESYNC)
    if ep.kernel_done is not None and (ep.resynced is not None or waited):
        row = len(tl.rows)
        tl.rows.append(RESYNC_LANE)
        if ep.resynced is not None:
            end, kind = ep.resynced, "resync"
            words = f"resync {seconds(max(0.0, end - ep.kernel_done))}"
        else:
            end, kind = (ep.ended or ep.kernel_done), "waiting"
            words = f"no resync ({outcome})" if ep.outcome else "not resynced yet (open)"
            if ep.ended is not None:
                words += f" after {seconds(max(0.0, end - ep.kernel_done))}"
        tl.bars.append(Bar(row, words, rel(ep.kernel_done), rel(max(end, ep.kernel_done)),
                           kind))
    if ep.readmission_settled is not None or ep.pods:
        row = len(tl.rows)
        tl.rows.append(READMISSION_LANE)
        start = ep.resynced if ep.resynced is not None else (ep.kernel_done or t0)
        settled = ep.readmission_settled
        end = settled if settled is not None else max([start, *(p.time for p in ep.pods)])
        rejected = sum(p.outcome is PodVerdict.REJECTED for p in ep.pods)
        words = f"readmission: {rejected} rejected, {len(ep.pods) - rejected} kept"
        tl.bars.append(Bar(row, words, rel(start), rel(end), "readmission"))
        for p in ep.pods:
            label = f"{p.namespace}/{p.name} {p.outcome.value}"
            if p.reason:
                label += f" ({p.reason})"
            tl.markers.append(Marker(row, label, rel(p.time), p.outcome.value))
    if ep.ended is not None:
        rel(ep.ended)
    tl.length = max(latest[0], 1e-3)
    return tl
