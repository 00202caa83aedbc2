#!/usr/bin/env python3
"""Generates every monitoring file from one small source, with the site's parameters.

Source (edit these):   alerts/src/rules.yml, dashboards/src/*.yml
Generated (never edit): alerts/node-resize-exporter.rules.yml, alerts/alertmanager-inhibit.yml,
                        dashboards/*.json, deploy/prometheusrule.yaml,
                        deploy/components/dashboards/dashboards.yaml (the dashboards as
                        ConfigMaps for Grafana's dashboard sidecar, kube-prometheus-stack's)

Parameters (the defaults produce the committed files):
  --job-selector 'job="node-resize-exporter"'   selects the exporter's series in the rules; in the
                                                dashboards the default of their `job` variable
                                                (= or =~ only: the variable lists the jobs)
  --cluster-label cluster                       kept by every rule and alert, a dashboard
                                                variable; '' for a single-cluster Prometheus
  --runbook-url 'https://.../runbooks.md#{anchor}'   {anchor}: the alert name in lower case
  --grafana-url ''                              prefix of every alert's dashboard_url; empty: a
                                                path (/d/nre-node-detail/...) that a notification
                                                template prefixes with the Grafana address
  --multi-cluster                               show the dashboards' cluster variable (hidden by
                                                default: one cluster has nothing to choose)

Why a Python script rather than a jsonnet monitoring-mixin: the project is Python and already
depends on PyYAML; jsonnet would add a toolchain (go-jsonnet, jsonnet-bundler, vendored
grafonnet) to CI and to every contributor, for two dashboards and one rule file. The output is
the same plain YAML/JSON a mixin renders, so a jsonnet user can still import it.

Usage: scripts/gen-monitoring.py                  rewrite the committed files
       scripts/gen-monitoring.py --check          exit 1 with a diff when any is out of date
       scripts/gen-monitoring.py --out DIR [...]  write a site's copy with other parameters
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_dashboards import FLEET_OVERVIEW_PATH, NODE_DETAIL_PATH, _expand, dashboard  # noqa: E402  (gen_dashboards.py)

REPO = Path(__file__).resolve().parent.parent
RULES_SRC = REPO / "alerts" / "src" / "rules.yml"
DASHBOARDS_SRC = REPO / "dashboards" / "src"
RULES_OUT = "alerts/node-resize-exporter.rules.yml"
INHIBIT_OUT = "alerts/alertmanager-inhibit.yml"
PROMETHEUSRULE_OUT = "deploy/prometheusrule.yaml"
DASHBOARDS_CONFIGMAPS_OUT = "deploy/components/dashboards/dashboards.yaml"
# What Grafana's dashboard sidecar (grafana chart, as kube-prometheus-stack configures it)
# looks for: ConfigMaps labelled grafana_dashboard (kube-prometheus-stack: value "1", in every
# namespace); the folder annotation is read only where sidecar.dashboards.folderAnnotation
# names it (with provider.foldersFromFilesStructure).
SIDECAR_LABEL = {"grafana_dashboard": "1"}
FOLDER_ANNOTATION = {"grafana_folder": "Node resize"}


@dataclass(frozen=True)
class Params:
    job_selector: str = 'job="node-resize-exporter"'
    cluster_label: str = "cluster"
    runbook_url: str = ("https://github.com/node-resize-exporter/node-resize-exporter/blob/main/"
                        "docs/runbooks.md#{anchor}")
    grafana_url: str = ""
    multi_cluster: bool = False

    def check(self) -> None:
        if self.cluster_label and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.cluster_label):
            raise SystemExit(f"--cluster-label {self.cluster_label!r} is not a label name")
        if self.job_selector and not re.fullmatch(r'\s*\w+\s*(=|=~)\s*"[^"]*"\s*',
                                                  self.job_selector):
            raise SystemExit(f"--job-selector {self.job_selector!r}: expected one = or =~ "
                             'matcher such as job="node-resize-exporter" (the dashboards\' job '
                             "variable starts on it)")
        if "{anchor}" not in self.runbook_url:
            raise SystemExit("--runbook-url must contain {anchor}")
        if self.grafana_url and not re.fullmatch(r"https?://[^\s?#]+[^/\s?#]", self.grafana_url):
            raise SystemExit(f"--grafana-url {self.grafana_url!r}: expected Grafana's base URL "
                             "such as https://grafana.example (no trailing slash), or empty")

    @property
    def by(self) -> str:
        return f"{self.cluster_label}, node" if self.cluster_label else "node"

    def dashboard_url(self) -> str:
        """An alert's dashboard_url: the node-detail dashboard on the alert's node (and
        cluster). Every alert is about one node; the time range is Grafana's default."""
        # The dashboards' variable is `cluster` whatever the label is called.
        params = [f"var-cluster={{{{ $labels.{self.cluster_label} }}}}"] if self.cluster_label \
            else []
        params.append("var-node={{ $labels.node }}")
        return f"{self.grafana_url}{NODE_DETAIL_PATH}?{'&'.join(params)}"

    def fleet_dashboard_url(self) -> str:
        """A fleet-wide alert's dashboard_url: the fleet overview (of the alert's cluster)."""
        params = [f"var-cluster={{{{ $labels.{self.cluster_label} }}}}"] if self.cluster_label \
            else []
        query = f"?{'&'.join(params)}" if params else ""
        return f"{self.grafana_url}{FLEET_OVERVIEW_PATH}{query}"


HEADER = ("# GENERATED by scripts/gen-monitoring.py from {src}: do not edit; change the source "
          "and re-run it.\n")


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Block style keeps multi-line PromQL readable in review; no wrapping (width below) so a
    # template such as {{ $labels.node }} is never split.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _yaml(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True)


# ---------------------------------------------------------------- rules


def _node_query(p: Params, template: str, *extra: tuple[str, str]) -> str:
    """A Go-template `query` argument about the alert's node: `template` with {sel} replaced by
    the job, cluster and node matchers (plus `extra`: (label, template field) pairs, matched
    equal to the alert's own label)."""
    matchers = [p.job_selector] if p.job_selector else []
    args = []
    if p.cluster_label:
        matchers.append(f'{p.cluster_label}="%s"')
        args.append(f"$labels.{p.cluster_label}")
    matchers.append('node="%s"')
    args.append("$labels.node")
    for label, field in extra:
        matchers.append(f'{label}="%s"')
        args.append(field)
    return f"(printf `{template.format(sel=','.join(matchers))}` {' '.join(args)})"


def _blocked_query(p: Params) -> str:
    """The capacity alerts' `query`: restart_blocked of the node."""
    return _node_query(p, "node_resize_kubelet_restart_blocked{{{sel}}} == 1")


def _forecast_query(p: Params) -> str:
    """NodeResizeCapacityStale's `query`: the reasons a restart of the node would reject pods."""
    return _node_query(p, "node_resize_readmission_forecast_rejected_pods{{{sel}}} > 0")


def _forecast_pods_query(p: Params) -> str:
    """NodeResizeRestartWouldRejectPods's `query`: the first five pods named for its reason."""
    return _node_query(p, "topk(5, node_resize_readmission_forecast_rejected{{{sel}}})",
                       ("reason", "$labels.reason"))


def _fleet_wide(rule: dict) -> bool:
    """An alert about the whole job (an absent() rule): no node to open a dashboard on."""
    return "absent(" in rule["expr"]


def rules(p: Params) -> dict:
    text = _expand(
        RULES_SRC.read_text(),
        {"job": p.job_selector, "by": p.by, "blocked": _blocked_query(p),
         "forecast": _forecast_query(p), "forecast_pods": _forecast_pods_query(p)},
        str(RULES_SRC),
    )
    data = yaml.safe_load(text)
    for group in data["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = p.runbook_url.format(
                    anchor=rule["alert"].lower()
                )
                rule["annotations"]["dashboard_url"] = (
                    p.fleet_dashboard_url() if _fleet_wide(rule) else p.dashboard_url())
            for key in ("expr", *rule.get("annotations", {})):
                target = rule if key == "expr" else rule["annotations"]
                # Folded source lines leave trailing blanks; keep the output tidy.
                target[key] = "\n".join(line.rstrip() for line in target[key].splitlines()) + (
                    "\n" if key == "expr" and "\n" in target[key].strip() else ""
                )
                if key != "expr":
                    target[key] = target[key].strip()
    return data


def inhibit_rules(p: Params) -> dict:
    """An Alertmanager configuration whose inhibit_rules are the point (route and receiver are
    placeholders so `amtool check-config` accepts it as it is)."""
    equal = [p.cluster_label, "node"] if p.cluster_label else ["node"]
    return {
        "route": {"receiver": "default", "group_by": ["alertname", *equal, "resource"]},
        "receivers": [{"name": "default"}],
        "inhibit_rules": [
            # Nothing the exporter says about a node it cannot be scraped on is current.
            {
                "source_matchers": ['alertname="NodeResizeExporterDown"'],
                "target_matchers": [
                    'alertname=~"NodeResize.+"',
                    'alertname!="NodeResizeExporterDown"',
                ],
                "equal": equal,
            },
            # Without the Node watch the kubelet side of every judgement is stale.
            {
                "source_matchers": [
                    'alertname="NodeResizeExporterSourceDown"',
                    'source=~"kube_node|kube_pods"',
                ],
                "target_matchers": [
                    'alertname=~"NodeResize(CapacityStale|CapacityStranded|'
                    'ReadmissionRejectedPods|PodresourcesOfflineCPUs)"'
                ],
                "equal": equal,
            },
            # A node whose capacity is stale: its informational notices are the same story and
            # wait until the warning is handled.
            {
                "source_matchers": ['alertname="NodeResizeCapacityStale"'],
                "target_matchers": ['alertname=~"NodeResize.+"', 'severity="info"'],
                "equal": equal,
            },
            # A CPU the kubelet offers although it is offline, on a node whose CPU capacity is
            # stale, is that same cause (the rule already says so; this covers evaluation skew).
            {
                "source_matchers": ['alertname="NodeResizeCapacityStale"', 'resource="cpu"'],
                "target_matchers": ['alertname="NodeResizePodresourcesOfflineCPUs"'],
                "equal": equal,
            },
        ],
    }


def prometheusrule(data: dict) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "node-resize-exporter",
            "labels": {
                "app.kubernetes.io/name": "node-resize-exporter",
                "app.kubernetes.io/component": "alerting",
            },
        },
        "spec": {"groups": data["groups"]},
    }




def dashboard_configmaps(boards: dict[str, str]) -> str:
    """The committed dashboards (file name -> JSON text) as ConfigMaps for Grafana's sidecar,
    one per dashboard (a ConfigMap holds 1 MiB; `kubectl apply` keeps a copy in an annotation
    limited to 256 KiB), the JSON byte for byte as committed in dashboards/."""
    docs = []
    for name, text in sorted(boards.items()):
        stem = Path(name).stem
        docs.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"node-resize-exporter-dashboard-{stem}",
                         "namespace": "node-resize-exporter",
                         "labels": {**SIDECAR_LABEL,
                                    "app.kubernetes.io/name": "node-resize-exporter",
                                    "app.kubernetes.io/component": "dashboards"},
                         "annotations": dict(FOLDER_ANNOTATION)},
            # The sidecar writes each key as a file of that name: unique among all dashboards.
            "data": {f"node-resize-exporter-{stem}.json": text}})
    return "---\n".join(_yaml(doc) for doc in docs)


# ---------------------------------------------------------------- output


def render(p: Params = Params()) -> dict[str, str]:
    """Relative path -> file text, for every generated file."""
    p.check()
    data = rules(p)
    rel_src = RULES_SRC.relative_to(REPO)
    out = {
        RULES_OUT: HEADER.format(src=rel_src) + _yaml(data),
        INHIBIT_OUT: HEADER.format(src="scripts/gen-monitoring.py")
        + "# Example Alertmanager inhibit rules for the NodeResize* alerts: copy inhibit_rules\n"
        "# into your configuration (route and receiver here are placeholders).\n"
        + _yaml(inhibit_rules(p)),
        PROMETHEUSRULE_OUT: HEADER.format(src=rel_src) + _yaml(prometheusrule(data)),
    }
    boards = {}
    for src in sorted(DASHBOARDS_SRC.glob("*.yml")):
        spec = yaml.safe_load(src.read_text())
        board = dashboard(spec, p, str(src.relative_to(REPO)))
        boards[f"{src.stem}.json"] = json.dumps(board, indent=2) + "\n"
    out.update({f"dashboards/{name}": text for name, text in boards.items()})
    out[DASHBOARDS_CONFIGMAPS_OUT] = HEADER.format(src="dashboards/src/*.yml") + (
        "# Grafana's dashboard sidecar loads these: deploy/components/dashboards.\n---\n"
        + dashboard_configmaps(boards))
    return out


def check(files: dict[str, str], root: Path) -> list[str]:
    """Diffs of every file under root that differs from what would be generated."""
    diffs = []
    for rel, wanted in files.items():
        path = root / rel
        current = path.read_text() if path.exists() else ""
        if current != wanted:
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        current.splitlines(keepends=True),
                        wanted.splitlines(keepends=True),
                        rel,
                        f"{rel} (generated)",
                    )
                )
            )
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write under this directory instead of the repository",
    )
    defaults = Params()
    parser.add_argument("--job-selector", default=defaults.job_selector)
    parser.add_argument("--cluster-label", default=defaults.cluster_label)
    parser.add_argument("--runbook-url", default=defaults.runbook_url)
    parser.add_argument("--grafana-url", default=defaults.grafana_url)
    parser.add_argument("--multi-cluster", action="store_true",
                        help="show the dashboards' cluster variable")
    args = parser.parse_args(argv)
    files = render(Params(args.job_selector, args.cluster_label, args.runbook_url,
                          args.grafana_url, args.multi_cluster))
    root = args.out or REPO
    if args.check:
        diffs = check(files, root)
        if diffs:
            sys.stdout.write("\n".join(diffs))
            print("\nstale generated files: run scripts/gen-monitoring.py", file=sys.stderr)
            return 1
        return 0
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
