"""The path a user's Prometheus takes: the shipped ServiceMonitor (deploy/servicemonitor.yaml)
rendered into the scrape job prometheus-operator generates for it (testkit/prometheus.py, from
the operator's pkg/prometheus/promcfg.go: target labels namespace, pod, container, service,
endpoint, job, node from the ServiceMonitor's relabeling, honor_labels), Debian's real
Prometheus scraping a running exporter with it over TLS with a bearer token the exporter checks
against the test API server, as Prometheus's own service account's would be.

Debian's Prometheus has no Kubernetes discovery: the target comes from a file carrying the
__meta_kubernetes_* labels the endpoints role would set for the DaemonSet's pod, so the same
relabelings apply. The token file is the only path changed (the ServiceMonitor names the one
the kubelet mounts into the Prometheus pod).

What it asserts is what the dashboards, alerts and runbooks read: every family arrives with its
own labels unrenamed (no exported_*), the target labels on every series, and the forecast's
namespace and pod are the pod a kubelet restart would reject, not the exporter's. A second job,
the same rendering with honor_labels off, shows what the test catches: exported_pod.
"""
from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest
import yaml

from testkit import metrics_doc
from testkit.deploy import container_of, load_manifest
from testkit.exporter_proc import RunningExporter, free_port
from testkit.fakes.apiserver import FakeApiServer
from testkit.kubeauth import bearer_get
from testkit.monitoring import dashboard_exprs, recorded_rules, rule_groups
from testkit.prometheus import (
    Daemon,
    get_json,
    kubernetes_target,
    servicemonitor_scrape_config,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
NODE, EXPORTER_POD = "sm-node", "node-resize-exporter-x7k2p"
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "service", "endpoint",
                 "node"}

pytestmark = pytest.mark.promtool


def _online_cpus() -> int:
    total = 0
    for part in Path("/sys/devices/system/cpu/online").read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


class TlsExporter(RunningExporter):
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        got = bearer_get(self.port, "/healthz", timeout=1)
        return isinstance(got, tuple) and got[0] == 200


def _prometheus_account() -> str:
    """kube-prometheus-stack's Prometheus account, as deploy/ grants it get on /metrics."""
    subjects = load_manifest("scrape-clusterrolebinding.yaml")["subjects"]
    (sa,) = [s for s in subjects if s["name"] == "kube-prometheus-stack-prometheus"]
    return f"system:serviceaccount:{sa['namespace']}:{sa['name']}"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """(Prometheus URL, the exporter's own scrape text) once Prometheus holds the forecast."""
    work = tmp_path_factory.mktemp("servicemonitor")
    cpus = _online_cpus()
    with FakeApiServer() as api:
        api.set_node(NODE, cpu=str(cpus), allocatable_cpu=f"{cpus * 1000 - 500}m")
        api.put_pod("web-1", namespace="shop", node=NODE, requests={"cpu": "1"})
        api.put_pod("web-2", namespace="shop", node=NODE, requests={"cpu": str(cpus)})
        api.add_token("prometheus-token", _prometheus_account())
        api.allow_path(f"user:{_prometheus_account()}")
        kubeconfig = api.write_kubeconfig(str(work / "kubeconfig"))
        with TlsExporter("--source", "sysfs", "--kubeconfig", kubeconfig, "--node-name", NODE,
                         "--web.auth", "kubernetes", "--podresources-socket", "",
                         "--kubelet-root-dir", "") as exp:
            yield from _with_prometheus(work, exp)


def _with_prometheus(work: Path, exp: TlsExporter):
    monitor = load_manifest("servicemonitor.yaml")
    service = load_manifest("service.yaml")
    container = container_of(load_manifest("daemonset.yaml"))
    (token := work / "token").write_text("prometheus-token")
    target = kubernetes_target(
        f"127.0.0.1:{exp.port}", namespace=service["metadata"]["namespace"],
        service=service["metadata"]["name"], pod=EXPORTER_POD, container=container["name"],
        node=NODE, port_name=service["spec"]["ports"][0]["name"],
        service_labels=service["metadata"]["labels"])
    (work / "targets.yml").write_text(yaml.safe_dump([target]))
    shipped = servicemonitor_scrape_config(monitor, 0, str(work / "targets.yml"))
    shipped.update(bearer_token_file=str(token), scrape_interval="1s", scrape_timeout="1s")
    # The control: the same job without honor_labels, under another job label.
    control = {**shipped, "job_name": "control", "honor_labels": False,
               "relabel_configs": [*shipped["relabel_configs"],
                                   {"target_label": "job", "replacement": "control"}]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(
        {"global": {"scrape_interval": "1s"}, "scrape_configs": [shipped, control]}))
    port = free_port()
    prom = Daemon("prometheus", [f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], port, work)
    try:
        prom.wait_ready()
        wait_for("the forecast in Prometheus through both jobs", lambda: len(_query(
            prom.url, "node_resize_readmission_forecast_rejected")) == 2, timeout=60,
            logs=lambda: prom.logs() + exp.logs_tail())
        got = bearer_get(exp.port, "/metrics", token="prometheus-token")
        assert isinstance(got, tuple) and got[0] == 200, got
        yield prom.url, got[2].decode()
    finally:
        prom.stop()


def _query(url: str, promql: str) -> list[dict]:
    answer = get_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _series(url: str, match: str) -> list[dict]:
    answer = get_json(f"{url}/api/v1/series?{urllib.parse.urlencode({'match[]': match})}")
    assert answer["status"] == "success", answer
    return answer["data"]


def _job() -> str:
    """The job the ServiceMonitor gives the exporter (the Service's name): what the rules and
    the dashboards' job variable select."""
    return load_manifest("service.yaml")["metadata"]["name"]


def test_the_forecast_names_the_rejected_pod_not_the_exporters(scraped):
    url, _ = scraped
    (series,) = _query(url, f'node_resize_readmission_forecast_rejected{{job="{_job()}"}}')
    labels = series["metric"]
    assert (labels["namespace"], labels["pod"], labels["reason"]) == ("shop", "web-2",
                                                                      "OutOfcpu")
    assert labels["node"] == NODE and not any(k.startswith("exported_") for k in labels)
    # The query docs/runbooks.md gives for it: the pod's own namespace and name.
    assert _query(url, 'node_resize_readmission_forecast_rejected{namespace="shop",pod="web-2"}')


def test_without_honor_labels_the_pod_would_arrive_renamed(scraped):
    """The control job: what the ServiceMonitor gave before honorLabels."""
    url, _ = scraped
    (series,) = _query(url, 'node_resize_readmission_forecast_rejected{job="control"}')
    labels = series["metric"]
    assert (labels["exported_namespace"], labels["exported_pod"]) == ("shop", "web-2")
    assert (labels["namespace"], labels["pod"]) == ("node-resize-exporter", EXPORTER_POD)


def test_every_family_arrives_with_its_own_labels_and_the_target_labels(scraped):
    """Each series of the exporter's own scrape is in Prometheus with exactly its labels plus
    the target labels; the target labels say which exporter pod it came from, except where
    the family's own namespace/pod (the forecast's) are honoured."""
    url, text = scraped
    own: dict[str, set[frozenset]] = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
        if m and not line.startswith("#"):
            names = frozenset(re.findall(r'(\w+)="', m.group(2) or ""))
            own.setdefault(m.group(1), set()).add(names)
    stored = _series(url, f'{{job="{_job()}"}}')
    by_name: dict[str, set[frozenset]] = {}
    for s in stored:
        assert not [k for k in s if k.startswith("exported_")], s
        assert s["node"] == NODE and s["service"] == _job() and s["endpoint"] == "metrics", s
        if "forecast_rejected" not in s["__name__"] or "reason" not in s or "pod" not in s:
            assert (s["namespace"], s["pod"], s["container"]) == \
                ("node-resize-exporter", EXPORTER_POD, "exporter"), s
        by_name.setdefault(s["__name__"], set()).add(
            frozenset(set(s) - {"__name__"} - TARGET_LABELS))
    missing = sorted(set(own) - set(by_name))
    assert not missing, f"families the exporter serves that Prometheus does not hold: {missing}"
    for name, label_sets in own.items():
        assert by_name[name] == {ls - TARGET_LABELS for ls in label_sets}, name


def _names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:node_resize|node_hot_unplug)_\w+)", expr))


def test_every_family_dashboards_and_alerts_read_is_there_for_the_node(scraped):
    """Each metric a dashboard or rule names, that this exporter (Kubernetes on, sysfs) serves
    at all, is in Prometheus under the job the rules select and the node they group by; the
    recording rules the alerts read need nothing else."""
    url, text = scraped
    served = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*?)(?:_bucket|_sum|_count)?"
                                              r"(?:\{| )", text, re.M)}
    used: set[str] = set()
    for board in sorted((REPO / "dashboards").glob("*.json")):
        for _, expr in dashboard_exprs(json.loads(board.read_text())):
            used |= _names(expr)
    for group in rule_groups():
        for rule in group["rules"]:
            used |= _names(rule["expr"])
    used -= recorded_rules()
    catalogued = set(metrics_doc.rows(REPO / "docs" / "metrics.md"))
    assert used <= catalogued | {n.removesuffix(s) for n in used
                                 for s in ("_bucket", "_sum", "_count")}
    checked = 0
    for name in sorted(used):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if base not in served and name not in served:
            continue  # not served on this machine (no BPF, no kubelet state): tested elsewhere
        assert _query(url, f'count({name}{{job="{_job()}",node="{NODE}"}})'), name
        checked += 1
    assert checked >= 20, checked


def test_the_forecast_alert_and_fleet_count_see_the_node(scraped):
    """The new alert's expression and the fleet view's count, as the rules and dashboards
    have them, on what arrived."""
    url, _ = scraped
    (alert,) = [r for g in rule_groups() for r in g["rules"]
                if r.get("alert") == "NodeResizeRestartWouldRejectPods"]
    (fired,) = _query(url, alert["expr"])
    assert (fired["metric"]["node"], fired["metric"]["reason"]) == (NODE, "OutOfcpu")
    assert float(fired["value"][1]) == 1
