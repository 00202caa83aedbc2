"""The one renderer of an episode picture: a matplotlib Figure, saved as PNG or SVG.

Kernel steps last milliseconds and resync waits minutes, so the time axis is symmetric-log:
linear for the first 10 ms (where a transition starts at 0), logarithmic beyond, ticks named in
ms / s / min. Every text is placed, measured and moved until it lies inside the figure: a label
that would leave the plot goes to the other side of its bar, then inside it; pods are listed
under the plot, rejected ones first and in red, numbered like their markers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.correlate.model import Episode
from exporter.report.timeline import Marker, ReportError, Timeline, build, seconds, utc

COLOURS = {"transition": "#4878d0", "failed": "#d65f5f", "resync": "#6acc64",
           "waiting": "#ee854a", "readmission": "#956cb4", "rejected": "#d62728",
           "kept": "#2ca02c", "restart": "#e08a00"}
LINTHRESH = 0.01  # s: the linear part of the axis (a 1 ms step is still 1/10 of it)
MAX_PODS_LISTED = 12
NUMBERED_MARKERS = 6
TICKS = [(0.0, "0"), (0.01, "10 ms"), (0.1, "100 ms"), (1.0, "1 s"),
         (10.0, "10 s"), (60.0, "1 min"), (600.0, "10 min"), (3600.0, "1 h"), (36000.0, "10 h"),
         (360000.0, "100 h")]
# Between the decades: 2 and 5 times (20 and 30 where the next step is a minute or an hour).
MINOR_TICKS = [(0.02, "20 ms"), (0.05, "50 ms"), (0.2, "200 ms"), (0.5, "500 ms"), (2.0, "2 s"),
               (5.0, "5 s"), (20.0, "20 s"), (30.0, "30 s"), (120.0, "2 min"),
               (300.0, "5 min"), (1200.0, "20 min"), (1800.0, "30 min"), (7200.0, "2 h"),
               (18000.0, "5 h"), (72000.0, "20 h"), (180000.0, "50 h")]
MINOR_LABEL_DECADE_PX = 150  # minor ticks are named where a decade is at least this wide
TITLE_CHARS = 90  # longer headlines break after a "; " (13 pt bold: ~10.5 px a character)
WIDTH_IN, ROW_IN, LINE_IN = 11.0, 0.55, 0.2


# matplotlib is an optional extra, imported when a picture is drawn: its Figure, Axes and
# Text objects pass through here as Any.
def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("pictures need matplotlib: pip install 'node-resize-exporter[report]'"
                          ) from None
    return Figure


def _pod_lines(tl: Timeline) -> list[tuple[str, str]]:
    """(text, kind) for the list under the plot: rejected first, then kept, capped."""
    order = sorted(range(len(tl.markers)),
                   key=lambda i: (tl.markers[i].kind != "rejected", tl.markers[i].at))
    lines = []
    for i in order[:MAX_PODS_LISTED]:
        m = tl.markers[i]
        verb = "REJECTED" if m.kind == "rejected" else "kept"
        label = _elide(m.label.replace(" rejected", "").replace(" kept", ""), 80)
        lines.append((f"[{i + 1}] {verb}: {label} at +{seconds(m.at)} "
                      f"({utc(tl.origin + m.at, date=False)})", m.kind))
    if len(order) > MAX_PODS_LISTED:
        lines.append((f"... and {len(order) - MAX_PODS_LISTED} more pods: "
                      "`node-resize-exporter episodes show ID` lists them all", "kept"))
    return lines


def _elide(words: str, limit: int) -> str:
    """Long names (pod names reach 253 characters) keep their ends, which tell pods apart."""
    if len(words) <= limit:
        return words
    keep = (limit - 3) // 2
    return f"{words[:keep]}...{words[-keep:]}"


def draw(tl: Timeline) -> Any:
    """The Figure for a timeline (Agg canvas: no display needed)."""
    Figure = _figure_class()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = max(1, len(tl.rows))
    pods = _pod_lines(tl)
    title = _wrap(tl.title)
    header_in, axis_in = 0.9 + 0.25 * title.count("\n"), 0.75
    height = header_in + ROW_IN * rows + axis_in + (LINE_IN * (len(pods) + 1) if pods else 0) \
        + (LINE_IN * 1.5 if tl.forecast else 0)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=100)
    FigureCanvasAgg(fig)
    top = 1 - header_in / height
    bottom = (height - header_in - ROW_IN * rows) / height
    ax = fig.add_axes((0.17, bottom, 0.80, top - bottom))

    fig.text(0.01, 1 - 0.15 / height, title, fontsize=13, weight="bold",
             color=COLOURS["rejected"] if tl.bad else "black", va="top", linespacing=1.3)
    fig.text(0.01, 1 - (header_in - 0.3) / height, tl.subtitle, fontsize=9, color="#333333",
             va="center")
    _time_axis(ax, tl, rows)
    labels = _plot(ax, tl)

    y = bottom - axis_in / height
    if tl.forecast:  # what the exporter said a restart would reject, before it happened
        fig.text(0.01, y, _elide(tl.forecast, 150), fontsize=9, style="italic", va="top",
                 color="#333333")
        y -= LINE_IN * 1.5 / height
    if pods:
        fig.text(0.01, y, "Pods judged at readmission:", fontsize=9, weight="bold", va="top")
        for k, (line, kind) in enumerate(pods, 1):
            rejected = kind == "rejected"
            fig.text(0.03, y - k * LINE_IN / height, line, fontsize=9, va="top",
                     color=COLOURS["rejected"] if rejected else "#333333",
                     weight="bold" if rejected else "normal")
    _keep_inside(fig, ax, labels)
    return fig


def _time_axis(ax: Any, tl: Timeline, rows: int) -> None:
    """The symmetric-log time axis, its named ticks, one row per lane."""
    end = axis_end(tl.length)
    ax.set_xscale("symlog", linthresh=LINTHRESH, linscale=0.6)
    ax.set_xlim(0, end)
    ax.set_ylim(rows - 0.5, -0.5)
    ticks = [(t, name) for t, name in TICKS if t <= end]
    ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks])
    minor = [(t, name) for t, name in MINOR_TICKS if t < end]
    decade = ax.transData.transform((1.0, 0))[0] - ax.transData.transform((0.1, 0))[0]
    named = decade >= MINOR_LABEL_DECADE_PX  # else their names would run into each other
    ax.set_xticks([t for t, _ in minor], [name if named else "" for _, name in minor],
                  minor=True, fontsize=8, color="#555555")
    ax.tick_params(axis="x", which="minor", length=3)
    ax.set_yticks(range(rows), tl.rows or [""], fontsize=9)
    ax.grid(axis="x", which="major", alpha=0.3)
    ax.grid(axis="x", which="minor", alpha=0.12)
    ax.set_xlabel(f"time since {utc(tl.origin)} (linear to 10 ms, then logarithmic)",
                  fontsize=9)


def _plot(ax: Any, tl: Timeline) -> list[Any]:
    """Bars, pod markers and instants; returns the labels _keep_inside must place."""
    labels = []
    for b in tl.bars:
        b = b if len(b.label) <= 90 else type(b)(b.row, _elide(b.label, 90), b.start, b.end,
                                                 b.kind)
        ax.barh(b.row, max(b.end - b.start, 0.0), left=b.start, height=0.5,
                color=COLOURS[b.kind], edgecolor=COLOURS[b.kind], linewidth=1.5)
        labels.append((ax.annotate(b.label, (b.end, b.row), xytext=(4, 0),
                                   textcoords="offset points", va="center", fontsize=8,
                                   annotation_clip=False), b))
    for m in tl.markers:
        rejected = m.kind == "rejected"
        ax.scatter([m.at], [m.row + 0.32], c=COLOURS[m.kind], marker="X" if rejected else "o",
                   s=70 if rejected else 30, zorder=4 if rejected else 3)
    if len(tl.markers) <= NUMBERED_MARKERS:  # more would pile up; the list has them all
        _number_markers(ax, tl)
    for m in tl.instants:
        labels.append(_draw_instant(ax, m))
    return labels


def axis_end(length: float) -> float:
    """The first labelled tick at or beyond the episode's end (with a little room for the
    last marker): the reader always has a named tick on each side of every bar's end."""
    wanted = max(length * 1.05, LINTHRESH)
    return next((t for t, _ in TICKS if t >= wanted), wanted)


def _wrap(title: str) -> str:
    """A long headline breaks after the "; " nearest its middle (the sentence's clauses)."""
    if len(title) <= TITLE_CHARS or "; " not in title:
        return title
    cuts = [i for i in range(len(title)) if title.startswith("; ", i)]
    cut = min(cuts, key=lambda i: abs(i - len(title) / 2))
    return f"{title[:cut + 1]}\n{title[cut + 2:]}"


def _draw_instant(ax: Any, m: Marker) -> tuple[Any, Any]:
    """An instant on its row (a transition without a start, the kubelet restart), labelled;
    returned as (text, a zero-width Bar) so it is kept inside the figure like a bar label."""
    from exporter.report.timeline import Bar
    restart = m.kind == "restart"
    ax.scatter([m.at], [m.row - 0.32 if restart else m.row], c=COLOURS[m.kind],
               marker="v" if restart else "D", s=60 if restart else 40, zorder=5,
               edgecolors="black", linewidths=0.5)
    if restart:
        text = ax.annotate(m.label, (m.at, m.row - 0.32), xytext=(0, 5),
                           textcoords="offset points", ha="center", va="bottom", fontsize=8,
                           color=COLOURS["restart"], weight="bold", annotation_clip=False)
    else:
        text = ax.annotate(m.label, (m.at, m.row), xytext=(7, 0), textcoords="offset points",
                           va="center", fontsize=8, annotation_clip=False)
    return text, Bar(m.row, m.label, m.at, m.at, m.kind)


def _number_markers(ax: Any, tl: Timeline) -> None:
    """One label per place: pods judged at the same instant share it ("1, 2")."""
    places: list[tuple[float, list[int]]] = []  # (x in pixels, marker numbers)
    for i, m in enumerate(tl.markers):
        x = ax.transData.transform((m.at, 0))[0]
        near = [p for p in places if abs(p[0] - x) < 10]
        if near:
            near[0][1].append(i)
        else:
            places.append((x, [i]))
    for _, numbers in places:
        first = tl.markers[numbers[0]]
        rejected = any(tl.markers[i].kind == "rejected" for i in numbers)
        ax.annotate(", ".join(str(i + 1) for i in numbers), (first.at, first.row + 0.32),
                    xytext=(0, -9), textcoords="offset points", ha="center", va="top",
                    fontsize=7, color=COLOURS["rejected" if rejected else "kept"],
                    weight="bold" if rejected else "normal", annotation_clip=False)


def _keep_inside(fig: Any, ax: Any, labels: list[Any]) -> None:
    """Move each bar label that leaves the plot: left of its bar, else inside it in white."""
    renderer = fig.canvas.get_renderer()
    right, left = ax.bbox.x1, ax.bbox.x0
    for text, bar in labels:
        if text.get_window_extent(renderer).x1 <= right:
            continue
        text.xy = (bar.start, bar.row)
        text.set_position((-4, 0))
        text.set_horizontalalignment("right")
        if text.get_window_extent(renderer).x0 >= left:
            continue
        x0, x1 = (ax.transData.transform((t, bar.row))[0] for t in (bar.start, bar.end))
        text.xy = (ax.transData.inverted().transform(((x0 + x1) / 2, 0))[0], bar.row)
        text.set_position((0, 0))
        text.set_horizontalalignment("center")
        text.set_color("white")
        text.set_weight("bold")


def texts_outside(fig: Any) -> list[str]:
    """Every visible text whose box leaves the figure (empty when nothing is clipped)."""
    from matplotlib.text import Text
    fig.canvas.draw()  # tick and axis labels are placed at draw time
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        e = t.get_window_extent(renderer)
        if e.x0 < box.x0 - 0.5 or e.y0 < box.y0 - 0.5 or e.x1 > box.x1 + 0.5 \
                or e.y1 > box.y1 + 0.5:
            out.append(f"{t.get_text()!r} at {e.bounds}")
    return out


def save(fig: Any, path: Path) -> None:
    """PNG or SVG of the same figure; SVG keeps texts as text (searchable, testable)."""
    import matplotlib
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "episode"}):
        fig.savefig(path, format=path.suffix.lower().lstrip("."),
                    metadata={"Date": None} if path.suffix.lower() == ".svg" else None)


def write(ep: Episode, path: str | Path, node: str | None = None) -> Timeline:
    """Draw `ep` to `path`; the format follows the suffix (.svg or .png), one renderer."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ReportError(f"{path}: unknown image format {suffix or '(none)'!r}; "
                          "use a .svg or .png file name")
    tl = build(ep, node)
    save(draw(tl), path)
    return tl
