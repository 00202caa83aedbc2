"""Every panel, annotation and variable query of every dashboard, run by a real Prometheus on a
recorded scrape sequence of a real hot-unplug (Grafana is not here; this is what it would send).

tests/fixtures/hot-unplug-scrapes.om.gz was recorded by scripts/gen-monitoring-recording.py from
a real exporter on this machine (cpu1 offlined, resynced with a rejected pod, onlined, offlined
again and never resynced; scraped every 2 s). Debian's promtool turns it into TSDB blocks
(`tsdb create-blocks-from openmetrics`), backfills the recording rules
(`tsdb create-blocks-from rules`, against the Prometheus serving those blocks), and the
restarted Prometheus answers each query as Grafana would ask it: template variables
substituted, $__rate_interval as Grafana computes it, range queries for graphs and annotations,
instant queries for stats and tables. No error anywhere, and no empty answer where the
recording has data; the few panels about things the recording does not contain (balloon pods)
are listed with the reason, and must really be empty.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testkit.exporter_proc import free_port
from testkit.monitoring import dashboard_exprs
from testkit.prometheus import Daemon, get_json

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "hot-unplug-scrapes.om.gz"
RULES = REPO / "alerts" / "node-resize-exporter.rules.yml"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
JOB, CLUSTER, NODE, RECORDED_EVERY = "node-resize-exporter", "rec-cluster", "rec-node", 2

RECORDED_BEFORE = "the recording predates this family"
# (dashboard, where) -> why the recording has no data for it.
EMPTY_BY_DESIGN = {
    ("fleet-overview.json", "panel 'CPU: kernel, kubelet, balloon, effective' C"):
        "no balloon pod in the recording",
    ("fleet-overview.json", "panel 'Memory: kernel, kubelet, balloon, effective' C"):
        "no balloon pod in the recording",
    ("fleet-overview.json", "panel 'Balloon resizes by result' A"): "no balloon resize",
    ("node-detail.json", "panel 'Balloon pods and resizes' B"): "no balloon resize",
    ("fleet-overview.json", "annotation 'Kubelet restarts'"): "no kubelet on the recording host",
    # The table of nodes in trouble has one column per kind of trouble; the recording's node
    # has two (stale CPU, a rejected pod) and an offline CPU the kubelet offers.
    ("fleet-overview.json", "panel 'Nodes in trouble' B"): "it ends stale, nothing stranded",
    ("fleet-overview.json", "panel 'Nodes in trouble' C"): "no kubelet checkpoint on the host",
    ("fleet-overview.json", "panel 'Nodes in trouble' D"): "every source stayed up",
    ("fleet-overview.json", "panel 'Nodes in trouble' E"): "every scrape succeeded",
    ("fleet-overview.json", "panel 'Top 10 nodes by memory drift (kernel - kubelet)' A"):
        "only cpu1 was unplugged: memory never drifted",
    ("node-detail.json", "annotation 'Kubelet restarts'"): "no kubelet on the recording host",
    ("fleet-overview.json",
     "panel 'Nodes whose Node object differs from the kernel, since when' D"):
        "only cpu1 was unplugged: memory never drifted",
    # The recording predates the forecast, running-containers and sink families (its exporter
    # ran with --no-journal); tests/e2e/test_servicemonitor_path.py reads the forecast through
    # a real Prometheus from a running exporter, and test_alerts.py runs every query on a live
    # scrape.
    ("fleet-overview.json", "panel 'Nodes in trouble' I"): RECORDED_BEFORE,
    ("node-detail.json", "panel 'Pods a kubelet restart would reject' A"): RECORDED_BEFORE,
    ("node-detail.json", "panel 'Running containers stale' A"): RECORDED_BEFORE,
    ("node-detail.json", "panel 'Pods a kubelet restart now would reject' A"): RECORDED_BEFORE,
    ("node-detail.json", "panel 'Forecast: pods a restart would reject, by reason' A"):
        RECORDED_BEFORE,
    ("node-detail.json", "panel 'Forecast: pods a restart would reject, by reason' B"):
        RECORDED_BEFORE,
    ("node-detail.json", "panel 'Running containers stale, by kind' A"): RECORDED_BEFORE,
    ("node-detail.json", "panel 'Sinks up' A"): RECORDED_BEFORE,
    # The recording is older than the plan's gauges; a new one (scripts/gen-monitoring-recording.py)
    # has them.
    ("node-detail.json", "panel 'Before you unplug: CPUs that can leave now' A"):
        "recorded before node_resize_unpluggable existed",
    ("node-detail.json", "panel 'Before you unplug: memory that can leave now' A"):
        "recorded before node_resize_unpluggable existed",
    ("fleet-overview.json", "panel 'Top 10 nodes by memory reclaimable now' A"):
        "recorded before node_resize_unpluggable existed",
    **{("node-detail.json", f"panel 'Memory blocks by zone' {ref}"):
       "recorded before node_resize_unpluggable existed" for ref in "AB"},
}

pytestmark = pytest.mark.promtool


def _promtool(*args: str, cwd: Path) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: run scripts/setup.sh test")
    result = subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"


def _timestamps(text: str) -> tuple[float, float]:
    stamps = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")]
    return min(stamps), max(stamps)


def _prometheus(work: Path, data: Path) -> Daemon:
    port = free_port()
    (work / "prometheus.yml").write_text("global: {}\n")
    prom = Daemon("prometheus", [f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={data}",
                                 "--storage.tsdb.retention.time=100y",
                                 f"--web.listen-address=127.0.0.1:{port}"], port, work)
    prom.wait_ready()
    return prom


@dataclass(frozen=True)
class Recorded:
    url: str
    start: float
    end: float
    scrape: int  # seconds between the scrapes Prometheus holds
    step: int  # Grafana's $__interval for this range and width: the scrape interval here

    @property
    def rate_interval(self) -> int:
        """Grafana's: max($__interval + scrape interval, 4 x scrape interval)."""
        return max(self.step + self.scrape, 4 * self.scrape)


def _thin(text: str, keep_every: int) -> str:
    """The recording as a Prometheus scraping `keep_every` times less often would hold it."""
    if keep_every == 1:
        return text
    lines = text.splitlines()
    stamps = sorted({line.rsplit(" ", 1)[1] for line in lines if not line.startswith("#")})
    kept = set(stamps[::keep_every])
    return "\n".join(line for line in lines
                     if line.startswith("#") or line.rsplit(" ", 1)[1] in kept) + "\n"


# The recording's own 2 s, and the same scrapes as a 6 s scrape interval would have taken them:
# the windows must hold at both.
@pytest.fixture(scope="module", params=[1, 3], ids=["scrape-2s", "scrape-6s"])
def recorded(request, tmp_path_factory):
    """A Prometheus holding the recording and the recording rules over it."""
    work = tmp_path_factory.mktemp("recorded")
    text = _thin(gzip.decompress(FIXTURE.read_bytes()).decode(), request.param)
    scrape = RECORDED_EVERY * request.param
    (work / "scrapes.om").write_text(text)
    start, end = _timestamps(text)
    data = work / "data"
    _promtool("tsdb", "create-blocks-from", "openmetrics", "scrapes.om", str(data), cwd=work)
    prom = _prometheus(work, data)
    try:
        _promtool("tsdb", "create-blocks-from", "rules", f"--start={int(start)}",
                  f"--end={int(end) + 1}", f"--eval-interval={scrape}s",
                  f"--output-dir={work / 'rules-data'}", f"--url={prom.url}", str(RULES),
                  cwd=work)
    finally:
        prom.stop()
    for block in (work / "rules-data").iterdir():
        shutil.move(str(block), data / block.name)
    prom = _prometheus(work, data)
    yield Recorded(prom.url, start, end, scrape, scrape)
    prom.stop()


def _grafana(expr: str, rec: Recorded) -> str:
    expr = expr.replace("$__rate_interval", f"{rec.rate_interval}s")
    expr = expr.replace("$__interval", f"{rec.step}s")
    expr = expr.replace("$__range", f"{int(rec.end - rec.start) + rec.step}s")
    expr = re.sub(r"\$\{?job\}?", JOB, expr)
    expr = re.sub(r"\$\{?cluster\}?", CLUSTER, expr)
    return re.sub(r"\$\{?node\}?", NODE, expr)


def _ask(url: str, path: str, **params) -> dict:
    try:
        return get_json(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b"{}") or {"status": "error", "error": str(e)}


def _answer(rec: Recorded, board: dict, where: str, expr: str) -> list:
    """The query as Grafana sends it for that panel kind; its result list."""
    promql = _grafana(expr, rec)
    if where.startswith("variable"):
        answer = _ask(rec.url, "series", **{"match[]": promql, "start": rec.start,
                                            "end": rec.end})
        assert answer["status"] == "success", (where, promql, answer)
        return answer["data"]
    kind = "graph"
    for panel in board["panels"]:
        if where.startswith(f"panel {panel['title']!r}"):
            kind = panel["type"]
    if kind in ("stat", "table"):
        answer = _ask(rec.url, "query", query=promql, time=rec.end)
    else:
        answer = _ask(rec.url, "query_range", query=promql, start=rec.start, end=rec.end,
                      step=rec.step)
    assert answer.get("status") == "success", (where, promql, answer)
    return answer["data"]["result"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_of_the_dashboard_answers_on_the_recording(recorded, path):
    board = json.loads(path.read_text())
    empty, unexpected = [], []
    for where, expr in dashboard_exprs(board):
        result = _answer(recorded, board, where, expr)
        reason = EMPTY_BY_DESIGN.get((path.name, where))
        if not result and not reason:
            empty.append(f"{where}: {_grafana(expr, recorded)}")
        if result and reason:
            unexpected.append(f"{where} has data now ({reason}?): drop it from EMPTY_BY_DESIGN")
    assert not empty, "empty answers where the recording has data:\n" + "\n".join(empty)
    assert not unexpected, "\n".join(unexpected)


def _instant(rec: Recorded, expr: str) -> list:
    """An instant query at the end of the dashboard's time range (stats and tables)."""
    answer = _ask(rec.url, "query", query=_grafana(expr, rec), time=rec.end)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _target(title: str, ref: str = "A", board: str = "fleet-overview.json") -> str:
    for where, expr in dashboard_exprs(json.loads((REPO / "dashboards" / board).read_text())):
        if where == f"panel {title!r} {ref}":
            return expr
    raise AssertionError(f"no panel {title!r} {ref} in {board}")


def test_the_question_panels_answer_the_questions(recorded):
    """Which nodes are stale now and since when; how long resyncs took; which pods failed."""
    table = "Nodes whose Node object differs from the kernel, since when"
    (drift,) = [r for r in _instant(recorded, _target(table, "A"))
                if r["metric"]["resource"] == "cpu"]
    assert drift["metric"]["node"] == NODE and float(drift["value"][1]) == -1.0
    (since,) = [r for r in _instant(recorded, _target(table, "C"))
                if r["metric"]["resource"] == "cpu"]
    # The second offline happened 38 s into the recording (read at the next scrapes).
    assert abs(float(since["value"][1]) / 1000 - (recorded.start + 38)) < 2 * recorded.scrape
    resyncs = _answer(recorded, {"panels": []}, "graph",
                      _target("Slowest 10 nodes: resync duration p90 (1h window)"))
    assert {r["metric"]["direction"] for r in resyncs if r["metric"]["resource"] == "cpu"} \
        == {"decrease", "increase"}
    (rejected,) = _instant(recorded, _target(
        "Pods rejected at readmission, by node and reason (time range)"))
    assert rejected["metric"]["reason"] == "OutOfcpu" and float(rejected["value"][1]) >= 1
    blocked = _instant(recorded, _target("Nodes where a kubelet restart would fail"))
    assert len(blocked) == 1  # 0 on this machine: no kubelet checkpoint here


def test_the_trouble_table_names_the_node_and_what_is_wrong(recorded):
    """The fleet's table of nodes in trouble, at the end of the recording: the node, with one
    stale resource (cpu), the pod rejected OutOfcpu and the offline cpu1."""
    def column(ref: str) -> dict[str, float]:
        return {r["metric"]["node"]: float(r["value"][1])
                for r in _instant(recorded, _target("Nodes in trouble", ref))}
    assert column("A") == {NODE: 1.0}  # stale resources
    assert column("H")[NODE] >= 1  # pods rejected in the time range
    assert column("G") == {NODE: 1.0}  # cpu1 offline


def test_episode_annotations_mark_every_start_and_end(recorded):
    board = json.loads((REPO / "dashboards" / "node-detail.json").read_text())
    exprs = {a["name"]: a["expr"] for a in board["annotations"]["list"] if "expr" in a}

    def marked(name: str) -> dict[str, list[float]]:
        """Seconds into the recording where each cpu series of the annotation query starts a
        run of steps (Grafana draws one annotation region per series and run), by the label
        that tells the series apart."""
        runs: dict[str, list[float]] = {}
        for series in _answer(recorded, board, "annotation", exprs[name]):
            if series["metric"].get("resource") != "cpu":
                continue
            key = series["metric"].get("change") or series["metric"].get("reason")
            times = [float(t) - recorded.start for t, _ in series["values"]]
            runs.setdefault(key, []).extend(
                t for i, t in enumerate(times) if i == 0 or t - times[i - 1] > recorded.step)
        return runs

    def near(runs: list[float], at: float) -> bool:
        """A run starts once the event is scraped (within two scrapes of it)."""
        return any(at <= t <= at + 2 * recorded.scrape + 1 for t in runs)

    starts, ends = marked("Episode starts"), marked("Episode ends")
    # cpu1 offline at 8 s and 38 s, online at 26 s.
    assert near(starts["hot-unplug"], 8) and near(starts["hot-unplug"], 38), starts
    assert near(starts["hot-plug"], 26), starts
    # Resynced at 16 s (the first resync of the recording); timed out 20 s after 38 s.
    assert near(ends["resynced"], 16), ends
    assert near(ends["resync_timeout"], 58), ends
    # Nothing marked before the first episode began (no series "born" at the range's start).
    assert min(t for runs in [*starts.values(), *ends.values()] for t in runs) >= 8, ends


def test_on_the_real_recording_each_cause_raises_one_alert(recorded):
    """Every alert expression (its `for` aside) at the end of the recording (cpu1 offline and
    not resynced, a pod rejected OutOfcpu 50 s earlier): the stale capacity and the rejected
    pod, nothing else: not the resync_timeout, not the CPU the kubelet still offers, not the
    offline CPU."""
    rules = yaml.safe_load(RULES.read_text())
    firing = set()
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        for series in _instant(recorded, rule["expr"]):
            labels = series["metric"]
            firing.add((rule["alert"], labels.get("resource") or labels.get("reason", "")))
    assert firing == {("NodeResizeCapacityStale", "cpu"),
                      ("NodeResizeReadmissionRejectedPods", "OutOfcpu")}
