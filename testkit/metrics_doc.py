"""docs/metrics.md, the metric catalogue, read as rows: one table row per metric.

A row is `| `name` | type | labels | meaning | source |`; the labels cell names each label in
backticks (its values in parentheses after it) or is `-`. Read by tests/e2e/test_catalogue.py (the
catalogue against a real scrape) and tests/e2e/test_alerts.py (names the rules and dashboards use).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

CATALOGUE = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
TYPES = {"counter", "gauge", "histogram"}


@dataclass(frozen=True)
class Row:
    name: str
    type: str
    labels: frozenset[str]
    line: int  # in docs/metrics.md, for failure messages
    # label -> the values the row lists in parentheses after it (absent: not listed)
    values: dict[str, frozenset[str]] = field(default_factory=dict, compare=False)
    meaning: str = field(default="", compare=False)  # the row's fourth cell


def rows(path: Path = CATALOGUE) -> dict[str, Row]:
    found: dict[str, Row] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"{path.name}:{number}: want 5 cells, got {len(cells)}: {line}"
        name, kind, labels = cells[0].strip("`"), cells[1], cells[2]
        assert kind in TYPES, f"{path.name}:{number}: type {kind!r} is not one of {sorted(TYPES)}"
        assert name not in found, f"{path.name}:{number}: {name} listed twice"
        values = {label: frozenset(v.strip() for v in listed.split(","))
                  for label, listed in re.findall(r"`([a-z_]+)` \(([a-z0-9_, ]+)\)", labels)}
        found[name] = Row(name, kind, frozenset(re.findall(r"`([a-z_]+)`", labels)), number,
                          values, cells[3])
    return found


def sample_names(row: Row) -> set[str]:
    """The sample names a row's family shows (a histogram's three series)."""
    if row.type == "histogram":
        return {f"{row.name}_bucket", f"{row.name}_sum", f"{row.name}_count"}
    return {row.name}
