"""docs/security.md says what /metrics exposes: every family that carries a pod's name
(a `pod` label, docs/metrics.md's reference table) is named in its "What it exposes" section,
which no longer claims "no pod names"."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _exposes_section() -> str:
    text = (REPO / "docs" / "security.md").read_text()
    start = text.index("## What it exposes")
    return text[start:text.index("\n## ", start + 1)]


def test_every_family_with_a_pod_label_is_named_where_metrics_exposure_is_described():
    rows = re.findall(r"^\| `(node_\w+)` \| \w+ \| ([^|]*) \|", (REPO / "docs" / "metrics.md")
                      .read_text(), re.M)
    with_pods = {name for name, labels in rows if re.search(r"`pod`", labels)}
    assert with_pods, "docs/metrics.md's table changed shape"
    section = _exposes_section()
    for name in with_pods:
        assert name in section, name
    assert "no pod\n  names" not in section and "no pod names" not in section
