"""End to end: kernel -> exporter -> Prometheus -> Alertmanager -> a webhook, all real.

A real Prometheus on 127.0.0.1 (temp storage, 1 s scrape and evaluation) scrapes a real
`node-resize-exporter run` joined to a fake API server whose Node keeps saying 2 CPUs (the
kubelet of today, which never resyncs). The test offlines cpu1: NodeResizeCapacityStale
(loaded from alerts/ with a short `for:`) goes pending, then firing in Prometheus'
/api/v1/alerts, and a real Alertmanager on 127.0.0.1 delivers it to a webhook receiver here.
"""
from __future__ import annotations

import json
import queue
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from exporter.sources.kubelet.proto import podresources_pb2 as pb
from testkit.exporter_proc import RunningExporter, free_port
from testkit.fakes.apiserver import FakeApiServer
from testkit.fakes.podresources import Kubelet, Server
from testkit.monitoring import as_promql, dashboard_exprs
from testkit.prometheus import Daemon, Webhook, get_json, wait_for

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "node-resize-exporter.rules.yml"
ALERT = "NodeResizeCapacityStale"
NODE = "e2e-node"
FOR_OVERRIDE = "3s"  # the shipped rule waits 10m; the test only needs pending to be visible

pytestmark = [pytest.mark.kernel, pytest.mark.promtool]


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/setup.sh test")
    return path








def _rules_with_short_for(path: Path) -> None:
    rules = yaml.safe_load(RULES.read_text())
    found = 0
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if rule.get("alert") == ALERT:
                rule["for"] = FOR_OVERRIDE
                found += 1
    assert found == 1, f"{ALERT} not in {RULES}"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))


def _mem_total_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise AssertionError("no MemTotal in /proc/meminfo")


def _quiet(log: str, chars: int = 6000) -> str:
    """The exporter's log without its per-scrape access lines, which drown everything else."""
    lines = [line for line in log.splitlines() if "exporter.web.server" not in line]
    return "\n".join(lines)[-chars:]


def _our_alerts(prometheus: Daemon) -> list[dict]:
    data = get_json(prometheus.url + "/api/v1/alerts")["data"]["alerts"]
    return [
        a
        for a in data
        if a["labels"].get("alertname") == ALERT
        and a["labels"].get("resource") == "cpu"
        and a["labels"].get("node") == NODE
    ]


def _query(prometheus: Daemon, expr: str) -> list[dict]:
    url = prometheus.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return get_json(url)["data"]["result"]


def test_drift_alert_goes_pending_then_firing_and_reaches_the_webhook(cpu1, tmp_path):
    stops: list = []  # how to stop each thing started, in order; undone in reverse
    try:
        # The cluster side: a Node that keeps saying 2 CPUs, and a kubelet podresources socket.
        api = FakeApiServer().start()
        stops.append(api.stop)
        api.set_node(NODE, cpu="2", memory=f"{_mem_total_kib()}Ki")
        # A registered kubelet renews its node Lease (a missing one is an alert of its own).
        api.set_lease(NODE, time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()))
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        kubelet = Kubelet()
        kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
        sock = str(tmp_path / "kubelet.sock")
        stops.append(Server(sock, kubelet).stop)

        # No kubelet on this host: its root and the kubepods cgroup are not read (read and
        # missing, their sources would be down, and NodeResizeExporterSourceDown would fire).
        exporter = RunningExporter(
            "--kubeconfig", kubeconfig, "--node-name", NODE, "--podresources-socket", sock,
            "--kubelet-root-dir", "", "--cgroup-root", "",
        )
        stops.append(lambda: exporter.__exit__(None, None, None))
        exporter.start()

        webhook = Webhook()
        stops.append(webhook.stop)
        am_port = free_port()
        (tmp_path / "alertmanager.yml").write_text(
            yaml.safe_dump(
                {
                    "route": {
                        "receiver": "test",
                        "group_by": ["alertname", "node", "resource"],
                        "group_wait": "1s",
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [
                        {
                            "name": "test",
                            "webhook_configs": [{"url": webhook.url, "send_resolved": False}],
                        }
                    ],
                }
            )
        )
        (tmp_path / "am-data").mkdir()
        alertmanager = Daemon(
            "prometheus-alertmanager",
            [
                f"--config.file={tmp_path / 'alertmanager.yml'}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",  # no HA gossip: nothing listens beyond loopback
            ],
            am_port,
            tmp_path,
        )
        stops.append(alertmanager.stop)

        _rules_with_short_for(tmp_path / "rules.yml")
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": "1s",
                        "evaluation_interval": "1s",
                        "scrape_timeout": "1s",
                    },
                    "rule_files": [str(tmp_path / "rules.yml")],
                    "alerting": {
                        "alertmanagers": [
                            {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}
                        ]
                    },
                    # `node` is what the ServiceMonitor's relabelling adds in a cluster.
                    "scrape_configs": [
                        {
                            "job_name": "node-resize-exporter",
                            "static_configs": [
                                {
                                    "targets": [f"127.0.0.1:{exporter.port}"],
                                    "labels": {"node": NODE},
                                }
                            ],
                        }
                    ],
                }
            )
        )
        (tmp_path / "prom-data").mkdir()
        prometheus = Daemon(
            "prometheus",
            [
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            prom_port,
            tmp_path,
        )
        stops.append(prometheus.stop)
        alertmanager.wait_ready()
        prometheus.wait_ready()

        def logs() -> str:
            return "\n".join(
                [
                    prometheus.logs(),
                    alertmanager.logs(),
                    "--- exporter log ---\n" + _quiet(exporter.logs()),
                ]
            )

        # In sync first: Prometheus sees cpu drift 0 and nothing is pending.
        wait_for(
            "Prometheus to see cpu drift 0 for the node",
            lambda: [
                r
                for r in _query(
                    prometheus, f'node_resize_capacity_drift{{node="{NODE}",resource="cpu"}} == 0'
                )
            ],
            logs=logs,
        )
        assert _our_alerts(prometheus) == []

        cpu1.set_online(False)

        pending = wait_for(
            "the drift alert to go pending",
            lambda: [a for a in _our_alerts(prometheus) if a["state"] == "pending"],
            logs=logs,
        )
        assert pending[0]["labels"]["severity"] == "warning"
        firing = wait_for(
            "the drift alert to fire",
            lambda: [a for a in _our_alerts(prometheus) if a["state"] == "firing"],
            logs=logs,
        )
        alert = firing[0]
        # One cause, one alert: not the podresources offline CPU, not the present-but-offline
        # CPU, not pending either (ALERTS has every alert Prometheus holds, in any state).
        offered = _query(prometheus, f'node_resize_podresources_offline_cpus{{node="{NODE}"}}')
        assert [float(r["value"][1]) for r in offered] == [1.0]  # the kubelet offers cpu1
        others = _query(prometheus, f'ALERTS{{node="{NODE}",alertname!="{ALERT}"}}')
        assert others == [], others
        # One alert per node and resource: job, instance and unit are aggregated away.
        assert set(alert["labels"]) == {"alertname", "node", "resource", "severity"}
        assert float(alert["value"]) == 1.0
        assert alert["annotations"]["runbook_url"].endswith(
            "docs/runbooks.md#noderesizecapacitystale"
        )
        assert (
            f"Node {NODE}: kubelet advertises cpu the kernel took away"
            == alert["annotations"]["summary"]
        )

        def delivered():
            try:
                note = webhook.received.get(timeout=0.5)
            except queue.Empty:
                return None
            ours = [
                a
                for a in note["alerts"]
                if a["labels"].get("alertname") == ALERT and a["labels"].get("resource") == "cpu"
            ]
            return (note, ours) if ours else None

        note, ours = wait_for(
            "Alertmanager to deliver the alert to the webhook", delivered, logs=logs
        )
        assert note["receiver"] == "test"
        assert ours[0]["status"] == "firing"
        assert ours[0]["labels"]["node"] == NODE
        assert ours[0]["labels"]["severity"] == "warning"
        assert (
            f"The Node object of {NODE} advertises 1 core(s) of cpu more than the kernel"
            in ours[0]["annotations"]["description"]
        )

        # Every dashboard query evaluates on this Prometheus (matching errors such as
        # many-to-many only show at evaluation), and the drift panels see the drift.
        for path in sorted((REPO / "dashboards").glob("*.json")):
            for where, expr in dashboard_exprs(json.loads(path.read_text())):
                url = (
                    prometheus.url
                    + "/api/v1/query?"
                    + urllib.parse.urlencode({"query": as_promql(expr, node=NODE)})
                )
                try:
                    answer = get_json(url)
                except urllib.error.HTTPError as e:
                    pytest.fail(f"{path.name} {where}: {e.read().decode()}\n{expr}")
                assert answer["status"] == "success", (path.name, where, answer)
        drift = _query(
            prometheus, as_promql('node_resize_capacity_drift{node="$node",unit="core"}', node=NODE)
        )
        assert [float(r["value"][1]) for r in drift] == [-1.0]
    finally:
        for stop in reversed(stops):
            stop()
        cpu1.set_online(True)
