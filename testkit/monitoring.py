"""The PromQL of the committed dashboards and rules, as tests read it."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "node-resize-exporter.rules.yml"


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def walk(node):
    """Every dict in a JSON tree (panels inside rows, targets inside panels)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)



def recorded_rules() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target, annotation and variable query."""
    out = []
    panels = [p for p in walk(dashboard.get("panels", [])) if "targets" in p]
    for panel in panels:
        for target in panel["targets"]:
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for ann in dashboard["annotations"]["list"]:
        if "expr" in ann:
            out.append((f"annotation {ann['name']!r}", ann["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert m, f"variable {var['name']}: expected label_values(<selector>, <label>)"
            out.append((f"variable {var['name']!r}", m.group(1)))
    return out


def as_promql(expr: str, node: str = "node-a", cluster: str = "") -> str:
    """Grafana's variables replaced by values Prometheus would receive (cluster "" matches
    series without the label, as a single-cluster Prometheus has them)."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", lambda m: {
        "rate_interval": "1m", "interval": "1m", "range": "1h"}[m.group(1)], expr)
    expr = re.sub(r"\$\{?cluster\}?", cluster, expr)
    return re.sub(r"\$\{?(\w+)\}?", node, expr)
