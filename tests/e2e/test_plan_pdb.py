"""Issue 35 item 5, the last gap: the plan says whether a PodDisruptionBudget makes the API
server refuse each eviction its actions ask for, from GET /plan on a running exporter and from
`plan`, against the test API server over real HTTP and this machine's real sysfs (nothing is
hotplugged). While the budgets cannot be listed (403) pdb_blocked is null and `inputs` names
why; once they can, two pods of a budget that allows one disruption: one goes, the other is
refused; a budget that allows none refuses; a pod no budget selects goes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from testkit.exporter_proc import RunningExporter, poll_until
from testkit.fakes.apiserver import FakeApiServer
from testkit.kernel import hotplug_lock

SCHEMA = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())
NODE = "pdb-node"


def online_cpus() -> int:
    count = 0
    for part in Path("/sys/devices/system/cpu/online").read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


# Every CPU but one goes: the Node (2 CPUs, 1 reserved) would offer none, so each pod of 500m
# is rejected at the kubelet's next restart and the actions evict it.
CPU = f"-{online_cpus() - 1}"


def get(url: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


@pytest.fixture(scope="module")
def api():
    with FakeApiServer() as server:
        server.set_node(NODE, cpu="2", allocatable_cpu="1")
        for name, labels in (("web-1", {"app": "web"}), ("web-2", {"app": "web"}),
                             ("db-1", {"app": "db"}), ("free", {})):
            server.put_pod(name, node=NODE, requests={"cpu": "500m"}, limits={},
                           labels=labels)
        server.put_pdb("web", match_labels={"app": "web"}, disruptions_allowed=1,
                       current_healthy=2, desired_healthy=1)
        server.put_pdb("db", match_expressions=[{"key": "app", "operator": "In",
                                                 "values": ["db"]}],
                       disruptions_allowed=0, current_healthy=1, desired_healthy=1)
        server.set_forbidden(True, "poddisruptionbudgets")  # until the test grants it
        yield server


@pytest.fixture(scope="module")
def exporter(api, tmp_path_factory):
    kubeconfig = api.write_kubeconfig(str(tmp_path_factory.mktemp("pdb") / "kubeconfig"))
    with RunningExporter("--source", "sysfs", "--kubeconfig", kubeconfig,
                         "--node-name", NODE, "--podresources-socket", "",
                         "--kubelet-root-dir", "", "--cgroup-root", "") as exp:
        exp.wait_for(lambda s: s.value("node_resize_readmission_forecast_pods") == 4)
        exp.kubeconfig = kubeconfig
        yield exp


def http_plan(exporter) -> dict:
    status, answer = poll_until(lambda: get(exporter.url + f"/plan?cpu={CPU}"),
                                lambda got: got[0] != 429, 30, 0.5,
                                lambda got: AssertionError(f"{got}"))
    assert status == 200, answer
    jsonschema.Draft202012Validator(SCHEMA).validate(answer)
    return answer


def cli_plan(exporter) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "exporter", "plan", "--cpu", CPU,
                           "--output", "json", "--kubeconfig", exporter.kubeconfig,
                           "--node-name", NODE, "--kubelet-root-dir", "", "--cgroup-root", ""],
                          capture_output=True, text=True, timeout=120)
    answer = json.loads(done.stdout)
    jsonschema.Draft202012Validator(SCHEMA).validate(answer)
    return done.returncode, answer


def blocked(answer: dict) -> dict[str, bool | None]:
    return {p["name"]: p["pdb_blocked"] for p in answer["pods"]["rejected"]}


def evicted(answer: dict) -> list[dict]:
    return [p for a in answer["actions"] if a["do"] == "evict" for p in a["pods"]]


def test_forbidden_budgets_leave_pdb_blocked_null_and_say_why_then_are_judged(api, exporter):
    # 403: the plan still answers (harmful: the pods rejected), every pdb_blocked null
    with hotplug_lock():
        http = http_plan(exporter)
        code, cli = cli_plan(exporter)
    for answer in (http, cli):
        assert answer["verdict"] == "harmful"
        assert blocked(answer) == dict.fromkeys(("web-1", "web-2", "db-1", "free"))
        why = answer["inputs"]["pod_disruption_budgets"]
        assert "forbidden" in why.lower() and "poddisruptionbudgets" in why, why
        assert any(u.startswith("pod disruption budgets: ") for u in answer["unknown"])
        assert {p["pdb_blocked"] for p in evicted(answer)} == {None}
    assert code == 1  # harmful, not "cannot tell": the unread budgets change no verdict

    # granted: the watch recovers by itself, the budgets are judged
    api.set_forbidden(False, "poddisruptionbudgets")
    exporter.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                        source="kube_pdbs") == 1, timeout=90)
    with hotplug_lock():
        http = http_plan(exporter)
        code, cli = cli_plan(exporter)
    assert code == 1
    for answer in (http, cli):
        assert answer["inputs"]["pod_disruption_budgets"] == "read"
        got = blocked(answer)
        assert got["db-1"] is True and got["free"] is False
        # one disruption allowed: the first web pod in the evict order goes, the second not
        web = [p for p in evicted(answer) if p["name"].startswith("web-")]
        assert [p["pdb_blocked"] for p in web] == [False, True]
        assert {p["pdb"] for p in web} == {"default/web"}
        assert any("evictions the API server would refuse" in h for h in answer["harm"])
        assert answer["verdict"] == "harmful"
    assert blocked(http) == blocked(cli) and evicted(http) == evicted(cli)
