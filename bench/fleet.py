"""What 1,000 nodes cost the monitoring: Debian's real Prometheus scraping a simulated fleet.

    .venv/bin/python bench/run.py fleet [--quick] [--no-peer]
    .venv/bin/python bench/fleet.py [--quick] [--nodes N --interval S --window S]

1. One real scrape of each exporter is recorded on loopback, as Prometheus 2.42 asks for it
   (its Accept header; the Content-Type answered is replayed too): `node-resize-exporter run
   --source sysfs --no-journal` (the CLI, as a subprocess), joined to the test API server
   (testkit/fakes/apiserver.py: a Node, its Lease) so the kubelet/drift series a deployed
   DaemonSet has are there -- without it, Kubernetes off, and the results say so; the series
   count with Kubernetes off is recorded beside it. And Debian's prometheus-node-exporter with
   its packaged defaults. Recorded at every run: the benchmark measures the exposition the
   exporter produces today, not a frozen copy.
2. One asyncio process (`bench/fleet.py serve`) replays it as N targets on one loopback port,
   /<job>/<n>/metrics, on kept-alive connections, gzip-compressed as Prometheus asks.
3. /usr/bin/prometheus scrapes them through file_sd: each target carries the labels
   prometheus-operator gives a pod endpoint (instance = a pod IP:port, namespace, pod,
   service, endpoint, container) and `__meta_kubernetes_pod_node_name`, which the relabelings
   of deploy/servicemonitor.yaml (read from the file, mirrored as relabel_configs) turn into
   `node`. alerts/node-resize-exporter.rules.yml is loaded (recording rules and alerts),
   evaluated every scrape interval.
4. After every target is up, the window runs (Prometheus' own /metrics sampled every
   interval, never scraped into its TSDB, so it adds no series); then every PromQL expression
   of dashboards/*.json is run with Grafana's variables substituted, as an instant query at
   the end and as a range query over the window, each timed from here (median of repeats).

Live scraping, not `promtool tsdb create-blocks-from openmetrics`: a backfilled TSDB is
compacted blocks, not the head a running Prometheus holds (head series, RSS, WAL, scrape and
rule-evaluation load are the numbers asked for), and rule groups only run in a live server.
node_exporter runs in a second Prometheus after the first is stopped (no rules; the project's
dashboards do not query it), so each RSS is one fleet's.
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/fleet.py` puts bench/ first, not the repository
    sys.path.insert(0, str(REPO))

from testkit.exporter_proc import free_port, terminate  # noqa: E402

RULES = REPO / "alerts" / "node-resize-exporter.rules.yml"
SERVICE_MONITOR = REPO / "deploy" / "servicemonitor.yaml"
DASHBOARDS = REPO / "dashboards"
PROMETHEUS = "/usr/bin/prometheus"
NODE_EXPORTER = "prometheus-node-exporter"
NRE, NE = "node-resize-exporter", "node_exporter"
# What Prometheus 2.42 sends (scrape/scrape.go scrapeAcceptHeader): the exporter may answer
# OpenMetrics, and the replay must be what Prometheus would really have parsed.
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
          "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
# Series Prometheus adds to every target: up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added.
SYNTHETIC_PER_TARGET = 5
# (full, quick)
SIZES = {"nodes": (1000, 50), "interval": (10.0, 5.0), "window": (150.0, 30.0),
         "repeats": (3, 1)}


def say(msg: str) -> None:
    print(f"fleet: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------- recording the scrapes

def exporter_cli() -> str:
    """The project's CLI next to this interpreter (.venv/bin), else on PATH."""
    here = Path(sys.executable).parent / "node-resize-exporter"
    if here.exists():
        return str(here)
    found = shutil.which("node-resize-exporter")
    if found is None:
        raise FileNotFoundError("node-resize-exporter CLI not found: run scripts/setup.sh test")
    return found


def _get(url: str, timeout: float = 5.0, headers: dict | None = None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.headers.get("Content-Type", ""), r.read()


def sample_lines(body: bytes) -> list[str]:
    """The sample lines of an exposition (text 0.0.4 or OpenMetrics): one series each."""
    return [line for line in body.decode().splitlines() if line and not line.startswith("#")]


def series_names(body: bytes) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in sample_lines(body)}


def record(cmd: list[str], port: int, ready, timeout: float = 60.0,
           env: dict | None = None, accept: str = ACCEPT) -> dict:
    """Start cmd, scrape it as Prometheus would (or another scraper's Accept) until ready(body)
    and the series set is the same on two scrapes 0.5 s apart; stop it; the last scrape."""
    tmp = tempfile.TemporaryDirectory(prefix="nre-fleet-rec-")
    log_path = Path(tmp.name) / "log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited {proc.returncode}:\n"
                                   f"{log_path.read_text()[-3000:]}")
            try:
                ctype, body = _get(f"http://127.0.0.1:{port}/metrics", headers={
                    "Accept": accept, "Accept-Encoding": "identity"})
            except OSError:
                time.sleep(0.1)
                continue
            if ready(body):
                names = [line.split(" ")[0] for line in sample_lines(body)]
                if names == last:
                    return {"content_type": ctype, "body": body, "series": len(names),
                            "bytes": len(body), "gzip_bytes": len(gzip.compress(body, 6))}
                last = names
            time.sleep(0.5)
        raise RuntimeError(f"{cmd[0]} not ready in {timeout}s:\n{log_path.read_text()[-3000:]}")
    finally:
        terminate(proc)
        tmp.cleanup()


def _now_micro() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


@contextmanager
def _api_server(directory: str, node: str):
    """The test API server holding this node's Node and Lease (Kubernetes on, as the
    DaemonSet runs)."""
    from testkit.fakes.apiserver import serving_node
    mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo")
                   if line.startswith("MemTotal:"))
    with serving_node(directory, node, cpu=str(os.sysconf("SC_NPROCESSORS_CONF")),
                      memory=f"{mem_kib}Ki") as api:
        api.set_lease(node, _now_micro())
        yield api, "on (testkit/fakes/apiserver.py: this machine's Node and Lease, no pods)"


def record_exporter(kubernetes: bool, accept: str = ACCEPT) -> dict:
    port = free_port()
    cmd = [exporter_cli(), "run", "--web.listen-address", f"127.0.0.1:{port}",
           "--source", "sysfs", "--no-journal"]
    node = "fleet-rec-node"
    if not kubernetes:
        rec = record([*cmd, "--kubernetes", "off"], port,
                     lambda b: b"node_resize_kernel_capacity{" in b, accept=accept)
        rec["kubernetes"] = "off"
        return rec
    with tempfile.TemporaryDirectory(prefix="nre-fleet-api-") as d, \
            _api_server(d, node) as (api, how):
        if api is None:
            rec = record([*cmd, "--kubernetes", "off"], port,
                         lambda b: b"node_resize_kernel_capacity{" in b, accept=accept)
        else:
            rec = record([*cmd, "--kubernetes", "on", "--kubeconfig", api.kubeconfig,
                          "--node-name", node, "--podresources-socket", ""], port,
                         lambda b: b"node_resize_kernel_capacity{" in b
                         and b"node_resize_kubelet_capacity{" in b, accept=accept)
        rec["kubernetes"] = how
        return rec


def node_exporter_path() -> str | None:
    return shutil.which(NODE_EXPORTER)


def record_node_exporter() -> dict:
    path = node_exporter_path()
    if path is None:
        raise FileNotFoundError(f"{NODE_EXPORTER} is not installed: scripts/setup.sh test")
    port = free_port()
    return record([path, f"--web.listen-address=127.0.0.1:{port}"], port,
                  lambda b: b"\nnode_cpu_seconds_total{" in b)


# ------------------------------------------------------------------------- the fleet server

async def _serve(port: int, bodies: dict[bytes, tuple[bytes, bytes, bytes]]) -> None:
    """GET /<job>/<n>/metrics -> that job's recorded exposition, HTTP/1.1 kept alive."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1]
                gz = any(h.lower().startswith(b"accept-encoding:") and b"gzip" in h.lower()
                         for h in lines[1:])
                found = bodies.get(path.split(b"/")[1]) if path.count(b"/") == 3 else None
                if found is None:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    ctype, plain, packed = found
                    body = packed if gz else plain
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype
                                 + (b"\r\nContent-Encoding: gzip" if gz else b"")
                                 + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                IndexError):
            pass
        finally:
            writer.close()

    # 4096: the kernel's somaxconn; a fleet of 10,000 opens its connections within one interval
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def serve_main(port: int, directory: Path) -> None:
    bodies = {}
    for meta in directory.glob("*.json"):
        info = json.loads(meta.read_text())
        plain = (directory / info["file"]).read_bytes()
        bodies[meta.stem.encode()] = (info["content_type"].encode(), plain,
                                      gzip.compress(plain, 6))
    asyncio.run(_serve(port, bodies))


class FleetServer:
    """`bench/fleet.py serve` as a subprocess: every recorded exposition, as N targets."""

    def __init__(self, recordings: dict[str, dict]):
        self.tmp = tempfile.TemporaryDirectory(prefix="nre-fleet-srv-")
        d = Path(self.tmp.name)
        for job, rec in recordings.items():
            (d / f"{job}.prom").write_bytes(rec["body"])
            (d / f"{job}.json").write_text(json.dumps({"file": f"{job}.prom",
                                                       "content_type": rec["content_type"]}))
        self.port = free_port()
        self.log = open(d / "log", "w")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve",
                                      "--port", str(self.port), "--dir", str(d)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        job = next(iter(recordings))
        deadline = time.monotonic() + 60  # a Python start-up on a machine at load 15: seconds
        while True:
            try:
                _get(f"http://127.0.0.1:{self.port}/{job}/0/metrics", timeout=2)
                return
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (d / "log").read_text()[-2000:]
                    self.stop()
                    raise RuntimeError(f"the fleet server did not start:\n{log}") from e
                time.sleep(0.1)

    def stop(self) -> None:
        terminate(self.proc)
        self.log.close()
        self.tmp.cleanup()


# ------------------------------------------------------------------------------- Prometheus

def mirrored_relabelings() -> list[dict]:
    """deploy/servicemonitor.yaml's relabelings as Prometheus relabel_configs."""
    monitor = yaml.safe_load(SERVICE_MONITOR.read_text())
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label",
            "action": "action", "regex": "regex", "replacement": "replacement",
            "separator": "separator", "modulus": "modulus"}
    out = []
    for endpoint in monitor["spec"]["endpoints"]:
        for r in endpoint.get("relabelings", []):
            out.append({keys[k]: v for k, v in r.items() if k in keys})
    return out


# What prometheus-operator puts on each pod-endpoint target, per fleet.
TARGET_LABELS = {
    NRE: {"namespace": "node-resize-exporter", "service": "node-resize-exporter",
          "container": "node-resize-exporter", "endpoint": "metrics", "port": 9862},
    NE: {"namespace": "monitoring", "service": "node-exporter", "container": "node-exporter",
         "endpoint": "http-metrics", "port": 9100},
}


def node_name(n: int) -> str:
    return f"fleet-node-{n:04d}"


def file_sd(job: str, nodes: int, port: int) -> list[dict]:
    """One target per node on the fleet server, labelled as prometheus-operator would."""
    t = TARGET_LABELS[job]
    return [{"targets": [f"127.0.0.1:{port}"],
             "labels": {"__metrics_path__": f"/{job}/{n}/metrics",
                        "__meta_kubernetes_pod_node_name": node_name(n),
                        "instance": f"10.{64 + n // 65536}.{n // 256 % 256}.{n % 256}:{t['port']}",
                        "namespace": t["namespace"], "service": t["service"],
                        "container": t["container"], "endpoint": t["endpoint"],
                        "pod": f"{t['service']}-{n:05x}"}}
            for n in range(nodes)]


def get_json(url: str, timeout: float = 120.0) -> tuple[dict, float]:
    """GET a Prometheus-API URL: the JSON answer (an error, as the API says one, when it did not
    answer or answered no JSON) and the seconds it took."""
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        body = e.read()
    except OSError as e:  # a timeout: the query did not answer, an error like any other
        return {"status": "error", "error": repr(e)}, time.perf_counter() - t
    elapsed = time.perf_counter() - t
    try:
        return json.loads(body), elapsed
    except ValueError:
        return {"status": "error", "error": body[:300].decode(errors="replace")}, elapsed


class Prometheus:
    def __init__(self, work: Path, job: str, nodes: int, fleet_port: int, interval: float,
                 rules: bool):
        self.work, self.job = work, job
        (work / "targets.json").write_text(json.dumps(file_sd(job, nodes, fleet_port)))
        config = {
            "global": {"scrape_interval": f"{interval:g}s",
                       "scrape_timeout": f"{min(interval, 10.0):g}s",
                       "evaluation_interval": f"{interval:g}s"},
            "rule_files": [str(RULES)] if rules else [],
            "scrape_configs": [{
                "job_name": job if job == NRE else "node-exporter",
                "file_sd_configs": [{"files": [str(work / "targets.json")]}],
                "relabel_configs": mirrored_relabelings()}]}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", "--storage.tsdb.retention.time=1d",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            cwd=work, stdout=self.log, stderr=subprocess.STDOUT)

    def logs(self) -> str:
        return (self.work / "prometheus.log").read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{self.logs()}")
            try:
                _get(self.url + "/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout}s:\n{self.logs()}")

    def own_metrics(self, tries: int = 3) -> dict:
        """Prometheus' own /metrics, read over HTTP (not scraped: no series of its own). A busy
        shared machine can hold the answer for seconds: a few tries, 30 s each."""
        for attempt in range(tries):
            try:
                _, body = _get(self.url + "/metrics", timeout=30)
                break
            except OSError:
                if attempt == tries - 1:
                    raise
        return self._parse_own(body)

    def _parse_own(self, body: bytes) -> dict:
        out: dict = {"rule_groups": {}}
        for line in body.decode().splitlines():
            if line.startswith("prometheus_tsdb_head_series "):
                out["head_series"] = int(float(line.split()[1]))
            elif line.startswith("process_resident_memory_bytes "):
                out["rss_bytes"] = int(float(line.split()[1]))
            elif line.startswith("process_cpu_seconds_total "):
                out["cpu_seconds"] = float(line.split()[1])
            elif line.startswith("go_memstats_heap_inuse_bytes "):
                out["heap_inuse_bytes"] = int(float(line.split()[1]))
            elif line.startswith("prometheus_rule_group_last_duration_seconds{"):
                group = re.search(r'rule_group="[^"]*;([^"]*)"', line).group(1)
                out["rule_groups"][group] = float(line.rsplit(" ", 1)[1])
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        out["vm_hwm_bytes"] = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
        return out

    def api(self, path: str, **params) -> tuple[dict, float]:
        """GET /api/v1/<path>; the answer and the seconds it took."""
        return get_json(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")

    def scalar(self, expr: str) -> float | None:
        answer, _ = self.api("query", query=expr)
        if answer.get("status") != "success" or not answer["data"]["result"]:
            return None
        return float(answer["data"]["result"][0]["value"][1])

    def stop(self) -> None:
        terminate(self.proc, timeout=60)
        self.log.close()


# ----------------------------------------------------------------------- dashboard queries

def _walk(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _walk(panel.get("panels", []))


def dashboard_queries() -> list[dict]:
    """Every PromQL expression of dashboards/*.json: panel targets, annotations, variables."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in _walk(board.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    instant = bool(target.get("instant")) and not target.get("range")
                    out.append({"dashboard": path.name, "kind": "panel",
                                "where": f"{panel['title']} [{target.get('refId', '')}]",
                                "expr": target["expr"],
                                "grafana": "instant" if instant else "range"})
        for ann in board.get("annotations", {}).get("list", []):
            if ann.get("expr"):
                out.append({"dashboard": path.name, "kind": "annotation",
                            "where": f"annotation {ann['name']}", "expr": ann["expr"],
                            "grafana": "range"})
        for var in board.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", query, re.S)
            if m:
                out.append({"dashboard": path.name, "kind": "variable",
                            "where": f"variable ${var['name']}", "expr": m.group(1),
                            "label": m.group(2), "grafana": "labels"})
            else:  # a bare PromQL variable query
                out.append({"dashboard": path.name, "kind": "variable",
                            "where": f"variable ${var['name']}", "expr": query,
                            "grafana": "instant"})
    return out


def grafana(expr: str, *, interval: float, window: float, node: str) -> str:
    """Grafana's variables as it would send them for a dashboard over the scraped window:
    $node and $job "All" (.*) in a regex matcher, one node in an equality matcher (node detail);
    $cluster empty (a single-cluster Prometheus: `cluster` is an external label, so
    cluster="" matches); $__interval the step (the scrape interval: a short window on a wide
    panel); $__rate_interval Grafana's max($__interval + scrape, 4 x scrape)."""
    step = interval
    rate = max(step + interval, 4 * interval)
    expr = expr.replace("$__rate_interval", f"{rate:g}s")
    expr = expr.replace("${__rate_interval}", f"{rate:g}s")
    expr = re.sub(r"\$\{?__interval(_ms)?\}?",
                  lambda m: f"{step * 1000:g}" if m.group(1) else f"{step:g}s", expr)
    expr = re.sub(r"\$\{?__range(_s|_ms)?\}?", lambda m: {
        None: f"{window:g}s", "_s": f"{window:g}", "_ms": f"{window * 1000:g}"}[m.group(1)],
        expr)
    expr = re.sub(r'=~"\$\{?(node|job)\}?"', '=~".*"', expr)  # "All"
    expr = re.sub(r"\$\{?node\}?", node, expr)
    expr = re.sub(r"\$\{?(cluster|job|datasource)\}?", "", expr)
    leftover = re.search(r"\$\{?\w+", expr)
    if leftover:
        raise ValueError(f"a Grafana variable this benchmark does not substitute: "
                         f"{leftover.group(0)} in {expr}")
    return expr


def _summary(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    ms = sorted(s * 1000 for s in seconds)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "max_ms": round(ms[-1], 2), "total_ms": round(sum(ms), 1)}


def run_queries(prom: Prometheus, start: float, end: float, interval: float,
                repeats: int) -> dict:
    """Each expression as an instant query at `end` and as a range query over [start, end]
    (variables: label values over the window), the median of `repeats` timings each."""
    window = end - start
    rows, errors = [], []
    for q in dashboard_queries():
        promql = grafana(q["expr"], interval=interval, window=round(window),
                         node=node_name(0))
        if q["grafana"] == "labels":
            shapes = {"labels": ("label/" + q["label"] + "/values",
                                 {"match[]": promql, "start": start, "end": end})}
        else:
            shapes = {"instant": ("query", {"query": promql, "time": end}),
                      "range": ("query_range", {"query": promql, "start": start, "end": end,
                                                "step": f"{interval:g}"})}
        for shape, (path, params) in shapes.items():
            times, answer = [], {}
            for _ in range(repeats):
                answer, t = prom.api(path, **params)
                times.append(t)
            ok = answer.get("status") == "success"
            data = answer.get("data")
            result = data if shape == "labels" else (data or {}).get("result", [])
            row = {"dashboard": q["dashboard"], "where": q["where"], "kind": q["kind"],
                   "shape": shape, "as_grafana": shape == q["grafana"],
                   "ms": round(statistics.median(times) * 1000, 2), "ok": ok,
                   "series": len(result or []) if ok else None}
            rows.append(row)
            if not ok:
                errors.append({**row, "query": promql, "error": answer.get("error")})

    def pick(pred) -> dict:
        return _summary([r["ms"] / 1000 for r in rows if pred(r)])

    slowest = sorted(rows, key=lambda r: -r["ms"])[:5]
    return {"expressions": len(dashboard_queries()), "repeats": repeats,
            "as_grafana_sends_them": pick(lambda r: r["as_grafana"]),
            "instant": pick(lambda r: r["shape"] == "instant"),
            "range": pick(lambda r: r["shape"] == "range"),
            "labels": pick(lambda r: r["shape"] == "labels"),
            "empty": sum(1 for r in rows if r["ok"] and not r["series"]),
            "slowest": [{k: r[k] for k in ("dashboard", "where", "shape", "ms", "series")}
                        for r in slowest],
            "errors": errors, "rows": rows}


# ------------------------------------------------------------------------------ one fleet

def slowest_rules(prom: Prometheus, n: int = 5) -> list[dict]:
    """The rules whose last evaluation took longest (/api/v1/rules evaluationTime)."""
    answer, _ = prom.api("rules")
    rules = [{"group": g["name"], "rule": r["name"], "type": r["type"],
              "ms": round(r.get("evaluationTime", 0) * 1000, 2)}
             for g in answer.get("data", {}).get("groups", []) for r in g["rules"]]
    return sorted(rules, key=lambda r: -r["ms"])[:n]


def recorded_rule_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["record"] for g in groups for r in g["rules"] if "record" in r]


def measure_fleet(job: str, rec: dict, nodes: int, interval: float, window: float,
                  repeats: int, fleet_port: int, rules: bool, queries: bool) -> dict:
    """One Prometheus scraping `nodes` replays of `rec` for `window` seconds after all are up."""
    work = Path(tempfile.mkdtemp(prefix="nre-fleet-prom-"))
    prom = Prometheus(work, job, nodes, fleet_port, interval, rules)
    try:
        prom.wait_ready()
        born = time.time()
        t0 = time.monotonic()
        job_label = job if job == NRE else "node-exporter"
        up_timeout = 3 * interval + 60
        while prom.scalar(f'count(up{{job="{job_label}"}} == 1)') != nodes:
            if time.monotonic() - t0 > up_timeout:
                raise RuntimeError(f"not every target up in {up_timeout:g}s: "
                                   f"{prom.scalar(f'count(up{{job={job_label!r}}} == 1)')}"
                                   f"/{nodes}\n{prom.logs()}")
            time.sleep(1)
        all_up_s = time.monotonic() - t0
        first = prom.own_metrics()
        load_start = os.getloadavg()[0]
        start = time.time()
        samples, peak_groups, missed = [], {}, 0
        while time.time() - start < window:
            time.sleep(min(interval, max(0.0, window - (time.time() - start))))
            try:
                m = prom.own_metrics(tries=1)
            except OSError:
                missed += 1  # Prometheus too busy to answer in 30 s: said in the results
                continue
            samples.append(m)
            for g, d in m["rule_groups"].items():
                peak_groups[g] = max(peak_groups.get(g, 0.0), d)
        end = time.time()
        last = prom.own_metrics()
        elapsed = end - start
        w = f"{elapsed:.0f}s"
        out = {
            "targets": nodes, "all_up_after_s": round(all_up_s, 1),
            "window_s": round(elapsed, 1),
            "up": prom.scalar(f'count(up{{job="{job_label}"}} == 1)'),
            # Every target answered at least once in the window, and how many scrapes did not
            # (a loaded shared machine can make a scrape time out: said, not hidden).
            "up_ever": prom.scalar(f'count(max_over_time(up{{job="{job_label}"}}[{w}]) == 1)'),
            "scrapes": prom.scalar(f'sum(count_over_time(up{{job="{job_label}"}}[{w}]))'),
            "scrapes_failed": prom.scalar(
                f'sum(count_over_time(up{{job="{job_label}"}}[{w}]) '
                f'- sum_over_time(up{{job="{job_label}"}}[{w}]))'),
            "samples_scraped": prom.scalar(
                f'sum(max_over_time(scrape_samples_scraped{{job="{job_label}"}}[{w}]))'),
            "scrape_duration_max_s": prom.scalar(
                f'max(max_over_time(scrape_duration_seconds{{job="{job_label}"}}'
                f'[{elapsed:.0f}s]))'),
            "scrape_duration_p50_s": prom.scalar(
                f'quantile(0.5, scrape_duration_seconds{{job="{job_label}"}})'),
            "head_series": last["head_series"],
            "rss_bytes": last["rss_bytes"], "rss_peak_bytes": last["vm_hwm_bytes"],
            "heap_inuse_bytes": last.get("heap_inuse_bytes"),
            "cpu_cores": round((last["cpu_seconds"] - first["cpu_seconds"]) / elapsed, 3),
            "rss_over_window_mib": [round(s["rss_bytes"] / 2**20, 1) for s in samples],
            "own_metrics_unanswered": missed,
            # Other sessions share the machine: the 1-minute load when the window began / ended.
            "loadavg_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)],
        }
        targets, _ = prom.api("targets", state="active")
        errors: dict[str, int] = {}
        for t in targets.get("data", {}).get("activeTargets", []):
            if t.get("lastError"):
                key = re.sub(r"/\d+/metrics", "/N/metrics", t["lastError"])[:200]
                errors[key] = errors.get(key, 0) + 1
        out["scrape_errors"] = errors  # at the end, by message: what a target that is down says
        # Series in the head that are no longer live (a rule's output that changed labels, an
        # alert gone from pending to firing): seen since Prometheus started, not live now.
        since = f"{time.time() - born + 60:.0f}s"
        answer, _ = prom.api("query", query='count by (__name__, alertname) (last_over_time('
                             f'{{__name__=~".+"}}[{since}]) unless {{__name__=~".+"}})')
        out["series_gone_by_name"] = {
            r["metric"].get("__name__", "") + (f"{{alertname={r['metric']['alertname']}}}"
                                               if "alertname" in r["metric"] else ""):
            int(r["value"][1]) for r in answer.get("data", {}).get("result", [])}
        out["series_live"] = int(prom.scalar('count({__name__=~".+"})') or 0)
        # The head now, after the series were counted: a rule group slower than its interval
        # (a loaded machine) may add its first outputs after the window's last sample.
        out["head_series"] = prom.own_metrics()["head_series"]
        if rules:
            names = recorded_rule_names()
            out["rule_series"] = int(prom.scalar(
                'count({__name__=~"' + "|".join(map(re.escape, names))
                + '|ALERTS|ALERTS_FOR_STATE"})') or 0)
            out["rule_groups"] = {g: {"last_ms": round(d * 1000, 2),
                                      "max_ms": round(peak_groups.get(g, d) * 1000, 2)}
                                  for g, d in last["rule_groups"].items()}
            out["alerts"] = int(prom.scalar("count(ALERTS)") or 0)
            out["slowest_rules"] = slowest_rules(prom)
        if queries:
            say(f"{job}: dashboard queries ...")
            out["queries"] = run_queries(prom, start, end, interval, repeats)
            out["rss_peak_after_queries_bytes"] = prom.own_metrics()["vm_hwm_bytes"]
        return out
    finally:
        prom.stop()
        shutil.rmtree(work, ignore_errors=True)


def fleet_cost(nodes: int, interval: float, window: float, repeats: int = 1,
               peer: bool = True, parallel: bool = False) -> dict:
    """The benchmark: both fleets, one after the other (parallel: at once, each in its own
    Prometheus; --quick, where no number is quoted); the JSON results."""
    if not os.access(PROMETHEUS, os.X_OK):
        raise FileNotFoundError(f"{PROMETHEUS} is not installed: run scripts/setup.sh test")
    say("recording one scrape of each exporter ...")
    recs = {NRE: record_exporter(kubernetes=True)}
    off = record_exporter(kubernetes=False)
    if peer:
        recs[NE] = record_node_exporter()
    expositions = {job: {k: v for k, v in r.items() if k != "body"} for job, r in recs.items()}
    expositions[NRE]["series_kubernetes_off"] = off["series"]
    expositions[NRE]["series_by_name"] = {
        name: sum(1 for line in sample_lines(recs[NRE]["body"])
                  if re.split(r"[{ ]", line, maxsplit=1)[0] == name)
        for name in sorted(series_names(recs[NRE]["body"]))}
    out = {"sizes": {"nodes": nodes, "scrape_interval_s": interval,
                     "evaluation_interval_s": interval, "window_s": window,
                     "query_repeats": repeats},
           "prometheus": _version(PROMETHEUS), "exposition": expositions, "fleets": {}}
    out["sizes"]["fleets_at_once"] = parallel
    server = FleetServer(recs)

    def one(job: str) -> dict:
        say(f"{job}: {nodes} targets every {interval:g}s for {window:g}s ...")
        return measure_fleet(job, recs[job], nodes, interval, window, repeats, server.port,
                             rules=job == NRE, queries=job == NRE)

    try:
        if parallel:
            with ThreadPoolExecutor(len(recs)) as pool:
                out["fleets"] = dict(zip(recs, pool.map(one, recs)))
        else:
            out["fleets"] = {job: one(job) for job in recs}
    finally:
        server.stop()
    return out


def _version(binary: str) -> str:
    try:
        text = subprocess.run([binary, "--version"], capture_output=True, text=True,
                              timeout=10)
    except OSError:
        return "unknown"
    first = (text.stdout or text.stderr).splitlines()
    return first[0] if first else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    serve = sub.add_parser("serve", help="(internal) the fleet server")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--interval", type=float)
    parser.add_argument("--window", type=float)
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve_main(args.port, args.dir)
        return 0
    i = 1 if args.quick else 0
    result = fleet_cost(args.nodes or SIZES["nodes"][i], args.interval or SIZES["interval"][i],
                        args.window or SIZES["window"][i], SIZES["repeats"][i],
                        peer=not args.no_peer, parallel=args.quick)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
