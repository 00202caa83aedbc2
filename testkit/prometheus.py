"""Debian's real Prometheus as a test daemon on loopback, and its HTTP API."""
from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testkit.exporter_proc import free_port


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/setup.sh test")
    return path



def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_for(what: str, predicate, timeout: float = 60.0, interval: float = 0.2, logs=None):
    """Poll predicate() until it returns something truthy; fail with `what` and logs if not."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError as e:  # not listening yet
            last_error = e
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    pytest.fail(f"waited {timeout}s for {what}{detail}\n{logs() if logs else ''}")


class Daemon:
    """A Prometheus-family server run from its Debian binary, logs kept for failures."""

    def __init__(self, name: str, args: list[str], port: int, workdir: Path) -> None:
        self.name, self.port = name, port
        self.log_path = workdir / f"{Path(name).name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary(name), *args], cwd=workdir, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return f"--- {self.name} log ---\n{self.log_path.read_text()[-4000:]}"

    def wait_ready(self) -> None:
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited {self.proc.returncode}\n{self.logs()}")
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        wait_for(f"{self.name} to be ready", ready, timeout=30, logs=self.logs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# ------------------------------------------------------------------ prometheus-operator's path

def _sanitize(name: str) -> str:
    """The operator's sanitizeLabelName: a Kubernetes label key as a Prometheus label name."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def servicemonitor_scrape_config(monitor: dict, index: int, sd_file: str) -> dict:
    """The scrape job prometheus-operator generates for endpoint `index` of a ServiceMonitor
    (pkg/prometheus/promcfg.go, generateServiceMonitorConfig, endpoints role, one shard, no
    scrape class), with file_sd_configs in place of kubernetes_sd_configs: Debian's Prometheus
    is built without Kubernetes discovery, so the targets in `sd_file` carry the
    __meta_kubernetes_* labels that discovery would set (kubernetes_target() below) and the
    same relabelings apply to them. Fields the operator would add for features the monitor
    does not use are left out; one it uses that this does not render is refused."""
    spec, ep = monitor["spec"], monitor["spec"]["endpoints"][index]
    meta = monitor["metadata"]
    rendered = {"port", "path", "scheme", "interval", "scrapeTimeout", "bearerTokenFile",
                "tlsConfig", "relabelings", "honorLabels"}
    unknown = set(ep) - rendered
    assert not unknown, f"endpoint fields this rendering does not know: {sorted(unknown)}"
    assert not spec.get("targetLabels") and not spec.get("podTargetLabels") \
        and not spec.get("jobLabel"), "render targetLabels/podTargetLabels/jobLabel first"
    job: dict = {"job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
                 "honor_labels": bool(ep.get("honorLabels", False)),
                 "file_sd_configs": [{"files": [sd_file], "refresh_interval": "5s"}]}
    for key, out in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout"),
                     ("path", "metrics_path"), ("scheme", "scheme"),
                     ("bearerTokenFile", "bearer_token_file")):
        if key in ep:
            job[out] = ep[key]
    if "tlsConfig" in ep:
        job["tls_config"] = {"insecure_skip_verify": ep["tlsConfig"].get("insecureSkipVerify",
                                                                         False)}
    relabel: list[dict] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key in sorted(spec["selector"].get("matchLabels", {})):
        relabel.append({"action": "keep", "source_labels": [
            f"__meta_kubernetes_service_label_{_sanitize(key)}",
            f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}"],
            "regex": f"({spec['selector']['matchLabels'][key]});true"})
    relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": ep["port"]})
    target = ["__meta_kubernetes_endpoint_address_target_kind",
              "__meta_kubernetes_endpoint_address_target_name"]
    relabel += [
        {"source_labels": target, "separator": ";", "regex": "Node;(.*)",
         "replacement": "${1}", "target_label": "node"},
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)",
         "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        # filterRunning (default true)
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
         "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
         "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    for r in ep.get("relabelings", []):
        out = {"source_labels": r["sourceLabels"]} if "sourceLabels" in r else {}
        for key, name in (("separator", "separator"), ("targetLabel", "target_label"),
                          ("regex", "regex"), ("modulus", "modulus"),
                          ("replacement", "replacement")):
            if key in r:
                out[name] = r[key]
        out["action"] = r.get("action", "replace").lower()
        relabel.append(out)
    relabel += [{"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1,
                 "action": "hashmod"},
                {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"}]
    job["relabel_configs"] = relabel
    return job


def kubernetes_target(address: str, *, namespace: str, service: str, pod: str, container: str,
                      node: str, port_name: str, service_labels: dict[str, str],
                      phase: str = "Running") -> dict:
    """One file_sd target group with the labels Kubernetes discovery (role endpoints) sets for
    a pod behind a Service: the Endpoints' address pointing at the pod."""
    labels = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_service_name": service,
        "__meta_kubernetes_endpoints_name": service,
        "__meta_kubernetes_endpoint_port_name": port_name,
        "__meta_kubernetes_endpoint_port_protocol": "TCP",
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": pod,
        "__meta_kubernetes_endpoint_node_name": node,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_ready": "true",
    }
    for key, value in service_labels.items():
        labels[f"__meta_kubernetes_service_label_{_sanitize(key)}"] = value
        labels[f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}"] = "true"
    return {"targets": [address], "labels": labels}


class Webhook:
    """Alertmanager's webhook receiver: every POSTed notification lands in `received`."""

    def __init__(self) -> None:
        self.received: queue.Queue[dict] = queue.Queue()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.put(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
