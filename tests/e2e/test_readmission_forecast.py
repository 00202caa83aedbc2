"""The readmission forecast end to end: which pods a kubelet restart now would reject, shown on
/metrics and by `check` before the restart happens.

1. The real kubelet v1.36 sequence (tests/fixtures/kubelet-v1.36, its README): replayed event by
   event through the list/watch test server into the exporter's real watch sources and
   correlator (testkit/kube_replay.py), the forecast's gauges rendered by its Collector. After
   cpu1 goes offline, and before the restart, they must name exactly the two pods the real
   kubelet then rejected, OutOfcpu; after the restart nothing is left to reject.
2. A running exporter (`node-resize-exporter run`) with the test API server and this machine's
   real kernel (sysfs): the Node as big as the kernel, two pods that do not fit together.
3. The `check` line against the same server, over real HTTP.
"""
from __future__ import annotations

import threading

import pytest

from exporter.config.options import Options
from exporter.events import Direction
from exporter.sinks.forecast_collector import ForecastCollector
from testkit.exporter_proc import RunningExporter, poll_until
from testkit.fakes.apiserver import FakeApiServer
from testkit.kube_replay import Replay, at, recording


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def _forecast(s) -> dict[tuple[str, str], float]:
    return {(dict(labels)["pod"], dict(labels)["reason"]): v
            for labels, v in s.series("node_resize_readmission_forecast_rejected").items()}


def test_forecast_before_the_recorded_restart_names_the_pods_it_rejected(api):
    node = recording("node-watch-cpu1-unplug-restart.jsonl")
    pods = recording("pods-watch-readmission-outofcpu.jsonl")
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in pods]
    with Replay(api, settle=10) as r:
        # Replay.scrape() renders under its own lock already: the Collector gets its own.
        r.registry.register(ForecastCollector(threading.Lock(), r.stream.correlator.forecast))
        r.kernel(at("08:30:00"), cpus=2)
        r.publish(node[0], at("08:30:00"))
        for event in pods[: rvs.index(1121) + 1]:  # both pods scheduled, started, Ready
            r.publish(event)
        s = r.scrape()
        assert _forecast(s) == {}
        assert s.value("node_resize_readmission_forecast_pods") == 2
        assert s.value("node_resize_readmission_forecast_rejected_pods", resource="cpu",
                       reason="OutOfcpu") == 0

        r.kernel(at("08:31:00"), cpus=1, direction=Direction.OFFLINE)
        r.tick(at("08:31:03"))
        s = r.scrape()
        assert _forecast(s) == {("sleeper-1", "OutOfcpu"): 1, ("sleeper-2", "OutOfcpu"): 1}
        assert s.value("node_resize_readmission_forecast_rejected_pods", resource="cpu",
                       reason="OutOfcpu") == 2
        assert s.value("node_resize_readmission_forecast_rejected_unlisted_pods") == 0
        # Only the reasons this node can give are shown (no hugepages, no static policy seen).
        assert {dict(k)["reason"] for k in
                s.series("node_resize_readmission_forecast_rejected_pods")} == \
            {"OutOfpods", "OutOfcpu", "OutOfmemory"}

        # The restart happens as recorded: what the forecast said, the kubelet did.
        r.set_clock(at("08:31:30"))
        for event in pods[rvs.index(1121) + 1 : rvs.index(1148) + 1]:
            r.publish(event)
        r.publish(node[3], at("08:31:32"))
        r.set_clock(at("08:31:33"))
        for event in pods[rvs.index(1148) + 1 :]:
            r.publish(event)
        r.tick(at("08:31:42"))
        s = r.scrape()
        assert s.value("node_resize_readmission_pods_total", outcome="rejected",
                       reason="OutOfcpu") == 2
        assert _forecast(s) == {}  # both Failed: nothing left for a restart to reject
        assert s.value("node_resize_readmission_forecast_pods") == 0
        [ended] = [u.episode for u in r.stream.updates if u.kind.value == "ended"]
        assert sorted((p.name, p.reason) for p in ended.forecast.rejected) == \
            sorted((p.name, p.reason) for p in ended.pods if p.outcome.value == "rejected")


def _online_cpus() -> int:
    with open("/sys/devices/system/cpu/online") as f:
        total = 0
        for part in f.read().strip().split(","):
            lo, _, hi = part.partition("-")
            total += int(hi or lo) - int(lo) + 1
        return total


def test_running_exporter_forecasts_from_the_real_kernel(api, tmp_path):
    """The Node as big as this machine's online CPUs, 500m reserved; an older pod of 1 CPU
    and a younger one as big as the machine: the younger would be rejected OutOfcpu, the
    older readmitted; a third, finished pod counts for nothing."""
    cpus = _online_cpus()
    api.set_node("fc-node", cpu=str(cpus), allocatable_cpu=f"{cpus * 1000 - 500}m")
    api.put_pod("a-older", node="fc-node", requests={"cpu": "1", "memory": "64Mi"})
    api.put_pod("b-younger", node="fc-node", requests={"cpu": str(cpus), "memory": "64Mi"})
    api.put_pod("c-finished", node="fc-node", requests={"cpu": str(cpus)}, phase="Succeeded",
                ready=False)
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                         "--node-name", "fc-node", "--podresources-socket", "",
                         "--kubelet-root-dir", "") as exp:
        s = exp.wait_for(lambda s: s.value("node_resize_readmission_forecast_pods") == 2,
                         timeout=30)
        assert _forecast(s) == {("b-younger", "OutOfcpu"): 1}
        assert s.value("node_resize_readmission_forecast_rejected_pods", resource="cpu",
                       reason="OutOfcpu") == 1
        # The younger pod goes away: nothing would be rejected any more.
        api.delete_pod("b-younger")
        s = exp.wait_for(lambda s: s.value("node_resize_readmission_forecast_pods") == 1,
                         timeout=30)
        assert _forecast(s) == {}


def test_check_line_lists_the_pods_over_real_http(api, tmp_path):
    from exporter.sinks.forecast_collector import check_readmission_forecast

    cpus = _online_cpus()
    api.set_node("fc-node", cpu=str(cpus), allocatable_cpu=f"{cpus * 1000 - 500}m")
    api.put_pod("a-older", node="fc-node", requests={"cpu": "1"})
    api.put_pod("b-younger", node="fc-node", requests={"cpu": str(cpus)})
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    options = Options().replace(kubeconfig=kubeconfig, node_name="fc-node", kubelet_root_dir="")
    check = check_readmission_forecast(options)
    assert (check.status, check.detail) == (
        "fail", "a kubelet restart now would reject 1 of 2 pods: default/b-younger (OutOfcpu)")
    assert check.fix.startswith("drain these")
    missing = check_readmission_forecast(options.replace(node_name="no-such-node"))
    assert missing.status == "warn" and "no Node named no-such-node" in missing.detail


def _valid(s) -> dict[str, float]:
    return {dict(labels)["reason"]: v
            for labels, v in s.series("node_resize_readmission_forecast_valid").items()}


def _forecast_series(s) -> dict:
    return {name: s.series(name) for name in (
        "node_resize_readmission_forecast_pods", "node_resize_readmission_forecast_rejected",
        "node_resize_readmission_forecast_rejected_pods",
        "node_resize_readmission_forecast_rejected_unlisted_pods")
        if s.series(name)}


def test_a_forecast_that_cannot_see_the_pods_says_so_and_shows_no_zero(api, tmp_path):
    """Pods forbidden by RBAC (the Node readable): source_up{kube_pods} 0, and the forecast's
    series absent with node_resize_readmission_forecast_valid{reason="pods_forbidden"} 0,
    not `pods 0, rejected 0`. Allowed again: the forecast comes back, valid 1."""
    cpus = _online_cpus()
    api.set_node("fc-node", cpu=str(cpus), allocatable_cpu=f"{cpus * 1000 - 500}m")
    api.put_pod("a-older", node="fc-node", requests={"cpu": "1"})
    api.put_pod("b-younger", node="fc-node", requests={"cpu": str(cpus)})
    api.set_forbidden(True, "pods")
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                         "--node-name", "fc-node", "--podresources-socket", "",
                         "--kubelet-root-dir", "") as exp:
        s = exp.wait_for(lambda s: _valid(s) == {"pods_forbidden": 0}, timeout=60)
        assert s.value("node_resize_exporter_source_up", source="kube_pods") == 0
        assert _forecast_series(s) == {}
        # The plan on the same forecast: the pods unjudged (never "safe"), the gauge absent.
        plan = _plan(exp, "memory=-128Mi")
        assert plan["safe"] is False and any("forbidden" in u for u in plan["unknown"]), plan
        assert not s.series("node_resize_unpluggable")
        api.set_forbidden(False, "pods")
        s = exp.wait_for(lambda s: _valid(s) == {"ok": 1}, timeout=90)
        s = exp.wait_for(lambda s: s.value("node_resize_readmission_forecast_pods") == 2,
                         timeout=30)
        assert _forecast(s) == {("b-younger", "OutOfcpu"): 1}
        unknown = _plan(exp, "memory=-128Mi")["unknown"]
        assert not any(u.startswith("pods") for u in unknown), unknown  # the pods judged
        # Worked out by the plan sink's thread once its inputs changed; a scrape reads it.
        exp.wait_for(lambda s: s.series("node_resize_unpluggable"), timeout=10)


def test_a_forecast_past_the_pod_list_bound_says_so(api, tmp_path):
    """More pods bound to the node than the exporter lists (10,000): the list is refused, the
    forecast absent with reason pods_truncated; `check` says it cannot forecast."""
    from exporter.sinks.forecast_collector import check_readmission_forecast
    from exporter.sources.apiserver.listwatch import LIST_MAX_OBJECTS

    cpus = _online_cpus()
    api.set_node("fc-node", cpu=str(cpus), allocatable_cpu=f"{cpus * 1000 - 500}m")
    for i in range(LIST_MAX_OBJECTS + 1):
        api.put_pod(f"p-{i}", node="fc-node", requests={"cpu": "1m"})
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                         "--node-name", "fc-node", "--podresources-socket", "",
                         "--kubelet-root-dir", "") as exp:
        s = exp.wait_for(lambda s: _valid(s) == {"pods_truncated": 0}, timeout=120)
        assert _forecast_series(s) == {}
    options = Options().replace(kubeconfig=kubeconfig, node_name="fc-node", kubelet_root_dir="")
    check = check_readmission_forecast(options)
    assert check.status == "warn" and check.detail.startswith("cannot forecast: "), check
    assert "pods" in check.detail and check.fix


def test_check_says_it_cannot_forecast_when_pods_are_forbidden(api, tmp_path):
    from exporter.sinks.forecast_collector import check_readmission_forecast

    api.set_node("fc-node", cpu="2")
    api.set_forbidden(True, "pods")
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    options = Options().replace(kubeconfig=kubeconfig, node_name="fc-node", kubelet_root_dir="")
    check = check_readmission_forecast(options)
    assert check.status == "warn" and check.detail.startswith("cannot forecast: "), check
    assert "forbidden" in check.detail and "list" in check.fix


def _plan(exp, query: str) -> dict:
    """GET /plan?<query> on the running exporter (2 a second at most: a 429 is asked again)."""
    import json
    import urllib.error
    import urllib.request

    def ask():
        try:
            with urllib.request.urlopen(f"{exp.url}/plan?{query}", timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 429:
                raise
            return None
    return poll_until(ask, lambda got: got is not None, 30, 0.5,
                      lambda got: AssertionError("GET /plan: 429 for 30 s"))
