"""`check` has no false OK: for each option `run` refuses at start (exit 2), `check` with the
same options FAILs (exit 1) with the same reason, because both ask the same function. And what
`run` accepts, `check` does not fail on."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from testkit.exporter_proc import REPO, RunningExporter, free_port
from testkit.fakes.apiserver import serving_node

NODE = "pair-node"
# No cluster around: $KUBERNETES_SERVICE_HOST would turn --kubernetes auto on.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}


def exporter(command: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", command, "--source", "sysfs",
                           "--no-journal", "--kubelet-root-dir", "", "--cgroup-root", "", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)


def fail_lines(out: str) -> list[str]:
    """The FAIL lines, each with its fix."""
    lines = out.splitlines()
    return [line + (lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("     fix:")
                    else "") for i, line in enumerate(lines) if line.startswith("FAIL ")]


def assert_pair(args: list[str], words: list[str]) -> None:
    ran = exporter("run", *args)
    assert ran.returncode == 2, ran.stderr
    checked = exporter("check", *args)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr, checked.stderr
    failing = "\n".join(fail_lines(checked.stdout))
    for word in words:
        assert word in ran.stderr, ran.stderr
        assert word in failing, checked.stdout


def listen(*args: str) -> list[str]:
    return ["--web.listen-address", f"127.0.0.1:{free_port()}", *args]


def test_a_web_config_file_that_does_not_exist(tmp_path):
    assert_pair(listen("--web.config.file", str(tmp_path / "nonexistent.yml")),
                ["--web.config.file", "nonexistent.yml", "cannot read it"])


def test_a_web_config_with_a_password_that_is_not_a_bcrypt_hash(tmp_path):
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  prometheus: plaintext-secret\n")
    ran_words = ["basic_auth_users.prometheus"]
    assert_pair(listen("--web.config.file", str(config)), ran_words)
    assert "plaintext-secret" not in exporter("check", *listen("--web.config.file",
                                                                str(config))).stdout


def test_web_auth_kubernetes_without_an_api(tmp_path):
    assert_pair(listen("--web.auth", "kubernetes", "--kubernetes", "off"),
                ["--web.auth=kubernetes"])


def test_a_listen_address_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert_pair(["--web.listen-address", f"127.0.0.1:{port}"],
                    ["--web.listen-address", "already in use"])


def test_a_listen_address_held_by_a_running_exporter_is_a_warning_in_check():
    """`kubectl exec ... node-resize-exporter check` runs beside the exporter it diagnoses."""
    with RunningExporter("--source", "sysfs", "--node-name", "n1") as running:
        checked = exporter("check", "--web.listen-address", f"127.0.0.1:{running.port}")
    assert "WARN web: 127.0.0.1:" in checked.stdout and "already running" in checked.stdout
    assert checked.returncode == 0, checked.stdout


@pytest.fixture
def api(tmp_path):
    with serving_node(str(tmp_path), NODE) as server:
        yield server


def kube(api, *args: str) -> list[str]:
    return listen("--kubeconfig", api.kubeconfig, "--node-name", NODE, "--podresources-socket",
                  "", *args)


def test_kube_events_without_create_on_events(api):
    api.denied.add(("create", "events"))
    assert_pair(kube(api, "--kube-events"),
                ["--kube-events: create on events denied", "deploy/components/kube-events"])
    reviews = [p for p, q in api.requests if p.endswith("selfsubjectaccessreviews")]
    assert reviews  # asked, not guessed


def test_what_run_accepts_check_does_not_fail(api, tmp_path):
    checked = exporter("check", *kube(api, "--kube-events"))
    assert checked.returncode == 0, checked.stdout
    assert "OK   kube events: create on events allowed" in checked.stdout
    assert "OK   web: http://127.0.0.1:" in checked.stdout
    with RunningExporter("--source", "sysfs", "--kubeconfig", api.kubeconfig, "--node-name",
                         NODE, "--podresources-socket", "", "--kube-events") as running:
        assert running.scrape().series("node_resize_exporter_build_info")  # it serves


def test_check_names_only_the_sources_asked_for():
    out = exporter("check", *listen()).stdout
    assert "OK   sysfs source" in out
    for word in ("bpf source", "BPF source", "cpuhp", "uevent source"):
        assert word not in out, out


def test_api_messages_are_quoted_never_a_terminal_escape_or_a_forged_line(tmp_path):
    """An API server (or whatever answers in its place) whose error message carries a terminal
    escape and a newline: `check` and `run` show them as escapes, on their own line."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    message = "no\x1b[2J\nFAIL forged: all is lost"

    class Hostile(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self):
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "message": message, "reason": "Forbidden", "code": 403}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = tmp_path / "kubeconfig"
        config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{server.server_port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
        args = listen("--kubernetes", "on", "--kubeconfig", str(config), "--node-name", NODE)
        ran, checked = exporter("run", *args), exporter("check", *args)
    finally:
        server.shutdown()
        server.server_close()
    assert ran.returncode == 2 and checked.returncode == 1
    for out in (ran.stderr, checked.stdout):
        assert "\x1b" not in out and "\\x1b[2J\\nFAIL forged" in out, out
        assert not any(line.startswith("FAIL forged") for line in out.splitlines()), out
