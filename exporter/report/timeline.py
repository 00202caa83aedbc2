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

from exporter.correlate.model import Episode, Outcome, Phase, PodVerdict, ResyncedBy
from exporter.events import Resource, Result, Transition
from exporter.words import count

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
    kind: str  # pods: "rejected" or "kept"; instants: "transition", "failed" or "restart"


@dataclass
class Timeline:
    title: str  # the headline sentence: "cpu hot-unplug 2 -> 1 cores in 31.9 ms; Node ..."
    origin: float  # wall-clock seconds of t = 0
    length: float  # seconds shown on the axis
    rows: list[str] = field(default_factory=list)  # row labels, top to bottom
    bars: list[Bar] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)  # pods, numbered in the list below
    # Instants drawn with their own label: a transition seen without a start (uevent/sysfs),
    # the kubelet restart that resynced the Node.
    instants: list[Marker] = field(default_factory=list)
    subtitle: str = ""  # node, resource and change, episode id, UTC start
    bad: bool = False  # the headline reports harm: drawn in red
    forecast: str = ""  # what a kubelet restart would reject, forecast before the kubelet acted


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
    pods = f"{count(total, 'pod')} rejected"
    if len(reasons) == 1:
        return f"{pods} {next(iter(reasons))}"
    return f"{pods} ({', '.join(f'{n} {why}' for why, n in reasons.most_common())})"


OPEN_WORDS = {Phase.KERNEL: "open: kernel transitions may still join",
              Phase.RESYNC: "open: waiting for the kubelet to resync",
              Phase.READMISSION: "open: readmission not settled yet"}


def amount(resource: Resource, value: float) -> str:
    """Memory as people say it: "8 GiB", "7.75 GiB", "512 MiB"."""
    if value >= 2**30:
        return f"{round(value / 2**30, 2):g} GiB"
    return f"{round(value / 2**20, 1):g} MiB"


def change_words(ep: Episode) -> str:
    """What changed and by how much: "cpu hot-unplug 2 -> 1 cores", or the flap counts."""
    if ep.flapping:
        return (f"{ep.resource.value} flapping: {ep.offline_transitions} offline and "
                f"{ep.online_transitions} online transitions")
    change = "hot-plug" if ep.change.value == "increase" else "hot-unplug"
    before, after = ep.kernel_before, ep.kernel_after
    if before is None or after is None:
        units = sorted({unit_name(t.resource, t.unit) for t in ep.transitions})
        return f"{ep.resource.value} {change}" + (f" of {', '.join(units[:3])}" if units else "")
    if ep.resource is Resource.CPU:
        return f"cpu {change} {before:g} -> {after:g} cores"
    return f"memory {change} {amount(ep.resource, before)} -> {amount(ep.resource, after)}"


def kernel_words(ep: Episode) -> str:
    """How long the kernel took ("in 31.9 ms"); a uevent or sysfs sighting has no start, so
    no duration."""
    if ep.kernel_done is None:
        return ""
    if all(t.start is None for t in ep.transitions):
        return ", kernel time unknown (seen by uevent/sysfs)"
    return f" in {seconds(max(0.0, ep.kernel_done - ep.opened))}"


def watched(ep: Episode) -> bool:
    """Kubernetes was watched: a kernel_only episode says it was not; without a Node status
    before, a resync or a pod, nothing shows it was (a superseded episode with Kubernetes off)."""
    if ep.outcome is Outcome.KERNEL_ONLY:
        return False
    return ep.kubelet_before is not None or ep.resynced is not None or bool(ep.pods) or \
        ep.outcome in (Outcome.RESYNC_TIMEOUT, Outcome.MISMATCH) or \
        ep.phase in (Phase.RESYNC, Phase.READMISSION)


def outcome_words(ep: Episode) -> str:
    return ep.outcome.value if ep.outcome else f"open ({ep.phase.value})"


def node_unchanged(ep: Episode) -> bool:
    """The Node's capacity was the same before and after, and matched the kernel as soon as
    its kernel phase was done: it never changed (a flap that ended where it began)."""
    return (ep.resynced is not None and ep.kernel_done is not None
            and ep.resynced <= ep.kernel_done and ep.kubelet_before is not None
            and ep.kubelet_before == ep.kubelet_after)


def capacity_words(resource: Resource, value: float) -> str:
    """"2 cores", "8 GiB"."""
    return f"{value:g} cores" if resource is Resource.CPU else amount(resource, value)


def kubernetes_words(ep: Episode) -> tuple[str, bool]:
    """What Kubernetes did (or the kernel refused), and whether that did harm."""
    if ep.outcome is Outcome.KERNEL_FAILED:
        failed = sum(t.result is Result.FAILED for t in ep.transitions)
        words = f"the kernel refused {failed} of {ep.transitions_seen} transitions"
        return words + (f": {ep.detail}" if ep.detail else ""), True
    if ep.outcome is Outcome.SUPERSEDED:
        return f"superseded by an opposite change after {seconds(ep.ended - ep.opened)}" \
            if ep.ended is not None else "superseded by an opposite change", False
    if not watched(ep):
        return "Kubernetes not watched", False
    if ep.resynced is not None and ep.kernel_done is not None:
        took = seconds(max(0.0, ep.resynced - ep.kernel_done))
        if node_unchanged(ep):
            assert ep.kubelet_after is not None
            words = f"the Node never changed ({capacity_words(ep.resource, ep.kubelet_after)})"
        else:
            words = {ResyncedBy.RESTART: f"Node resynced after {took} by a kubelet restart",
                     ResyncedBy.LIVE: f"Node resynced live after {took}"
                     }.get(ep.resynced_by, f"Node resynced after {took}")
        if ep.outcome is Outcome.MISMATCH:
            return words + _mismatch(ep), True
        if ep.outcome is None:
            words += f"; {OPEN_WORDS.get(ep.phase, 'open')}"
        return words, False
    if ep.outcome is Outcome.RESYNC_TIMEOUT:
        waited = (ep.ended - ep.kernel_done) if ep.ended and ep.kernel_done else None
        return "Node did not resync" + (f" within {seconds(waited)}" if waited is not None
                                        else ""), ep.change.value == "decrease"
    if ep.outcome is Outcome.MISMATCH:
        return "Node did not match the kernel" + _mismatch(ep), True
    if ep.outcome is None:
        return OPEN_WORDS.get(ep.phase, f"open ({ep.phase.value})"), False
    return ep.outcome.value, False


def _mismatch(ep: Episode) -> str:
    if ep.kubelet_after is None or ep.kernel_after is None:
        return ""
    if ep.resource is Resource.CPU:
        return f": it settled on {ep.kubelet_after:g}, the kernel has {ep.kernel_after:g}"
    return (f": it settled on {amount(ep.resource, ep.kubelet_after)}, the kernel has "
            f"{amount(ep.resource, ep.kernel_after)}")


def headline(ep: Episode) -> tuple[str, bool]:
    """One sentence an on-call engineer reads first: what changed and by how much, how long
    the kernel took, what Kubernetes did, the pods rejected; True when it did harm."""
    kube, bad = kubernetes_words(ep)
    words = f"{change_words(ep)}{kernel_words(ep)}; {kube}"
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
        return head + f"none of {count(f.pods, 'pod')}"
    pods = ", ".join(f"{r.namespace}/{r.name} {r.reason}" for r in f.rejected[:named])
    more = f.rejected_total - min(named, len(f.rejected))
    return (head + f"{f.rejected_total} of {count(f.pods, 'pod')}: {pods}"
            + (f" and {more} more" if more else ""))


def build(ep: Episode, node: str | None = None) -> Timeline:
    """Lay the episode out: one row per kernel unit (cpu1, memory60), then resync (only when
    Kubernetes was watched), then readmission. Every episode draws something: a transition
    without a start (uevent/sysfs) is an instant marker, not a bar of no width."""
    words, bad = headline(ep)
    change = "hot-plug" if ep.change.value == "increase" else "hot-unplug"
    subtitle = (f"node {node or '(unknown: no Node status recorded)'}  |  {ep.resource.value} "
                f"{change}  |  episode {ep.id}  |  opened {utc(ep.opened)}")
    tl = Timeline(title=words, origin=ep.opened, length=0.0, subtitle=subtitle, bad=bad,
                  forecast=forecast_words(ep))
    _kernel_rows(tl, ep)
    _resync_row(tl, ep)
    _readmission_row(tl, ep)
    times = [0.0, *(t for b in tl.bars for t in (b.start, b.end)),
             *(m.at for m in tl.markers), *(m.at for m in tl.instants)]
    if ep.ended is not None:
        times.append(ep.ended - ep.opened)
    tl.length = max(max(times), 1e-3)
    return tl


def _kernel_rows(tl: Timeline, ep: Episode) -> None:
    """One row per kernel unit: a bar per transition, an instant where it has no start."""
    t0 = ep.opened
    by_unit: dict[str, list[Transition]] = {}
    for t in ep.transitions:
        by_unit.setdefault(unit_name(t.resource, t.unit), []).append(t)
    for name, seen in by_unit.items():
        row = len(tl.rows)
        offline = sum(t.direction.value == "offline" for t in seen)
        # A flapping unit: its bars lie close together, so the counts go in the row's name.
        tl.rows.append(f"{KERNEL_LANE} {name}" if len(seen) == 1 else
                       f"{KERNEL_LANE} {name}\n{offline} offline, {len(seen) - offline} online")
        for t in seen:
            failed = t.result is Result.FAILED
            words = f"{name} {t.direction.value}"
            if failed:
                words += f" refused ({t.error or t.failed_state or 'failed'})"
            if t.start is None:
                tl.instants.append(Marker(row, f"{words}: no duration, seen by {t.source}"
                                          if len(seen) == 1 else "", t.end - t0,
                                          "failed" if failed else "transition"))
                continue
            if not failed and t.duration is not None:
                words += f" {seconds(t.duration)}"
            tl.bars.append(Bar(row, words if len(seen) == 1 else "", t.start - t0, t.end - t0,
                               "failed" if failed else "transition"))


def _resync_row(tl: Timeline, ep: Episode) -> None:
    """The wait for the Node, when Kubernetes was watched: how long, and what resynced it."""
    waited = ep.outcome in (Outcome.RESYNC_TIMEOUT, Outcome.MISMATCH) or (
        ep.outcome is Outcome.SUPERSEDED and watched(ep)) or (
        ep.outcome is None and ep.phase is Phase.RESYNC)
    if ep.kernel_done is None or (ep.resynced is None and not waited):
        return
    t0, row = ep.opened, len(tl.rows)
    tl.rows.append(RESYNC_LANE)
    if ep.resynced is not None:
        end, kind = ep.resynced, "resync"
        took = seconds(max(0.0, end - ep.kernel_done))
        if node_unchanged(ep):
            words = "the Node never changed"
        elif ep.resynced_by == ResyncedBy.RESTART:
            words = f"resynced by a kubelet restart after {took}"
            tl.instants.append(Marker(row, "kubelet restarted", end - t0, "restart"))
        else:
            words = f"resync {took}" + (" (live)" if ep.resynced_by == ResyncedBy.LIVE else "")
    else:
        end, kind = (ep.ended or ep.kernel_done), "waiting"
        words = f"no resync ({outcome_words(ep)})" if ep.outcome else "not resynced yet (open)"
        if ep.ended is not None:
            words += f" after {seconds(max(0.0, end - ep.kernel_done))}"
    tl.bars.append(Bar(row, words, ep.kernel_done - t0, max(end, ep.kernel_done) - t0, kind))


def _readmission_row(tl: Timeline, ep: Episode) -> None:
    """Readmission: its bar, and a marker per pod judged."""
    if ep.readmission_settled is None and not ep.pods:
        return
    t0, row = ep.opened, len(tl.rows)
    tl.rows.append(READMISSION_LANE)
    start = ep.resynced if ep.resynced is not None else (ep.kernel_done or t0)
    settled = ep.readmission_settled
    end = settled if settled is not None else max([start, *(p.time for p in ep.pods)])
    rejected = sum(p.outcome is PodVerdict.REJECTED for p in ep.pods)
    words = f"readmission: {rejected} rejected, {len(ep.pods) - rejected} kept"
    tl.bars.append(Bar(row, words, start - t0, end - t0, "readmission"))
    for p in ep.pods:
        label = f"{p.namespace}/{p.name} {p.outcome.value}"
        if p.reason:
            label += f" ({p.reason})"
        tl.markers.append(Marker(row, label, p.time - t0, p.outcome.value))
