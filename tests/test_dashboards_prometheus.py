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
from pathlib import Path

import pytest

from tests.test_alerts import _dashboard_exprs
from tests.test_prometheus_e2e import Daemon, _get_json
from testkit.exporter_proc import free_port

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "hot-unplug-scrapes.om.gz"
RULES = REPO / "alerts" / "node-resize-exporter.rules.yml"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
CLUSTER, NODE, SCRAPE, STEP = "rec-cluster", "rec-node", 2, 2
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval).
RATE_INTERVAL = max(STEP + SCRAPE, 4 * SCRAPE)

# (dashboard, where) -> why the recording has no data for it.
EMPTY_BY_DESIGN = {
    ("fleet-overview.json", "panel 'CPU: kernel, kubelet, balloon, effective' C"):
        "no balloon pod in the recording",
    ("fleet-overview.json", "panel 'Memory: kernel, kubelet, balloon, effective' C"):
        "no balloon pod in the recording",
    ("fleet-overview.json", "panel 'Balloon resizes by result' A"): "no balloon resize",
    ("node-detail.json", "panel 'Balloon pods and resizes' B"): "no balloon resize",
    ("fleet-overview.json", "annotation 'Kubelet restarts'"): "no kubelet on the recording host",
    ("node-detail.json", "annotation 'Kubelet restarts'"): "no kubelet on the recording host",
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


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A Prometheus holding the recording and the recording rules over it: (url, start, end)."""
    work = tmp_path_factory.mktemp("recorded")
    text = gzip.decompress(FIXTURE.read_bytes()).decode()
    (work / "scrapes.om").write_text(text)
    start, end = _timestamps(text)
    data = work / "data"
    _promtool("tsdb", "create-blocks-from", "openmetrics", "scrapes.om", str(data), cwd=work)
    prom = _prometheus(work, data)
    try:
        _promtool("tsdb", "create-blocks-from", "rules", f"--start={int(start)}",
                  f"--end={int(end) + 1}", f"--eval-interval={STEP}s",
                  f"--output-dir={work / 'rules-data'}", f"--url={prom.url}", str(RULES),
                  cwd=work)
    finally:
        prom.stop()
    for block in (work / "rules-data").iterdir():
        shutil.move(str(block), data / block.name)
    prom = _prometheus(work, data)
    yield prom.url, start, end
    prom.stop()


def _grafana(expr: str, start: float, end: float) -> str:
    expr = expr.replace("$__rate_interval", f"{RATE_INTERVAL}s")
    expr = expr.replace("$__interval", f"{STEP}s")
    expr = expr.replace("$__range", f"{int(end - start) + STEP}s")
    expr = re.sub(r"\$\{?cluster\}?", CLUSTER, expr)
    return re.sub(r"\$\{?node\}?", NODE, expr)


def _ask(url: str, path: str, **params) -> dict:
    try:
        return _get_json(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b"{}") or {"status": "error", "error": str(e)}


def _answer(url: str, board: dict, where: str, expr: str, start: float, end: float) -> list:
    """The query as Grafana sends it for that panel kind; its result list."""
    promql = _grafana(expr, start, end)
    if where.startswith("variable"):
        answer = _ask(url, "series", **{"match[]": promql, "start": start, "end": end})
        assert answer["status"] == "success", (where, promql, answer)
        return answer["data"]
    kind = "graph"
    for panel in board["panels"]:
        if where.startswith(f"panel {panel['title']!r}"):
            kind = panel["type"]
    if kind in ("stat", "table"):
        answer = _ask(url, "query", query=promql, time=end)
    else:
        answer = _ask(url, "query_range", query=promql, start=start, end=end, step=STEP)
    assert answer.get("status") == "success", (where, promql, answer)
    return answer["data"]["result"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_of_the_dashboard_answers_on_the_recording(recorded, path):
    url, start, end = recorded
    board = json.loads(path.read_text())
    empty, unexpected = [], []
    for where, expr in _dashboard_exprs(board):
        result = _answer(url, board, where, expr, start, end)
        reason = EMPTY_BY_DESIGN.get((path.name, where))
        if not result and not reason:
            empty.append(f"{where}: {_grafana(expr, start, end)}")
        if result and reason:
            unexpected.append(f"{where} has data now ({reason}?): drop it from EMPTY_BY_DESIGN")
    assert not empty, "empty answers where the recording has data:\n" + "\n".join(empty)
    assert not unexpected, "\n".join(unexpected)


def _instant(url: str, expr: str, start: float, end: float) -> list:
    """An instant query at the end of the dashboard's time range (stats and tables)."""
    answer = _ask(url, "query", query=_grafana(expr, start, end), time=end)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _target(title: str, ref: str = "A", board: str = "fleet-overview.json") -> str:
    for where, expr in _dashboard_exprs(json.loads((REPO / "dashboards" / board).read_text())):
        if where == f"panel {title!r} {ref}":
            return expr
    raise AssertionError(f"no panel {title!r} {ref} in {board}")


def test_the_question_panels_answer_the_questions(recorded):
    """Which nodes are stale now and since when; how long resyncs took; which pods failed."""
    url, start, end = recorded
    table = "Nodes whose Node object differs from the kernel, since when"
    (drift,) = [r for r in _instant(url, _target(table, "A"), start, end)
                if r["metric"]["resource"] == "cpu"]
    assert drift["metric"]["node"] == NODE and float(drift["value"][1]) == -1.0
    (since,) = [r for r in _instant(url, _target(table, "C"), start, end)
                if r["metric"]["resource"] == "cpu"]
    # The second offline happened 38 s into the recording (2 s scrapes, rounding).
    assert abs(float(since["value"][1]) / 1000 - (start + 38)) < 6, since
    resyncs = _answer(url, {"panels": []}, "graph",
                      _target("Resync duration p90 (1h window)"), start, end)
    assert {r["metric"]["direction"] for r in resyncs if r["metric"]["resource"] == "cpu"} \
        == {"decrease", "increase"}
    (rejected,) = _instant(url, _target(
        "Pods rejected at readmission, by node and reason (time range)"), start, end)
    assert rejected["metric"]["reason"] == "OutOfcpu" and float(rejected["value"][1]) >= 1
    blocked = _instant(url, _target("Nodes where a kubelet restart would fail"), start, end)
    assert len(blocked) == 1  # 0 on this machine: no kubelet checkpoint here


def test_episode_annotations_mark_every_start_and_end(recorded):
    url, start, end = recorded
    board = json.loads((REPO / "dashboards" / "node-detail.json").read_text())
    exprs = {a["name"]: a["expr"] for a in board["annotations"]["list"] if "expr" in a}

    def marked(name: str) -> list[float]:
        """Start times of the runs of steps the annotation query returns something."""
        result = _answer(url, board, "annotation", exprs[name], start, end)
        times = sorted({float(t) for r in result for t, _ in r["values"]})
        return [t for i, t in enumerate(times) if i == 0 or t - times[i - 1] > STEP]

    starts, ends = marked("Episode starts"), marked("Episode ends")
    # Three cpu episodes: offline at 8 s, online at 26 s, offline at 38 s.
    assert len([t for t in starts if t < start + 45]) >= 3, [t - start for t in starts]
    # Ends: the resync at 16 s, the one at 32 s, the resync_timeout 20 s after 38 s.
    assert len(ends) >= 3, [t - start for t in ends]
