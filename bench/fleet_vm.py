"""Past one Prometheus: 10,000 replayed nodes through sharded scrapers into a scaled store.

    .venv/bin/python bench/run.py fleet-vm [--quick]
    .venv/bin/python bench/fleet_vm.py [--quick] [--nodes N --shards S --interval S --window S]

What a fleet past one Prometheus runs, all from Debian's victoria-metrics package:

1. The exporter's scrape is recorded as in bench/fleet.py (the CLI joined to the test API
   server), asked with vmagent's Accept header. A tenth of the nodes (n % 10 == 7) replay a
   copy with three per-node faults, so per-node alerts fire: the sysfs source down
   (NodeResizeExporterSourceDown), a pod the next kubelet restart rejects
   (NodeResizeRestartWouldRejectPods) and a CPU the kubelet still counts after it went
   (NodeResizeCapacityStale); all three have a `for:`, so within the window they are pending
   (active, as the rulers' API lists them). Every other source says up (healthy()).
2. `bench/fleet.py serve` replays them as N targets; S `vmagent` shards scrape them with
   `-promscrape.cluster.membersCount=S -promscrape.cluster.memberNum=i` (each scrapes the
   targets its hash gives it), the ServiceMonitor's relabelings mirrored, and remote-write to
   one `victoria-metrics` (single node: the store), each adding `nre_shard=<i>`.
3. The rules are split as a sharded fleet runs them: the groups named `*.global` (the mixin's,
   deploy/prometheusrule-global.yaml: rules that read every node's series) on one `vmalert`
   against the whole store, the global ruler; every other group on one `vmalert` per shard
   that sees only its shard's series (group `params: extra_label: nre_shard=<i>`, its
   recordings labelled `nre_shard=<i>`, so its alerts read back its own recordings), all
   evaluating live every interval, recordings written back, alerts sent to Debian's
   Alertmanager. Every rule outside a `.global` group must be per node by its PromQL
   (`rule_scope`: every aggregation and vector match keeps `node`, nothing absent()-shaped),
   else the run stops: a shard would answer it wrongly.
4. After the window: every dashboard query timed against the store (bench/fleet.py's
   run_queries: the same expressions and Grafana substitutions), memory and CPU of the store,
   each shard and each ruler, each ruler's evaluation time per group, and each rule's own
   cost as an instant query against the whole store and against one shard's series.
5. **Per-node alerts on any one shard**: every faulty node's alerts (FAULTS) must be raised
   by exactly one shard's ruler, the one whose shard scraped the node, none on a healthy
   node, and the global ruler must raise none (every target is up, every series there) while
   recording the cross-node recordings for every node.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import fleet  # noqa: E402
from testkit.exporter_proc import free_port, terminate  # noqa: E402

VICTORIA_METRICS, VMAGENT, VMALERT = ("/usr/bin/victoria-metrics", "/usr/bin/vmagent",
                                      "/usr/bin/vmalert")
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
# What vmagent 1.79 asks a target for (lib/promscrape/client.go): the text format.
VMAGENT_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
FIRING = "nre-firing"
SHARD_LABEL = "nre_shard"
# (line prefix, replayed value) on the faulty nodes, and the alert each makes fire.
FAULTS = {
    'node_resize_exporter_source_up{source="sysfs"}': ("0", "NodeResizeExporterSourceDown"),
    'node_resize_readmission_forecast_rejected_pods{reason="OutOfcpu",resource="cpu"}':
        ("1", "NodeResizeRestartWouldRejectPods"),
    'node_resize_capacity_drift{resource="cpu",unit="core"}': ("-1", "NodeResizeCapacityStale"),
}
# (full, quick): 10,000 nodes on 4 shards every 60 s: on this 2-CPU machine shared with other
# sessions (load 25 seen) the one-process Python replay cannot answer 10,000 targets every 15 s
# (vmagent's connections time out in its accept queue); the store, shards and ruler are not the
# limit. The smoke run is what tests/e2e/test_bench_fleet_vm.py runs.
SIZES = {"nodes": (10000, 40), "shards": (4, 2), "interval": (60.0, 2.0),
         "window": (300.0, 8.0), "repeats": (1, 1)}


def say(msg: str) -> None:
    print(f"fleet-vm: {msg}", file=sys.stderr, flush=True)


def faulty(n: int) -> bool:
    return n % 10 == 7


# What a healthy node's gauges say, whatever the recording machine's state was when recorded
# (another session may have a CPU offline, and the kernel then disagrees with the test API
# server's Node: every replayed node would raise NodeResizeCapacityStale): (series regex, value).
HEALTHY = (
    (rb'node_resize_exporter_source_up\{source="(?!kubelet_process")[^"]*"\}', b"1.0"),
    (rb"node_resize_capacity_drift\{[^}]*\}", b"0.0"),
    (rb'node_resize_kernel_cpus\{state="offline"\}', b"0.0"),
    (rb"node_resize_podresources_offline_cpus(?:\{[^}]*\})?", b"0.0"),
    (rb"node_resize_memory_hot_added_blocks\{[^}]*\}", b"0.0"),
    (rb"node_resize_running_containers_stale\{[^}]*\}", b"0.0"),
    (rb"node_resize_readmission_forecast_rejected_pods\{[^}]*\}", b"0.0"),
    (rb"node_resize_readmission_forecast_valid\{[^}]*\}", b"1.0"),
    (rb"node_resize_exporter_sink_up\{[^}]*\}", b"1.0"),
)


def healthy(body: bytes) -> bytes:
    """The recording as a healthy node's (HEALTHY; kubelet_process, which no alert reads, stays
    as it was)."""
    for series, value in HEALTHY:
        body = re.sub(rb"^(" + series + rb") \S+$", rb"\1 " + value, body, flags=re.M)
    return body


def inject_faults(body: bytes) -> bytes:
    """The recorded exposition with FAULTS' values on their lines; each line must be there."""
    lines = body.decode().split("\n")
    for prefix, (value, _) in FAULTS.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(prefix + " ")]
        if len(hits) != 1:
            raise RuntimeError(f"the recorded scrape has {len(hits)} lines {prefix}")
        lines[hits[0]] = f"{prefix} {value}"
    return "\n".join(lines).encode()


# ------------------------------------------------------------------------ rule classification

def _labels_of(modifier) -> tuple[str, list[str]] | None:
    if modifier is None:
        return None
    kind = str(getattr(modifier, "type", "")).rsplit(".", 1)[-1].lower()
    # AggModifierType By/Without; LabelModifierType Include (on) / Exclude (ignoring)
    kind = {"include": "on", "exclude": "ignoring"}.get(kind, kind)
    return kind, list(getattr(modifier, "labels", None) or [])


def _per_node(node, recorded: dict[str, bool]) -> bool:
    """Does this PromQL answer each node from that node's series alone, keeping `node`?"""
    import promql_parser as pp
    if isinstance(node, (pp.NumberLiteral, pp.StringLiteral)):
        return True
    if isinstance(node, pp.VectorSelector):
        return recorded.get(node.name or "", True)
    if isinstance(node, pp.MatrixSelector):
        return _per_node(node.vector_selector, recorded)
    if isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
        return _per_node(node.expr, recorded)
    if isinstance(node, pp.AggregateExpr):
        mod = _labels_of(node.modifier)
        keeps = mod is not None and ((mod[0] == "by" and "node" in mod[1])
                                     or (mod[0] == "without" and "node" not in mod[1]))
        return keeps and _per_node(node.expr, recorded)
    if isinstance(node, pp.Call):
        if node.func.name in ("absent", "absent_over_time", "vector", "time", "scalar"):
            return False
        if node.func.name == "label_replace" and str(node.args[1]) in ('"node"', "node"):
            return False
        return all(_per_node(a, recorded) for a in node.args)
    if isinstance(node, pp.BinaryExpr):
        scalar = {pp.NumberLiteral, pp.StringLiteral}
        if type(node.lhs) in scalar or type(node.rhs) in scalar:
            return _per_node(node.lhs, recorded) and _per_node(node.rhs, recorded)
        matching = _labels_of(getattr(node.modifier, "matching", None)) if node.modifier else None
        if matching is not None:
            kind, labels = matching
            # `instance` names one target: its series are all on the shard that scrapes it.
            if (kind == "on" and not {"node", "instance"} & set(labels)) or (
                    kind == "ignoring" and "node" in labels):
                return False
        return _per_node(node.lhs, recorded) and _per_node(node.rhs, recorded)
    raise ValueError(f"rule_scope: no rule for {type(node).__name__}")


def rule_scope(rules_file: Path = fleet.RULES) -> dict[str, str]:
    """{rule name: "node" | "global"} for every rule: "node" when a ruler that sees only some
    nodes' series (one shard) gives each of them the answer the global ruler gives."""
    import promql_parser as pp
    recorded: dict[str, bool] = {}
    scope: dict[str, str] = {}
    for group in yaml.safe_load(rules_file.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            ok = _per_node(pp.parse(rule["expr"]), recorded)
            if "record" in rule:
                recorded[name] = ok
            scope[name] = "node" if ok else "global"
    return scope


GLOBAL_SUFFIX = ".global"


def split_rules(rules_file: Path, scope: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """(the global ruler's groups, the shards' groups): the `.global` groups and the others.
    A rule outside a `.global` group that reads other nodes' series is refused: a shard's
    ruler would answer it from a part of the fleet."""
    glob, local = [], []
    for group in yaml.safe_load(rules_file.read_text())["groups"]:
        if group["name"].endswith(GLOBAL_SUFFIX):
            glob.append(group)
            continue
        wrong = [r.get("record") or r["alert"] for r in group["rules"]
                 if scope[r.get("record") or r["alert"]] != "node"]
        if wrong:
            raise ValueError(f"group {group['name']}: {', '.join(wrong)} read other nodes' "
                             f"series: they belong in a {GLOBAL_SUFFIX} group")
        local.append(group)
    return glob, local


def shard_rules(groups: list[dict], shard: int) -> dict:
    """The per-node groups as a shard-local ruler runs them: its queries see its shard's series
    only, and what it records carries its shard label (so its own alerts read it back)."""
    return {"groups": [{**g, "params": {"extra_label": [f"{SHARD_LABEL}={shard}"]},
                        "labels": {SHARD_LABEL: str(shard)}} for g in groups]}


# ------------------------------------------------------------------------------ processes

class Proc:
    """One Debian VictoriaMetrics-family (or Alertmanager) process on a loopback port."""

    def __init__(self, name: str, argv: list[str], work: Path, port: int,
                 health: str = "/health"):
        self.name, self.work, self.port = name, work, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = work / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=work, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited {self.proc.returncode}:\n{self.logs()}")
            try:
                fleet._get(self.url + health, timeout=2)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not ready in 60 s:\n{self.logs()}") from None
                time.sleep(0.2)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def metrics(self) -> str:
        return fleet._get(self.url + "/metrics", timeout=120)[1].decode()

    def usage(self) -> dict:
        """RSS and CPU seconds from /proc (the process's own view, whatever it exports)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        tick = os.sysconf("SC_CLK_TCK")

        def kb(key: str) -> int:
            return int(re.search(rf"{key}:\s+(\d+) kB", status).group(1)) * 1024
        return {"cpu_seconds": (int(stat[11]) + int(stat[12])) / tick,
                "rss_bytes": kb("VmRSS"), "rss_peak_bytes": kb("VmHWM")}

    def stop(self) -> None:
        terminate(self.proc, timeout=60)
        self.log.close()


class Store(Proc):
    """victoria-metrics, single node: the store every shard writes to and every query reads."""

    def __init__(self, work: Path, interval: float):
        port = free_port()
        super().__init__("victoria-metrics", [
            VICTORIA_METRICS, f"-storageDataPath={work / 'vm-data'}", "-retentionPeriod=1d",
            f"-httpListenAddr=127.0.0.1:{port}",
            # A query at "now" sees the last interval's samples (the default hides 30 s).
            f"-search.latencyOffset={interval:g}s",
            # Dashboards over a 10,000-node fleet touch millions of series: the defaults
            # (300,000 series, 30 s) refuse them, and a refusal would be timed as an answer.
            "-search.maxUniqueTimeseries=20000000", "-search.maxQueryDuration=120s",
            "-search.maxSamplesPerQuery=5000000000",
            # The ruler's groups and the benchmark's queries at once, on a loaded machine: the
            # default (2 per CPU, 10 s in the queue) turns a slow answer into a refusal.
            "-search.maxConcurrentRequests=8", "-search.maxQueueDuration=60s",
            "-loggerLevel=WARN"], work, port)

    def api(self, path: str, **params) -> tuple[dict, float]:
        """GET /api/v1/<path> (the Prometheus querying API VictoriaMetrics serves)."""
        return fleet.get_json(f"{self.url}/api/v1/{path}?"
                         f"{urllib.parse.urlencode(params, doseq=True)}")

    def vector(self, expr: str, **params) -> list[dict]:
        answer, _ = self.api("query", query=expr, **params)
        if answer.get("status") != "success":
            raise RuntimeError(f"{expr}: {answer.get('error')}")
        return answer["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.vector(expr)
        return float(result[0]["value"][1]) if result else None

    def measure(self, out: dict, key: str, expr: str) -> None:
        """out[key] = the scalar, or None and the error in out["query_errors"] (a store too
        busy to answer in time on a loaded machine: said, and the run goes on)."""
        try:
            out[key] = self.scalar(expr)
        except RuntimeError as e:
            out[key] = None
            out.setdefault("query_errors", {})[key] = str(e)[:300]

    def series(self) -> int:
        """Series the store holds (the TSDB status's total, as /api/v1/status/tsdb says)."""
        answer, _ = self.api("status/tsdb", topN=1)
        return int(answer["data"]["totalSeries"])


def scrape_config(work: Path, interval: float, targets: list[dict]) -> Path:
    (work / "targets.json").write_text(json.dumps(targets))
    # Half the interval, at most 30 s: the replay server shares 2 CPUs with whatever else runs,
    # and a scrape it answers late is its delay, not the store's.
    config = {"global": {"scrape_interval": f"{interval:g}s",
                         "scrape_timeout": f"{min(interval / 2, 30.0):g}s"},
              "scrape_configs": [{"job_name": fleet.NRE,
                                  "file_sd_configs": [{"files": [str(work / "targets.json")]}],
                                  "relabel_configs": fleet.mirrored_relabelings()}]}
    path = work / "scrape.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def targets(nodes: int, port: int) -> list[dict]:
    """bench/fleet.py's file_sd, the faulty nodes pointed at the faulty replay."""
    out = fleet.file_sd(fleet.NRE, nodes, port)
    for n, group in enumerate(out):
        if faulty(n):
            group["labels"]["__metrics_path__"] = f"/{FIRING}/{n}/metrics"
    return out


def vmagent(work: Path, config: Path, store: Store, shard: int, shards: int) -> Proc:
    port = free_port()
    return Proc(f"vmagent-{shard}", [
        VMAGENT, f"-promscrape.config={config}", f"-httpListenAddr=127.0.0.1:{port}",
        f"-promscrape.cluster.membersCount={shards}", f"-promscrape.cluster.memberNum={shard}",
        f"-remoteWrite.url={store.url}/api/v1/write",
        f"-remoteWrite.tmpDataPath={work / f'vmagent-{shard}'}",
        f"-remoteWrite.label={SHARD_LABEL}={shard}", "-loggerLevel=WARN"], work, port)


def vmalert(work: Path, name: str, rules: Path, store: Store, notifier: Proc,
            interval: float) -> Proc:
    port = free_port()
    return Proc(name, [
        VMALERT, f"-rule={rules}", f"-datasource.url={store.url}",
        f"-remoteWrite.url={store.url}", f"-remoteRead.url={store.url}",
        f"-notifier.url={notifier.url}", f"-evaluationInterval={interval:g}s",
        f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"], work, port)


def alertmanager(work: Path) -> Proc:
    port, cluster = free_port(), free_port()
    (work / "alertmanager.yml").write_text(yaml.safe_dump(
        {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
    return Proc("alertmanager", [
        ALERTMANAGER, f"--config.file={work / 'alertmanager.yml'}",
        f"--storage.path={work / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
        f"--cluster.listen-address=127.0.0.1:{cluster}"], work, port, health="/-/ready")


def ruler_alerts(ruler: Proc) -> list[dict]:
    """vmalert's active alerts (pending and firing): name, labels, state."""
    answer, _ = fleet.get_json(ruler.url + "/api/v1/alerts")
    return [{"name": a["name"], "labels": a["labels"], "state": a["state"]}
            for a in (answer.get("data") or {}).get("alerts") or []]


def group_timings(ruler: Proc) -> dict[str, dict]:
    """vmalert_iteration_duration_seconds per group: mean and max, ms."""
    sums: dict[str, dict] = {}
    for line in ruler.metrics().splitlines():
        m = re.match(r"vmalert_iteration_duration_seconds(_sum|_count)?\{([^}]*)\} (\S+)", line)
        if not m:
            continue
        suffix, labels, value = m.groups()
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        g = sums.setdefault(found["group"], {})
        if suffix:
            g[suffix[1:]] = float(value)
        elif found.get("quantile") == "1":  # the largest of the last few minutes' evaluations
            g["max_ms"] = round(float(value) * 1000, 2)
    return {name: {"mean_ms": round(g["sum"] / g["count"] * 1000, 2) if g.get("count") else None,
                   "max_ms": g.get("max_ms"), "evaluations": int(g.get("count", 0))}
            for name, g in sums.items()}


def wanted_alerts(nodes: int) -> set[tuple[str, str]]:
    """(alert, node) for every faulty node's every fault: what the fleet must raise."""
    return {(alert, fleet.node_name(n)) for n in range(nodes) if faulty(n)
            for _, alert in FAULTS.values()}


def alert_check(store: Store, shard_rulers: list[Proc], global_ruler: Proc, nodes: int,
                interval: float, timeout: float) -> dict:
    """Each shard's ruler against the faulty nodes its shard scraped (see the module's
    docstring): every wanted (alert, node) raised by exactly one shard, its own; the global
    ruler's alerts (none wanted) and how many nodes its cross-node recordings cover."""
    shards = len(shard_rulers)
    nodes_of = {s: {r["metric"]["node"] for r in store.vector(
        f'count by (node) (last_over_time(up{{job="{fleet.NRE}",{SHARD_LABEL}="{s}"}}[1h]))')}
        for s in range(shards)}
    wanted = wanted_alerts(nodes)
    want = {s: {k for k in wanted if k[1] in nodes_of[s]} for s in range(shards)}
    # A loaded machine delays evaluations: bounded, and what it had is what is reported.
    deadline = time.monotonic() + timeout
    raised: dict[int, list[tuple[str, str]]] = {}
    while True:
        raised = {s: [(a["name"], a["labels"].get("node", "")) for a in ruler_alerts(r)]
                  for s, r in enumerate(shard_rulers)}
        if all(sorted(raised[s]) == sorted(want[s]) for s in range(shards)) or \
                time.monotonic() > deadline:
            break
        time.sleep(min(interval / 2, 10))
    times: dict[tuple[str, str], int] = {}
    for s in range(shards):
        for k in raised[s]:
            times[k] = times.get(k, 0) + 1
    global_alerts = ruler_alerts(global_ruler)
    recorded = {}
    for name in global_recordings():
        try:
            recorded[name] = len(store.vector(f"count by (node) ({name})"))
        except RuntimeError as e:
            recorded[name] = repr(e)[:200]
    return {
        "nodes_per_shard": [len(nodes_of[s]) for s in range(shards)],
        "wanted": len(wanted),
        "shards": [{"shard": s, "alerts": len(raised[s]), "want": len(want[s]),
                    "missing": sorted(map(str, want[s] - set(raised[s])))[:10],
                    "extra": sorted(map(str, set(raised[s]) - want[s]))[:10]}
                   for s in range(shards)],
        "raised_once": sum(1 for k in wanted if times.get(k) == 1),
        "raised_more_than_once": sorted(map(str, (k for k, v in times.items() if v > 1)))[:10],
        "on_healthy_nodes": sorted(map(str, {k for k in times if k not in wanted}))[:10],
        "correct": times == {k: 1 for k in wanted},
        "alerts_by_name": _count_by_name([{"name": k[0]} for k in times]),
        "global_alerts": _count_by_name(global_alerts),
        "global_recordings_nodes": recorded,
    }


def global_recordings(rules_file: Path = fleet.RULES) -> list[str]:
    return [r["record"] for g in yaml.safe_load(rules_file.read_text())["groups"]
            if g["name"].endswith(GLOBAL_SUFFIX) for r in g["rules"] if "record" in r]


def top_queries(store: Store, n: int = 8) -> list[dict]:
    """The store's slowest queries by mean duration (/api/v1/status/top_queries): what the
    rulers asked during the window, and how long each took as they asked it."""
    answer, _ = fleet.get_json(f"{store.url}/api/v1/status/top_queries?topN={n}")
    return [{"query": " ".join(q["query"].split())[:300],
             "mean_s": round(q["avgDurationSeconds"], 2), "count": q["count"]}
            for q in answer.get("topByAvgDuration") or []]


def rule_costs(store: Store, groups: list[dict], shard: int) -> list[dict]:
    """Each rule's query once against the whole store (as one ruler for the fleet asks it)
    and once against one shard's series (as that shard's ruler asks it): ms and series."""
    out = []
    for group in groups:
        for rule in group["rules"]:
            row: dict = {"rule": rule.get("record") or rule["alert"], "group": group["name"]}
            for key, extra in (("fleet", {}), ("shard", {"extra_label": f"{SHARD_LABEL}={shard}"})):
                answer, t = store.api("query", query=rule["expr"], **extra)
                ok = answer.get("status") == "success"
                row[f"{key}_ms"] = round(t * 1000, 1)
                row[f"{key}_series"] = len(answer["data"]["result"]) if ok else None
                if not ok:
                    row[f"{key}_error"] = str(answer.get("error"))[:200]
            out.append(row)
    return sorted(out, key=lambda r: -r["fleet_ms"])


def _count_by_name(alerts: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in alerts:
        out[a["name"]] = out.get(a["name"], 0) + 1
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------------ the benchmark

def debian_version(package: str) -> str:
    """The binaries print no version of their own (Debian's build): the package's."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                         text=True, timeout=30)
    return out.stdout.strip() or "unknown"


def fleet_vm(nodes: int, shards: int, interval: float, window: float,
             repeats: int = 1, out: dict | None = None) -> dict:
    """The benchmark; `out` (if given) is filled as it goes, so a failed run keeps its
    measurements."""
    out = {} if out is None else out
    for binary in (VICTORIA_METRICS, VMAGENT, VMALERT, ALERTMANAGER, fleet.PROMETHEUS):
        if not os.access(binary, os.X_OK):
            raise FileNotFoundError(f"{binary} is not installed: run scripts/setup.sh test")
    say("recording one scrape of the exporter ...")
    rec = fleet.record_exporter(kubernetes=True, accept=VMAGENT_ACCEPT)
    rec = dict(rec, body=healthy(rec["body"]))
    bad = dict(rec, body=inject_faults(rec["body"]))
    scope = rule_scope()
    out.update({
        "sizes": {"nodes": nodes, "shards": shards, "scrape_interval_s": interval,
                  "evaluation_interval_s": interval, "window_s": window,
                  "query_repeats": repeats, "faulty_nodes": sum(map(faulty, range(nodes)))},
        "victoria_metrics": debian_version("victoria-metrics"),
        "exposition": {k: v for k, v in rec.items() if k != "body"},
        "rule_scope": scope})
    server = fleet.FleetServer({fleet.NRE: rec, FIRING: bad})
    work = Path(tempfile.mkdtemp(prefix="nre-fleet-vm-", dir="/var/tmp"))
    procs: list[Proc] = []
    try:
        store = Store(work, interval)
        procs.append(store)
        notifier = alertmanager(work)
        procs.append(notifier)
        glob, local = split_rules(fleet.RULES, scope)
        (work / "global.rules.yml").write_text(yaml.safe_dump({"groups": glob}, sort_keys=False))
        ruler = vmalert(work, "vmalert-global", work / "global.rules.yml", store, notifier,
                        interval)
        procs.append(ruler)
        shard_rulers = []
        for i in range(shards):
            path = work / f"shard-{i}.rules.yml"
            path.write_text(yaml.safe_dump(shard_rules(local, i), sort_keys=False))
            shard_rulers.append(vmalert(work, f"vmalert-shard-{i}", path, store, notifier,
                                        interval))
        procs.extend(shard_rulers)
        config = scrape_config(work, interval, targets(nodes, server.port))
        agents = [vmagent(work, config, store, s, shards) for s in range(shards)]
        procs.extend(agents)
        say(f"{nodes} targets on {shards} vmagent shards every {interval:g}s ...")
        t0 = time.monotonic()
        # 1.16 million new series to index at 10,000 nodes: minutes on a loaded machine.
        up_timeout = 3 * interval + 120 + nodes / 10

        def up_once() -> float | None:
            """Targets answered at least once since the shards started (a late answer on a
            loaded machine is counted in the window's failed scrapes, not waited out)."""
            since = f"{time.monotonic() - t0 + interval:.0f}s"
            try:
                return store.scalar(f'count(max_over_time(up{{job="{fleet.NRE}"}}[{since}])'
                                    " == 1)")
            except RuntimeError:  # the store too busy to answer in time: ask again
                return None
        while up_once() != nodes:
            if time.monotonic() - t0 > up_timeout:
                raise RuntimeError(f"not every target up in {up_timeout:g}s: "
                                   f"{up_once()}/{nodes}")
            time.sleep(min(interval, 5))
        out["all_up_after_s"] = round(time.monotonic() - t0, 1)
        first = {p.name: p.usage() for p in procs}
        load_start = os.getloadavg()[0]
        start = time.time()
        peaks: dict[str, int] = {}
        while time.time() - start < window:
            time.sleep(min(interval, max(0.0, window - (time.time() - start))))
            for p in procs:
                peaks[p.name] = max(peaks.get(p.name, 0), p.usage()["rss_bytes"])
        end = time.time()
        elapsed = end - start
        last = {p.name: p.usage() for p in procs}
        out["window_s"] = round(elapsed, 1)
        out["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
        out["processes"] = {
            p.name: {"rss_bytes": last[p.name]["rss_bytes"],
                     "rss_peak_bytes": last[p.name]["rss_peak_bytes"],
                     "cpu_cores": round((last[p.name]["cpu_seconds"]
                                         - first[p.name]["cpu_seconds"]) / elapsed, 3)}
            for p in procs}
        w = f"{elapsed:.0f}s"
        job = f'job="{fleet.NRE}"'
        store.measure(out, "up", f"count(up{{{job}}} == 1)")
        store.measure(out, "up_ever", f"count(max_over_time(up{{{job}}}[{w}]) == 1)")
        try:
            out["targets_per_shard"] = {
                r["metric"][SHARD_LABEL]: int(r["value"][1]) for r in
                store.vector(f"count by ({SHARD_LABEL}) (max_over_time(up{{{job}}}[{w}]))")}
        except RuntimeError as e:
            out["targets_per_shard"] = {}
            out.setdefault("query_errors", {})["targets_per_shard"] = str(e)[:300]
        store.measure(out, "scrapes", f"sum(count_over_time(up{{{job}}}[{w}]))")
        store.measure(out, "scrapes_failed", f"sum(count_over_time(up{{{job}}}[{w}])) - "
                      f"sum(sum_over_time(up{{{job}}}[{w}]))")
        store.measure(out, "samples_scraped",
                      f"sum(last_over_time(scrape_samples_scraped{{{job}}}[{w}]))")
        store.measure(out, "scrape_duration_p50_s",
                      f"quantile(0.5, last_over_time(scrape_duration_seconds{{{job}}}[{w}]))")
        store.measure(out, "scrape_duration_max_s",
                      f"max(max_over_time(scrape_duration_seconds{{{job}}}[{w}]))")
        try:
            out["store_series"] = store.series()
        except (KeyError, ValueError, TypeError) as e:  # an error answer has no data
            out["store_series"] = None
            out.setdefault("query_errors", {})["store_series"] = repr(e)[:300]
        out["rule_groups"] = {}
        for r in [ruler, *shard_rulers]:
            try:
                out["rule_groups"][r.name] = group_timings(r)
            except OSError as e:  # too busy to answer in 2 min on a loaded machine: said
                out["rule_groups"][r.name] = {}
                out.setdefault("query_errors", {})[f"{r.name} /metrics"] = repr(e)[:300]
        say(f"alerts of each of {shards} shards' rulers and the global ruler ...")
        out["alert_check"] = alert_check(store, shard_rulers, ruler, nodes, interval,
                                         timeout=10 * interval + 60)
        out["alerts_by_name"] = out["alert_check"]["alerts_by_name"]
        out["store_top_queries"] = top_queries(store)
        # Timed alone: the rulers' own queries would otherwise queue with the timed ones.
        for r in [ruler, *shard_rulers]:
            procs.remove(r)
            r.stop()
        say("each rule's own cost ...")
        out["rule_costs"] = rule_costs(store, local + glob, 0)
        say("dashboard queries ...")
        out["queries"] = fleet.run_queries(store, start, end, interval, repeats)
        out["store_rss_peak_after_queries_bytes"] = store.usage()["rss_peak_bytes"]
        return out
    finally:
        for p in reversed(procs):
            p.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

# ------------------------------------------------------------------------------ the table

def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def render(r: dict) -> str:
    """The results as bench/README.md shows them."""
    z, q, c = r["sizes"], r.get("queries"), r["alert_check"]
    shards = ", ".join(str(v) for _, v in sorted(r["targets_per_shard"].items()))
    p50 = (r["scrape_duration_p50_s"] or 0) * 1000
    pmax = (r["scrape_duration_max_s"] or 0) * 1000
    alerts = ", ".join(f"{k} {v}" for k, v in r["alerts_by_name"].items())
    per_shard = ", ".join(f"{x['alerts']} ({x['want']})" for x in c["shards"])
    verdict = ("each exactly once, on its own shard, none on a healthy node" if c["correct"]
               else "**not** exactly the faulty nodes' alerts once each")
    glob = ", ".join(f"{k} {v}" for k, v in c["global_alerts"].items()) or "none"
    recs = ", ".join(f"`{k}` {v}" for k, v in c["global_recordings_nodes"].items())

    def dist(k: str) -> str:
        v = q[k]
        return f"{v['n']}: {v.get('p50_ms', '-')} / {v.get('max_ms', '-')}"

    lines = [
        f"victoria-metrics {r['victoria_metrics']} (Debian); {z['nodes']:,} replayed nodes "
        f"({z['faulty_nodes']:,} faulty) on {z['shards']} vmagent shards, scraped every "
        f"{z['scrape_interval_s']:g} s, rules every {z['evaluation_interval_s']:g} s by "
        f"{z['shards']} shard rulers and one global ruler, for {r['window_s']:g} s after every "
        f"target was up ({r['all_up_after_s']:g} s); load average {r['loadavg_1m'][0]:g} -> "
        f"{r['loadavg_1m'][1]:g}.", "",
        "| | |", "|---|---|",
        f"| series per scrape (one node) | {r['exposition']['series']} |",
        f"| targets up | {r['up']:.0f}/{z['nodes']} |",
        f"| targets per shard | {shards} |",
        f"| scrapes / failed | {r['scrapes']:,.0f} / {r['scrapes_failed']:,.0f} |",
        f"| scrape duration p50 / max (ms; the replay server) | {p50:,.1f} / {pmax:,.1f} |",
        f"| series in the store | {r['store_series']:,} |"]
    for name, pr in r["processes"].items():
        lines.append(f"| {name}: RSS at the end (peak), CPU cores over the window | "
                     f"{_mib(pr['rss_bytes'])} ({_mib(pr['rss_peak_bytes'])}), "
                     f"{pr['cpu_cores']:.2f} |")
    lines.append(f"| victoria-metrics RSS peak after the dashboard queries | "
                 f"{_mib(r.get('store_rss_peak_after_queries_bytes'))} |")
    for ruler, groups in r["rule_groups"].items():
        for name, t in groups.items():
            lines.append(f"| {ruler} `{name}`: mean / max evaluation (ms), evaluations | "
                         f"{t['mean_ms']} / {t['max_ms']}, {t['evaluations']} |")
    if q:
        lines += [
            f"| dashboard queries as Grafana sends them ({q['expressions']} expressions; "
            f"n: p50 / max ms) | {dist('as_grafana_sends_them')} |",
            f"| ... every expression as an instant query | {dist('instant')} |",
            f"| ... every expression as a range query over the window | {dist('range')} |",
            f"| ... variables (label values) | {dist('labels')} |",
            f"| ... errors / empty answers | {len(q['errors'])} / {q['empty']} |"]
    lines += [
        f"| per-node alerts, shard rulers: alerts per shard (want) | {per_shard} |",
        f"| ... by name, all shards | {alerts}: {verdict} |",
        f"| global ruler: alerts raised | {glob} (want none) |",
        f"| ... its recordings: nodes covered | {recs} |"]
    top = r.get("store_top_queries") or []
    if top:
        lines += ["", "The store's slowest queries during the window, by mean duration (the "
                  "rulers' own, as they asked them):", "", "| query | mean s | count |",
                  "|---|---|---|"]
        lines += [f"| `{x['query'][:160]}` | {x['mean_s']} | {x['count']} |" for x in top]
    costs = r.get("rule_costs") or []
    if costs:
        lines += ["", "Costliest rules (each rule's query once, instant, against the whole "
                  "store and against shard 0's series):", "",
                  "| rule | group | whole store: ms, series | shard 0: ms, series |",
                  "|---|---|---|---|"]
        lines += [f"| {x['rule']} | {x['group']} | {x['fleet_ms']:,}, {x['fleet_series']} | "
                  f"{x['shard_ms']:,}, {x['shard_series']} |" for x in costs[:8]]
    if q:
        lines += ["", "Slowest dashboard queries:", "", "| dashboard | panel | query | ms | "
                  "series |", "|---|---|---|---|---|"]
        lines += [f"| {x['dashboard']} | {x['where']} | {x['shape']} | {x['ms']:,} | "
                  f"{x['series']} |" for x in q["slowest"]]
    glob_rules = sorted(n for n, v in r["rule_scope"].items() if v == "global")
    lines += ["", f"Rules that read every node's series (the global ruler's): "
              f"{', '.join(glob_rules)}; the other {len(r['rule_scope']) - len(glob_rules)} "
              "are per node."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--table", type=Path, help="render a results file as markdown")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    for name in ("nodes", "shards"):
        parser.add_argument(f"--{name}", type=int)
    for name in ("interval", "window"):
        parser.add_argument(f"--{name}", type=float)
    args = parser.parse_args(argv)
    if args.table:
        print(render(json.loads(args.table.read_text())))
        return 0
    i = 1 if args.quick else 0
    size = {k: getattr(args, k, None) or SIZES[k][i] for k in ("nodes", "shards", "interval",
                                                               "window")}
    started = time.time()
    result: dict = {}
    try:
        fleet_vm(**size, repeats=SIZES["repeats"][i], out=result)
    except Exception as e:
        result["failed"] = repr(e)[:1000]
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        raise
    result["command"] = "bench/fleet_vm.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["started_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))
    result["seconds"] = round(time.time() - started)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text if not args.out else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
