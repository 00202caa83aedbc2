"""The Kubernetes side an operator touches: `check` tells whether the exporter can join the
Node's view (config, RBAC by SelfSubjectAccessReview, the podresources socket, the kubelet's
metrics), and `--kube-events` tells the episode's story on the Node itself."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from exporter.correlate.model import Episode, EpisodeUpdate, Outcome, UpdateKind
from exporter.events import Change, Resource
from exporter.sinks.kube_events import KubeEventsSink, describe, event_object
from testkit.exporter_proc import REPO, RunningExporter, poll_until
from testkit.fakes.apiserver import serving_node

NODE = "ops-node"


def check_run(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "exporter", "check", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def check(*args: str) -> str:
    return check_run(*args).stdout


@pytest.fixture
def api(tmp_path):
    with serving_node(str(tmp_path), NODE) as server:
        yield server


def test_check_reports_config_and_rbac_from_self_subject_access_reviews(api):
    out = check("--kubeconfig", api.kubeconfig, "--node-name", NODE,
                "--podresources-socket", "")
    assert f"OK   kubernetes config: server {api.url}" in out
    assert ("OK   kubernetes RBAC: list and watch on nodes, pods, leases in kube-node-lease, "
            "poddisruptionbudgets and events in default allowed" in out)
    reviews = [p for p, q in api.requests if p.endswith("selfsubjectaccessreviews")]
    assert len(reviews) == 10

    api.denied.add(("watch", "pods"))
    out = check("--kubeconfig", api.kubeconfig, "--node-name", NODE,
                "--podresources-socket", "")
    assert "FAIL kubernetes RBAC: denied: watch pods" in out
    assert "deploy/clusterrole.yaml" in out


def test_check_reports_a_missing_kubeconfig_with_the_fix(tmp_path):
    r = check_run("--kubeconfig", str(tmp_path / "none"))
    assert "FAIL kubernetes config: cannot use kubeconfig" in r.stdout and "fix:" in r.stdout
    assert r.returncode == 1, "a FAIL line and exit 0 would let a preflight script go on"


def test_check_fails_a_node_name_the_api_server_does_not_know_and_names_its_nodes(api):
    r = check_run("--kubeconfig", api.kubeconfig, "--node-name", NODE,
                  "--podresources-socket", "")
    assert f"OK   kubernetes node: Node {NODE} found" in r.stdout
    api.set_node("worker-7", cpu="4", memory="16Gi")
    r = check_run("--kubeconfig", api.kubeconfig, "--node-name", "not-a-node",
                  "--podresources-socket", "")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("FAIL kubernetes node"))
    assert "'not-a-node'" in line and NODE in line and "worker-7" in line, r.stdout
    assert "--node-name" in r.stdout and r.returncode == 1


def test_check_podresources_socket_listening_or_not(api, tmp_path):
    path = str(tmp_path / "kubelet.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        out = check("--kubeconfig", api.kubeconfig, "--podresources-socket", path)
        assert f"OK   podresources socket: {path} accepts connections" in out
    not_socket = tmp_path / "plain"
    not_socket.write_text("")
    out = check("--kubeconfig", api.kubeconfig, "--podresources-socket", str(not_socket))
    assert "FAIL podresources socket" in out and "not a unix socket" in out


def _episode(outcome: Outcome | None = None, **kw) -> Episode:
    ep = Episode(id="cpu-dec-1", resource=Resource.CPU, change=Change.DECREASE, opened=100.0,
                 kernel_done=100.02, kernel_before=2, kernel_after=1, kubelet_before=2, **kw)
    ep.outcome = outcome
    return ep


def test_messages_read_like_the_story():
    start = describe(EpisodeUpdate(UpdateKind.KERNEL_DONE, _episode(), 100.02))
    assert start == ("Normal", "CPUHotUnplug",
                     "cpu hot-unplug: kernel has 1 core, kubelet still reports 2 cores")
    end = describe(EpisodeUpdate(UpdateKind.ENDED, _episode(Outcome.RESYNC_TIMEOUT,
                                                            ended=700.0), 700.0))
    assert end == ("Warning", "ResizeNotResynced",
                   "cpu hot-unplug: kubelet still reports 2 cores, kernel has 1 core (600 s)")
    assert describe(EpisodeUpdate(UpdateKind.POD, _episode(), 101)) is None
    obj = event_object(NODE, *start, now=0)
    assert obj["involvedObject"] == {"kind": "Node", "name": NODE, "uid": NODE,
                                     "apiVersion": "v1"}


def test_a_slow_api_never_holds_the_agent():
    release = threading.Event()

    class Api:  # an API server that does not answer until the test says so
        def create(self, obj: dict) -> dict:
            release.wait()
            return obj

        def patch(self, name: str, patch: dict) -> dict:
            release.wait()
            return patch

    sink = KubeEventsSink(NODE, Api())

    def agent() -> None:
        for _ in range(200):  # far more than the queue holds
            sink.on_update(EpisodeUpdate(UpdateKind.KERNEL_DONE, _episode(), 1.0))

    caller = threading.Thread(target=agent)
    caller.start()
    caller.join(30)  # returns at once unless on_update waits for the API server
    held = caller.is_alive()
    release.set()
    caller.join()
    assert not held, "on_update waited for a POST that had not been answered"
    assert sink.errors > 0  # the overflow is counted, not waited for
    sink.close()


@pytest.mark.kernel
def test_episode_start_and_end_become_events_on_the_node(cpu1, api):
    with RunningExporter("--kubeconfig", api.kubeconfig, "--node-name", NODE, "--kube-events",
                         "--podresources-socket", "", "--resync-deadline", "2",
                         "--source", "uevent,sysfs") as exp:
        exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                       unit="core") == 2)
        cpu1.set_online(False)
        events = poll_until(lambda: list(api.events), lambda ev: len(ev) >= 2, 15, 0.1,
                            lambda ev: AssertionError(f"events: {ev}\n{exp.logs_tail()}"))
    start, end = events[0], events[1]
    assert start["involvedObject"]["name"] == NODE and start["type"] == "Normal"
    assert start["reason"] == "CPUHotUnplug"
    assert start["message"].startswith("cpu hot-unplug: kernel has 1 core, kubelet still "
                                       "reports 2 cores")
    assert end["type"] == "Warning" and end["reason"] == "ResizeNotResynced"
    assert "kubelet still reports 2 cores, kernel has 1 core" in end["message"]


def test_the_kube_events_component_grants_create_and_patch_on_events_and_adds_the_flag():
    import kubernetes_validate
    import yaml

    from exporter.config.options import KUBE_EVENTS

    base = REPO / "deploy" / "components" / "kube-events"
    component = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    role = yaml.safe_load((base / "role.yaml").read_text())
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "default")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"],
                             "verbs": ["create", "patch"]}]
    binding = yaml.safe_load((base / "rolebinding.yaml").read_text())
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for doc in (role, binding):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    patch = yaml.safe_load(component["patches"][0]["patch"])
    assert patch == [{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
                      "value": "--kube-events"}]
    assert "--kube-events" in KUBE_EVENTS.flags


def test_the_base_mounts_kubelet_root_and_cgroups_read_only_and_the_component_shares_pids():
    import kubernetes_validate
    import yaml

    from testkit.deploy import container_of, load_manifest

    base = REPO / "deploy" / "components" / "kubelet-state"
    component = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    patch = yaml.safe_load(component["patches"][0]["patch"])
    base_ds = load_manifest("daemonset.yaml")
    assert not base_ds["spec"]["template"]["spec"].get("hostPID")
    ds = _json_patch(base_ds, patch)
    kubernetes_validate.validate(ds, kubernetes_validate.latest_version(), strict=True)
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    # What the plan needs is in the base (issue 35 item 2), read-only.
    mounts = {m["mountPath"]: m for m in container_of(load_manifest("daemonset.yaml"))[
        "volumeMounts"]}
    assert mounts["/var/lib/kubelet"]["readOnly"] is True
    assert mounts["/sys/fs/cgroup"]["readOnly"] is True  # the host's, for the running pods
    # The exporter's defaults read the checkpoints and the cgroups exactly there.
    from exporter.sources.kubelet.kubelet_checkpoint import KUBELET_ROOT_DIR
    from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT

    assert KUBELET_ROOT_DIR.default == "/var/lib/kubelet"
    assert CGROUP_ROOT.default == "/sys/fs/cgroup"


def _json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 add/replace, with "-" (append), which is all the components use."""
    for op in ops:
        *parents, leaf = op["path"].strip("/").split("/")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            if leaf == "-":
                node.append(op["value"])
            else:
                node[int(leaf)] = op["value"]
        else:
            assert op["op"] == "add" or leaf in node, op["path"]
            node[leaf] = op["value"]
    return doc
