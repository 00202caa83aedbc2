"""GET /plan on a running exporter, over real HTTP: the same JSON as `plan --output json`,
bad queries 400 with the fix, a flood 429, and with --web.auth=kubernetes a SubjectAccessReview
on /plan (a token granted /metrics only is refused). The exporter runs against this machine's
real sysfs and the test API server; nothing is hotplugged (the kernel's CPUs and memory blocks
are the same before and after)."""
from __future__ import annotations

import concurrent.futures
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from testkit.exporter_proc import RunningExporter, poll_until
from testkit.fakes.apiserver import FakeApiServer
from testkit.kernel import hotplug_lock
from testkit.kubeauth import PROMETHEUS, KubeAuthExporter, bearer_get


def state() -> tuple[str, list[str]]:
    cpus = Path("/sys/devices/system/cpu/online").read_text()
    blocks = sorted(p.name for p in Path("/sys/devices/system/memory").glob("memory*")
                    if (p / "state").read_text().strip() != "online")
    return cpus, blocks


def get(url: str) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body), dict(e.headers)
        except ValueError:
            return e.code, {"text": body.decode()}, dict(e.headers)


@pytest.fixture(scope="module")
def api():
    with FakeApiServer() as server:
        server.set_node("plan-node", cpu="2", allocatable_cpu="1")
        server.put_pod("half-1", node="plan-node", requests={"cpu": "500m"}, limits={})
        server.put_pod("half-2", node="plan-node", requests={"cpu": "500m"}, limits={})
        yield server


@pytest.fixture(scope="module")
def exporter(api, tmp_path_factory):
    kubeconfig = api.write_kubeconfig(str(tmp_path_factory.mktemp("plan") / "kubeconfig"))
    with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                         "--node-name", "plan-node", "--podresources-socket", "",
                         "--kubelet-root-dir", "", "--cgroup-root", "") as exp:
        # the pods and the PodDisruptionBudgets (none) listed: what both answers read
        exp.wait_for(lambda s: s.value("node_resize_readmission_forecast_pods") == 2
                     and s.value("node_resize_exporter_source_up", source="kube_pdbs") == 1)
        yield exp


def test_a_plan_over_http_names_the_pods_it_would_cost(exporter):
    with hotplug_lock():  # no other test's hotplug meanwhile: the kernel stays as it is
        _plan_cpu(exporter)


def _plan_cpu(exporter) -> None:
    before = state()
    online = len(before[0].strip().replace("-", ",").split(","))
    status, answer, headers = poll_until(
        lambda: get(exporter.url + "/plan?cpu=-1"), lambda got: got[0] != 429, 30, 0.5,
        lambda got: AssertionError(f"{got}"))
    assert status == 200, answer
    assert headers["Content-Type"] == "application/json"
    if online == 2:  # this machine: cpu1 goes, the Node would offer 0 CPUs
        assert answer["cpu"]["take"] == [1]
        assert sorted(p["name"] for p in answer["pods"]["rejected"]) == ["half-1", "half-2"]
        assert {p["reason"] for p in answer["pods"]["rejected"]} == {"OutOfcpu"}
        assert answer["safe"] is False and answer["verdict"] == "harmful"
    assert answer["node"] == "plan-node" and len(answer["generation"]) == 16
    schema = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(answer)
    assert state() == before  # read-only


def test_memory_plan_and_the_unpluggable_gauges(exporter):
    status, answer, _ = poll_until(
        lambda: get(exporter.url + "/plan?memory=-128Mi"), lambda got: got[0] != 429, 30, 0.5,
        lambda got: AssertionError(f"{got}"))
    assert status == 200
    assert answer["memory"]["blocks_needed"] == 1
    if os.geteuid() == 0:
        # The exporter dropped CAP_SYS_ADMIN after start; /proc/iomem opened now would show
        # every address as 0 and hide every virtio-mem device: it reads the file it opened
        # before the drop.
        assert answer["inputs"]["memory_devices"] == "read", answer["inputs"]
    assert answer["memory"]["bytes"] in (0, 128 * 2**20)
    with hotplug_lock():  # the blocks stay as they are; the gauge catches up within 10 s
        online = sum(1 for p in Path("/sys/devices/system/memory").glob("memory*")
                     if (p / "state").read_text().strip() == "online")
        # Memory by zone is read at the scrape (MemoryZonesCollector); the unpluggable gauges
        # are worked out by the plan sink's thread after its inputs arrive: wait for both.
        s = exporter.wait_for(lambda s: sum(
            s.series("node_resize_memory_blocks_by_zone").values()) == online
            and s.value("node_resize_unpluggable", resource="cpu", unit="core") is not None)
    assert s.value("node_resize_unpluggable", resource="cpu", unit="core") is not None
    assert s.value("node_resize_unpluggable", resource="memory", unit="byte") is not None


@pytest.mark.parametrize("query, fix", [
    ("cpu=-1&cpu=-2", "given twice"),
    ("cpu=-1&gpu=1", "unknown query key"),
    ("cpu=1.5", "no fractions"),
    ("memory=-1Qi", "not a size"),
    ("", "no change given"),
])
def test_bad_queries_are_400_with_the_fix(exporter, query, fix):
    status, answer, _ = poll_until(
        lambda: get(exporter.url + "/plan?" + query), lambda got: got[0] != 429, 30, 0.5,
        lambda got: AssertionError(f"{got}"))
    assert status == 400
    assert fix in answer["error"] and answer["fix"]


def test_more_than_the_machine_has_is_an_answer_not_a_400(exporter):
    with hotplug_lock():  # cpu1 online: another test's offline would make it "none can go"
        status, answer, _ = poll_until(
            lambda: get(exporter.url + "/plan?cpu=-64"), lambda got: got[0] != 429, 30, 0.5,
            lambda got: AssertionError(f"{got}"))
    assert status == 200 and answer["verdict"] == "harmful"
    assert "take at most" in answer["harm"][0]


def test_malformed_questions_are_not_charged_to_the_plan_budget(exporter):
    """400 only for a malformed question, answered before the plan budget is charged: a
    burst of them leaves a well-formed question answered at once."""
    for _ in range(20):
        assert get(exporter.url + "/plan?cpu=1.5")[0] == 400
    assert get(exporter.url + "/plan?memory=-128Mi")[0] == 200


def test_the_cli_and_get_plan_give_one_answer(exporter, api, tmp_path):
    """Issue 35 item 3: the same question on the same node, asked of `plan` and of GET /plan
    seconds apart, gets the same answer (it was "safe" from one, "cannot" from the other)."""
    import subprocess
    import sys
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    for question, flags in (("memory=-1Gi", ("--memory", "-1Gi")),
                            ("cpu=-1", ("--cpu", "-1"))):
        with hotplug_lock():  # the kernel stays as it is between the two asks
            status, http, _ = poll_until(
                lambda: get(exporter.url + "/plan?" + question), lambda got: got[0] != 429,
                30, 0.5, lambda got: AssertionError(f"{got}"))
            done = subprocess.run([sys.executable, "-m", "exporter", "plan", *flags,
                                   "--output", "json", "--kubeconfig", kubeconfig,
                                   "--node-name", "plan-node", "--kubelet-root-dir", "",
                                   "--cgroup-root", ""], capture_output=True, text=True,
                                  timeout=120)
        cli = json.loads(done.stdout)
        assert status == 200 and done.returncode == {"safe": 0, "harmful": 1,
                                                     "unknown": 3}[cli["verdict"]]
        for key in ("verdict", "harm", "cpu", "memory", "capacity_after", "allocatable_after",
                    "pods", "refusals", "kubelet", "actions", "generation", "node"):
            assert http[key] == cli[key], (key, http[key], cli[key])
        assert {k for k, v in http["inputs"].items() if v == "read"} == \
            {k for k, v in cli["inputs"].items() if v == "read"}


def test_a_flood_of_plans_gets_429_and_the_exporter_carries_on(exporter):
    def one(_):
        return get(exporter.url + "/plan?memory=-128Mi")[0]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(one, range(200)))
    assert statuses.count(429) > 100 and set(statuses) <= {200, 429}
    assert exporter.scrape().value("node_resize_readmission_forecast_pods") == 2
    assert exporter.proc.poll() is None


def test_with_kubernetes_auth_plan_needs_its_own_grant(api, tmp_path):
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    api.add_token("metrics-only", PROMETHEUS)
    api.add_token("planner", "system:serviceaccount:kubevirt:planner")
    api.allow_path(f"user:{PROMETHEUS}")  # /metrics
    api.allow_path("user:system:serviceaccount:kubevirt:planner", "/plan")
    with KubeAuthExporter(kubeconfig) as exp:
        def answered(token, path):
            return poll_until(lambda: bearer_get(exp.port, path, token=token),
                              lambda got: isinstance(got, tuple) and got[0] not in (503, 429),
                              30, 0.3, lambda got: AssertionError(f"{got}"))
        assert answered("metrics-only", "/metrics")[0] == 200
        # A memory plan: valid whatever other tests do to cpu1 meanwhile.
        assert answered("metrics-only", "/plan?memory=-128Mi")[0] == 403
        status, _, body = answered("planner", "/plan?memory=-128Mi")
        assert status == 200 and "pods" in json.loads(body)
        assert answered(None, "/plan?memory=-128Mi")[0] == 401
