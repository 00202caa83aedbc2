"""`plan` against the real kubelet v1.36's recordings (tests/fixtures/kubelet-v1.36): the Node
and pods as the real API server sent them, served by the test API server over real HTTP, the
kubelet's own CPU manager checkpoint, and a host of two CPUs.

The recorded kubelet rejected both 500m pods OutOfcpu when it restarted with cpu1 offline, and
died first on its static checkpoint naming cpu1: `plan --cpu -1` must say exactly that
beforehand, and exit 1. With only BestEffort pods nothing is rejected: exit 0."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.container_cgroups import construct
from testkit.fakes.apiserver import FakeApiServer
from testkit.kube_replay import recording
from testkit.plan import fake_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet-v1.36"


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "plan", *args],
                          capture_output=True, text=True, timeout=60)


def _publish_until(api: FakeApiServer, rv: int) -> None:
    api.publish_recorded(recording("node-watch-cpu1-unplug-restart.jsonl")[0])
    for event in recording("pods-watch-readmission-outofcpu.jsonl"):
        if event["type"] != "BOOKMARK" and \
                int(event["object"]["metadata"]["resourceVersion"]) <= rv:
            api.publish_recorded(event)


def test_both_recorded_pods_are_named_out_of_cpu_and_the_kubelet_would_not_restart(
        api, tmp_path):
    _publish_until(api, 1121)  # both pods Running, before cpu1 went
    sysfs, procfs = fake_host(tmp_path)
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir()
    shutil.copy(FIXTURES / "cpu_manager_state.static-0-1", kubelet / "cpu_manager_state")
    (kubelet / "config.yaml").write_text("reservedSystemCPUs: \"0\"\n")
    common = ("--kubeconfig", api.write_kubeconfig(str(tmp_path / "kubeconfig")),
              "--node-name", "vm", "--path.sysfs", sysfs, "--path.procfs", procfs,
              "--kubelet-root-dir", str(kubelet), "--cgroup-root", "")
    done = plan("--cpu", "-1", "--output", "json", *common)
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["safe"] is False and answer["verdict"] == "harmful"
    assert answer["cpu"]["take"] == [1]
    assert sorted((p["namespace"], p["name"], p["reason"]) for p in answer["pods"]["rejected"]) \
        == [("default", "sleeper-1", "OutOfcpu"), ("default", "sleeper-2", "OutOfcpu")]
    assert all(p["uid"] for p in answer["pods"]["rejected"])
    assert answer["kubelet"]["restarts"] is False
    assert "names cpu1, which is offline" in answer["kubelet"]["problem"]
    assert answer["capacity_after"]["cpu"] == 1
    assert answer["allocatable_after"]["cpu_millis"] == 0  # as the recorded Node showed after
    # The text for people says the same, with the order of steps.
    text = plan("--cpu", "-1", *common)
    assert text.returncode == 1
    assert "default/sleeper-1: OutOfcpu" in text.stdout
    assert "default/sleeper-2: OutOfcpu" in text.stdout
    assert "would NOT restart" in text.stdout
    steps = text.stdout.split("steps, in this order:")[1]
    assert steps.index("move away the pods") < steps.index("stop the kubelet") \
        < steps.index("echo 0 > /sys/devices/system/cpu/cpu1/online") < steps.index("delete ")


def test_only_best_effort_pods_is_safe(api, tmp_path):
    api.publish_recorded(recording("node-watch-cpu1-unplug-restart.jsonl")[0])
    api.put_pod("be-1", node="vm", requests={}, limits={})
    api.put_pod("be-2", node="vm", requests={}, limits={})
    sysfs, procfs = fake_host(tmp_path)
    (tmp_path / "kubelet/pods").mkdir(parents=True)  # the kubelet's root: no checkpoint
    cgroups = construct(tmp_path / "cg", 2, "cgroupfs", [
        ("besteffort", "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "a" * 64,
         {"cgroup.procs": "", "cpuset.cpus.effective": "0-1\n"})])
    common = ("--kubeconfig", api.write_kubeconfig(str(tmp_path / "kubeconfig")),
              "--node-name", "vm", "--path.sysfs", sysfs, "--path.procfs", procfs)
    done = plan("--cpu", "-1", "--output", "json", *common,
                "--kubelet-root-dir", str(tmp_path / "kubelet"), "--cgroup-root", str(cgroups))
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["safe"] is True and answer["pods"]["rejected"] == []
    assert answer["cpu"]["take"] == [1] and answer["considered"]["kubernetes"] is True
    # Without the kubelet's checkpoints and the running containers: cannot tell, exit 3.
    done = plan("--cpu", "-1", "--output", "json", *common,
                "--kubelet-root-dir", "", "--cgroup-root", "")
    assert done.returncode == 3, done.stdout + done.stderr
    assert json.loads(done.stdout)["verdict"] == "unknown"


def test_an_api_server_that_cannot_be_reached_is_not_called_safe(tmp_path):
    with FakeApiServer() as server:
        kubeconfig = server.write_kubeconfig(str(tmp_path / "kubeconfig"))
    sysfs, procfs = fake_host(tmp_path)  # the server is gone now
    done = plan("--cpu", "-1", "--output", "json", "--kubeconfig", kubeconfig,
                "--node-name", "vm", "--path.sysfs", sysfs, "--path.procfs", procfs,
                "--kubelet-root-dir", "", "--cgroup-root", "")
    assert done.returncode == 3
    answer = json.loads(done.stdout)
    assert answer["verdict"] == "unknown"
    assert [u for u in answer["unknown"] if u.startswith("pods: listing")]


@pytest.mark.parametrize("args, fix", [
    (("--cpu", "1.5"), "a whole number of CPUs with its sign"),
    (("--cpu", "2"), "such as -2 (take two away) or +2"),
    (("--memory", "-1Qi"), "is not a size"),
    ((), "no change given"),
    (("--cpu", "-1", "--output", "yaml"), "'yaml' is not one of"),
    (("--cpu", "-1", "--generation", "xyz"), "the 16 hex digits"),
])
def test_bad_input_exits_2_with_the_fix(tmp_path, args, fix):
    sysfs, procfs = fake_host(tmp_path, blocks={1: ("online", "Movable")})
    done = plan(*args, "--path.sysfs", sysfs, "--path.procfs", procfs, "--kubernetes", "off",
                "--kubelet-root-dir", "", "--cgroup-root", "")
    assert done.returncode == 2, done.stdout + done.stderr
    assert fix in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, most", [
    (("--cpu", "-2"), "take at most 1 (--cpu -1)"),
    (("--cpu", "+1"), "add at most 0"),
    (("--memory", "-64Gi"), "the machine has"),
])
def test_more_than_the_machine_is_a_harmful_answer_not_an_error(tmp_path, args, most):
    """What the machine cannot do is an answer (exit 1, as GET /plan answers 200), not bad
    input: 400 and exit 2 are for malformed questions only."""
    sysfs, procfs = fake_host(tmp_path, blocks={1: ("online", "Movable")})
    done = plan(*args, "--path.sysfs", sysfs, "--path.procfs", procfs, "--kubernetes", "off",
                "--kubelet-root-dir", "", "--cgroup-root", "")
    assert done.returncode == 1, done.stdout + done.stderr
    assert most in done.stdout and "Traceback" not in done.stderr


def test_plan_help_lists_only_plans_options():
    """Issue 38: `plan --help` listed about 40 options, nearly all of them `run`'s."""
    done = subprocess.run([sys.executable, "-m", "exporter", "plan", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for flag in ("--cpu", "--memory", "--output", "--generation", "--kubeconfig",
                 "--node-name", "--kubelet-root-dir", "--cgroup-root", "--path.sysfs"):
        assert flag in done.stdout, flag
    for flag in ("--web.listen-address", "--journal", "--web.config.file", "--source",
                 "--coalesce-window", "--page-flags-blocks"):
        assert flag not in done.stdout, flag
    assert "Exit status: 0 safe, 1 harmful" in done.stdout
