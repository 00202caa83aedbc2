#!/usr/bin/env python3
"""Generates every monitoring file from the monitoring mixin (mixin/), with the site's parameters.

Source (edit these):   mixin/ (config.libsonnet's _config; rules/, alerts/, dashboards/, lib/),
                       evaluated with go-jsonnet (PyPI's gojsonnet, in the test extra)
Generated (never edit): alerts/node-resize-exporter.rules.yml (every group, for a plain
                        Prometheus), alerts/alertmanager-inhibit.yml, dashboards/*.json,
                        deploy/prometheusrule.yaml (the per-node groups),
                        deploy/prometheusrule-global.yaml (the groups for the global ruler,
                        among them the absent guard: its own object),
                        alerts/kube-prometheus-stack-values.yaml (the same groups as Helm values
                        for kube-prometheus-stack's additionalPrometheusRulesMap: they load
                        whatever label our objects carry),
                        deploy/components/dashboards/dashboards.yaml (the dashboards as
                        ConfigMaps for Grafana's dashboard sidecar, kube-prometheus-stack's)

Parameters (the defaults produce the committed files; each sets one _config field):
  --job-selector 'job="node-resize-exporter"'   jobSelector: the exporter's series in the rules;
                                                in the dashboards the default of their `job`
                                                variable (= or =~ only: the variable lists jobs)
  --cluster-label cluster                       clusterLabel: kept by every rule and alert, a
                                                dashboard variable; '' for one cluster
  --namespace-label namespace                   namespaceLabel: the exporter's namespace, kept
                                                by every alert; '' aggregates it away
  --namespace node-resize-exporter              exporterNamespace: the fleet-wide alerts' label
  --runbook-url 'https://.../runbooks.md#{anchor}'   {anchor}: the alert name in lower case
  --grafana-url ''                              prefix of every alert's dashboard_url; empty: a
                                                path (/d/nre-node-detail/...) that a notification
                                                template prefixes with the Grafana address
  --multi-cluster                               show the dashboards' cluster variable

A jsonnet user imports mixin/mixin.libsonnet instead and overrides _config there.

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

REPO = Path(__file__).resolve().parent.parent
MIXIN = REPO / "mixin"
RULES_OUT = "alerts/node-resize-exporter.rules.yml"
INHIBIT_OUT = "alerts/alertmanager-inhibit.yml"
KPS_VALUES_OUT = "alerts/kube-prometheus-stack-values.yaml"
PROMETHEUSRULE_OUT = "deploy/prometheusrule.yaml"
PROMETHEUSRULE_GLOBAL_OUT = "deploy/prometheusrule-global.yaml"
DASHBOARDS_CONFIGMAPS_OUT = "deploy/components/dashboards/dashboards.yaml"
# What Grafana's dashboard sidecar (grafana chart, as kube-prometheus-stack configures it)
# looks for: ConfigMaps labelled grafana_dashboard (kube-prometheus-stack: value "1", in every
# namespace); the folder annotation is read only where sidecar.dashboards.folderAnnotation
# names it (with provider.foldersFromFilesStructure).
SIDECAR_LABEL = {"grafana_dashboard": "1"}
FOLDER_ANNOTATION = {"grafana_folder": "Node resize"}
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"


@dataclass(frozen=True)
class Params:
    job_selector: str = 'job="node-resize-exporter"'
    cluster_label: str = "cluster"
    runbook_url: str = ("https://github.com/node-resize-exporter/node-resize-exporter/blob/main/"
                        "docs/runbooks.md#{anchor}")
    grafana_url: str = ""
    multi_cluster: bool = False
    namespace_label: str = "namespace"
    namespace: str = "node-resize-exporter"

    def check(self) -> None:
        for option, label in (("--cluster-label", self.cluster_label),
                              ("--namespace-label", self.namespace_label)):
            if label and not re.fullmatch(LABEL_NAME, label):
                raise SystemExit(f"{option} {label!r} is not a label name")
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
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.namespace):
            raise SystemExit(f"--namespace {self.namespace!r} is not a namespace name")

    def config(self) -> dict:
        """The mixin's _config fields these parameters set."""
        return {"jobSelector": self.job_selector, "clusterLabel": self.cluster_label,
                "namespaceLabel": self.namespace_label, "exporterNamespace": self.namespace,
                "runbookURLPattern": self.runbook_url.replace("%", "%%")
                .replace("{anchor}", "%s"),
                "grafanaURL": self.grafana_url, "showMultiCluster": self.multi_cluster}


def evaluate(p: Params = Params(), expr: str = "") -> dict:
    """The mixin with p's _config, as JSON: `expr` (jsonnet, `mixin` in scope) or its rules,
    alerts, dashboards, inhibit rules and global group suffix."""
    try:
        import _gojsonnet  # gojsonnet (test extra): only the generator needs it
    except ImportError:
        print("gen-monitoring: go-jsonnet is not installed: run scripts/setup.sh test (or "
              "pip install gojsonnet)", file=sys.stderr)
        raise SystemExit(2) from None

    snippet = ("local mixin = (import 'mixin.libsonnet') + { _config+:: std.extVar('config') };\n"
               + (expr or "{ rules: mixin.prometheusRules, alerts: mixin.prometheusAlerts, "
                  "dashboards: mixin.grafanaDashboards, alertmanager: mixin.alertmanagerConfig, "
                  "globalSuffix: mixin._config.globalGroupSuffix }"))
    try:
        text = _gojsonnet.evaluate_snippet("gen-monitoring", snippet, jpathdir=[str(MIXIN)],
                                           ext_codes={"config": json.dumps(p.config())})
    except RuntimeError as err:
        raise SystemExit(f"mixin/: {err}") from None
    return json.loads(text)


HEADER = ("# GENERATED by scripts/gen-monitoring.py from mixin/: do not edit; change the mixin "
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


# jsonnet sorts an object's fields; a rule reads best in Prometheus's documented order.
RULE_ORDER = ("record", "alert", "expr", "for", "labels", "annotations")
ANNOTATION_ORDER = ("summary", "description", "runbook_url", "dashboard_url")


def _ordered(d: dict, order: tuple[str, ...]) -> dict:
    return {**{k: d[k] for k in order if k in d}, **{k: v for k, v in d.items() if k not in order}}


def _groups(groups: list[dict]) -> list[dict]:
    out = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            rule = _ordered(rule, RULE_ORDER)
            if "annotations" in rule:
                rule["annotations"] = _ordered(rule["annotations"], ANNOTATION_ORDER)
            rules.append(rule)
        out.append(_ordered({**group, "rules": rules}, ("name", "rules")))
    return out


def prometheusrule(name: str, groups: list[dict], comment: str) -> str:
    return comment + _yaml({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "node-resize-exporter",
                "app.kubernetes.io/component": "alerting",
            },
        },
        "spec": {"groups": groups},
    })


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
    mixin = evaluate(p)
    groups = _groups(mixin["rules"]["groups"] + mixin["alerts"]["groups"])
    is_global = [g["name"].endswith(mixin["globalSuffix"]) for g in groups]
    local = [g for g, glob in zip(groups, is_global) if not glob]
    fleet = [g for g, glob in zip(groups, is_global) if glob]
    out = {
        RULES_OUT: HEADER + _yaml({"groups": groups}),
        INHIBIT_OUT: HEADER
        + "# Example Alertmanager inhibit rules for the NodeResize* alerts: copy inhibit_rules\n"
        "# into your configuration (route and receiver here are placeholders).\n"
        + _yaml(_ordered({**mixin["alertmanager"], "inhibit_rules": [
            _ordered(r, ("source_matchers", "target_matchers", "equal"))
            for r in mixin["alertmanager"]["inhibit_rules"]]}, ("route", "receivers"))),
        PROMETHEUSRULE_OUT: prometheusrule(
            "node-resize-exporter", local, HEADER
            + "# The per-node groups: correct on the one Prometheus (or shard) that scrapes the "
            "node.\n"),
        PROMETHEUSRULE_GLOBAL_OUT: prometheusrule(
            "node-resize-exporter-global", fleet, HEADER
            + "# The groups that read more than one target (the absent guard, the join with the\n"
            "# kubelet's series): for the global ruler where scrapes are sharded. Its own object,\n"
            "# so the absent guard loads even where the main object is not selected (or use\n"
            f"# {KPS_VALUES_OUT}).\n"),
        KPS_VALUES_OUT: HEADER
        + "# The global groups (the absent guard among them) as kube-prometheus-stack values: the\n"
        "# chart labels this rule object with its own release, so its Prometheus loads it\n"
        "# whatever label deploy/ sets. helm upgrade ... -f this file (merge by hand if your\n"
        "# values already have additionalPrometheusRulesMap); then drop\n"
        f"# {PROMETHEUSRULE_GLOBAL_OUT} from your deploy, or the alerts fire twice.\n"
        + _yaml({"additionalPrometheusRulesMap": {"node-resize-exporter-global":
                                                  {"groups": fleet}}}),
    }
    boards = {name: json.dumps(board, indent=2) + "\n"
              for name, board in sorted(mixin["dashboards"].items())}
    out.update({f"dashboards/{name}": text for name, text in boards.items()})
    out[DASHBOARDS_CONFIGMAPS_OUT] = HEADER + (
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
            diffs.append("".join(difflib.unified_diff(
                current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                rel, f"{rel} (generated)")))
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    parser.add_argument("--out", type=Path, default=None,
                        help="write under this directory instead of the repository")
    defaults = Params()
    parser.add_argument("--job-selector", default=defaults.job_selector)
    parser.add_argument("--cluster-label", default=defaults.cluster_label)
    parser.add_argument("--namespace-label", default=defaults.namespace_label)
    parser.add_argument("--namespace", default=defaults.namespace)
    parser.add_argument("--runbook-url", default=defaults.runbook_url)
    parser.add_argument("--grafana-url", default=defaults.grafana_url)
    parser.add_argument("--multi-cluster", action="store_true",
                        help="show the dashboards' cluster variable")
    args = parser.parse_args(argv)
    files = render(Params(args.job_selector, args.cluster_label, args.runbook_url,
                          args.grafana_url, args.multi_cluster, args.namespace_label,
                          args.namespace))
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
