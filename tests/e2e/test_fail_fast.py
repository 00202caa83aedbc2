"""What the user asked for explicitly must work at start-up, or `run` exits 2 with the fix.
Defaults keep degrading gracefully (a journal at the default path, --kubernetes auto)."""
from __future__ import annotations

import os
import subprocess
import sys

from testkit.exporter_proc import REPO, free_port


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "run", "--source", "sysfs",
                           "--web.listen-address", f"127.0.0.1:{free_port()}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_a_named_kubeconfig_that_does_not_exist(tmp_path):
    r = run("--kubeconfig", str(tmp_path / "nope.yaml"), "--no-journal")
    assert r.returncode == 2, r.stderr
    assert "nope.yaml" in r.stderr and "Fix:" in r.stderr


def test_a_kubeconfig_without_contexts_names_the_missing_section(tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\nusers: []\n")
    r = run("--kubeconfig", str(config), "--no-journal")
    assert r.returncode == 2, r.stderr
    assert "no 'contexts' section" in r.stderr and "current-context" in r.stderr
    assert "Traceback" not in r.stderr


def test_kubernetes_on_without_a_reachable_api(tmp_path):
    port = free_port()
    config = tmp_path / "kubeconfig"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    r = run("--kubernetes", "on", "--kubeconfig", str(config), "--node-name", "n1",
            "--no-journal")
    assert r.returncode == 2, r.stderr
    assert "--kubernetes on" in r.stderr and "unreachable" in r.stderr
    assert "--kubernetes auto" in r.stderr  # the fix


def test_kubernetes_on_with_the_api_answering_starts(tmp_path):
    from testkit.exporter_proc import RunningExporter
    from testkit.fakes.apiserver import FakeApiServer
    with FakeApiServer() as api:
        api.set_node("n1", cpu="2", memory="8Gi")
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with RunningExporter("--source", "sysfs", "--no-journal", "--kubernetes", "on",
                             "--kubeconfig", kubeconfig, "--node-name", "n1",
                             "--podresources-socket", "") as exporter:
            exporter.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                                unit="core") == 2.0)


def test_an_unwritable_named_journal(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = run("--journal", str(blocker / "journal.db"))  # a directory that is a file
    assert r.returncode == 2, r.stderr
    assert "--journal" in r.stderr and "--no-journal" in r.stderr


def test_a_kubeconfig_that_is_a_fifo_or_a_device_exits_2(tmp_path):
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        r = run("--kubeconfig", path, "--no-journal")  # a FIFO hung in the YAML reader
        assert r.returncode == 2, r.stderr
        assert "not a regular file" in r.stderr and "Traceback" not in r.stderr
