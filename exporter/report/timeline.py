"""A picture of one episode: kernel transitions, resync and readmission on one time axis.

`build(episode)` lays the episode out (rows of bars and markers, times relative to its start);
`to_svg` writes that layout as SVG text directly (no dependency) and `write_png` draws the same
layout with matplotlib (the `report` extra). Keeping the layout apart from both renderers means
they cannot disagree about what an episode looks like, and tests can check the layout itself.
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    title: str
    origin: float  # wall-clock seconds of t = 0
    length: float  # seconds shown on the axis
    rows: list[str] = field(default_factory=list)  # row labels, top to bottom
    bars: list[Bar] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


def unit_name(resource: Resource, unit: int) -> str:
    return f"cpu{unit}" if resource is Resource.CPU else f"memory{unit}"


def seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{int(s // 60)}m{s % 60:04.1f}s"


def build(ep: Episode) -> Timeline:
    """Lay the episode out: one row per kernel transition, then resync, then readmission."""
    t0 = ep.opened
    outcome = ep.outcome.value if ep.outcome else f"open ({ep.phase.value})"
    title = f"episode {ep.id}: {ep.resource.value} {ep.change.value}, {outcome}"
    tl = Timeline(title=title, origin=t0, length=0.0)
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
            words = f"no resync ({outcome})"
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


# ---------------------------------------------------------------- SVG

COLOURS = {"transition": "#4878d0", "failed": "#d65f5f", "resync": "#6acc64",
           "waiting": "#ee854a", "readmission": "#956cb4", "rejected": "#d62728",
           "kept": "#2ca02c"}
LABEL_W, ROW_H, PLOT_W, TOP, MIN_BAR = 190, 34, 640, 40, 2.0


def to_svg(tl: Timeline) -> str:
    width = LABEL_W + PLOT_W + 30
    extra = 11 * len(tl.markers)  # room for pod labels stacked under their markers
    height = TOP + ROW_H * max(1, len(tl.rows)) + 50 + extra
    scale = PLOT_W / tl.length

    def x(t: float) -> float:
        return LABEL_W + t * scale

    esc = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<title>{esc(tl.title)}</title>',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="13" font-weight="bold">{esc(tl.title)}</text>']
    for i, name in enumerate(tl.rows):
        y = TOP + i * ROW_H
        out.append(f'<text x="10" y="{y + ROW_H / 2 + 4:.1f}">{esc(name)}</text>')
        out.append(f'<line x1="{LABEL_W}" y1="{y + ROW_H:.1f}" x2="{LABEL_W + PLOT_W}" '
                   f'y2="{y + ROW_H:.1f}" stroke="#eee"/>')
    for b in tl.bars:
        y = TOP + b.row * ROW_H + 6
        w = max(MIN_BAR, (b.end - b.start) * scale)  # a 30 ms step beside 10 min stays visible
        out.append(f'<rect class="bar {b.kind}" x="{x(b.start):.2f}" y="{y}" width="{w:.2f}" '
                   f'height="{ROW_H - 20}" fill="{COLOURS[b.kind]}"><title>{esc(b.label)}'
                   f'</title></rect>')
        out.append(f'<text x="{x(b.start) + w + 4:.2f}" y="{y + 11}">{esc(b.label)}</text>')
    for k, m in enumerate(tl.markers):
        cx, cy = x(m.at), TOP + m.row * ROW_H + ROW_H - 8
        out.append(f'<circle class="marker {m.kind}" cx="{cx:.2f}" cy="{cy}" r="4" '
                   f'fill="{COLOURS[m.kind]}"><title>{esc(m.label)}</title></circle>')
        out.append(f'<text x="{cx + 6:.2f}" y="{cy + 4 + 11 * k}" font-size="9" '
                   f'fill="{COLOURS[m.kind]}">{esc(m.label)}</text>')
    axis_y = TOP + ROW_H * max(1, len(tl.rows)) + 10 + extra
    out.append(f'<line x1="{LABEL_W}" y1="{axis_y}" x2="{LABEL_W + PLOT_W}" y2="{axis_y}" '
               'stroke="black"/>')
    for i in range(6):
        t = tl.length * i / 5
        out.append(f'<line x1="{x(t):.2f}" y1="{axis_y}" x2="{x(t):.2f}" y2="{axis_y + 4}" '
                   'stroke="black"/>')
        out.append(f'<text x="{x(t):.2f}" y="{axis_y + 16}" text-anchor="middle">'
                   f'+{esc(seconds(t))}</text>')
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tl.origin))
    out.append(f'<text x="{LABEL_W}" y="{axis_y + 32}">time since {esc(start)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- PNG


def figure(tl: Timeline):
    """The matplotlib Figure for a timeline (Agg: no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("PNG output needs matplotlib: pip install "
                          "'node-resize-exporter[report]' (or write .svg, which needs nothing)"
                          ) from None
    rows = max(1, len(tl.rows))
    fig = Figure(figsize=(10, 1.4 + 0.5 * rows + 0.12 * len(tl.markers)), dpi=100)
    ax = fig.add_subplot()
    min_w = tl.length / 300  # the SVG's minimum width, in data units
    for b in tl.bars:
        ax.broken_barh([(b.start, max(min_w, b.end - b.start))], (b.row - 0.3, 0.6),
                       facecolors=COLOURS[b.kind], label=b.kind)
        ax.annotate(b.label, (b.start + max(min_w, b.end - b.start), b.row), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    for kind in ("kept", "rejected"):  # rejected drawn last: on top where they coincide
        ms = [m for m in tl.markers if m.kind == kind]
        if ms:
            ax.scatter([m.at for m in ms], [m.row + 0.35 for m in ms], c=COLOURS[kind],
                       marker="v" if kind == "rejected" else "o", label=f"pod {kind}", zorder=3)
    for k, m in enumerate(tl.markers):  # stacked, so pods judged at one instant stay legible
        ax.annotate(m.label, (m.at, m.row + 0.35), xytext=(6, -3 - 9 * k),
                    textcoords="offset points", fontsize=7, color=COLOURS[m.kind])
    ax.set_yticks(range(rows), tl.rows or [""])
    ax.set_ylim(rows - 0.5 + 0.3 * len(tl.markers) / max(1, rows), -0.7)
    ax.set_xlim(-tl.length * 0.02, tl.length * 1.25)
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tl.origin))
    ax.set_xlabel(f"seconds since {start}")
    ax.set_title(tl.title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def write(ep: Episode, path: str | Path) -> Timeline:
    """Draw `ep` to `path`; the format follows the suffix (.svg or .png)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ReportError(f"{path}: unknown image format {suffix or '(none)'!r}; "
                          "use a .svg or .png file name")
    tl = build(ep)
    if suffix == ".svg":
        path.write_text(to_svg(tl))
    else:
        figure(tl).savefig(path, format="png")
    return tl
