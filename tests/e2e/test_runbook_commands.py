"""docs/runbooks.md's scrape command works against the deployment as shipped: its port, scheme
and path are the DaemonSet's and the ServiceMonitor's, the account it takes a token of is one
deploy/ grants `get` on /metrics, and the command text itself, run by bash with curl against a
real `run --web.auth=kubernetes` (the fake API server authenticating that account), prints the
metrics each section greps for."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.deploy import container_of, load_manifest
from testkit.fakes.apiserver import serving_node
from testkit.kubeauth import KubeAuthExporter

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = (REPO / "docs" / "runbooks.md").read_text()


def _preamble() -> dict[str, str]:
    token = re.search(r"^    TOKEN=\$\(kubectl -n (\S+) create token (\S+) .*\)$", RUNBOOKS, re.M)
    forward = re.search(r"^    kubectl -n \S+ port-forward \"\$POD\" (\d+):(\d+) &$", RUNBOOKS,
                        re.M)
    metrics = re.search(r"^    (metrics\(\) \{ .* \})$", RUNBOOKS, re.M)
    assert token and forward and metrics, "the runbooks' preamble changed shape"
    return {"namespace": token.group(1), "account": token.group(2),
            "local": forward.group(1), "remote": forward.group(2), "metrics": metrics.group(1)}


def test_the_scrape_command_matches_what_the_deployment_serves():
    pre = _preamble()
    container = container_of(load_manifest("daemonset.yaml"))
    listen = next(a for a in container["args"] if a.startswith("--web.listen-address="))
    assert pre["remote"] == listen.rsplit(":", 1)[1] == str(container["ports"][0]["containerPort"])
    (endpoint,) = load_manifest("servicemonitor.yaml")["spec"]["endpoints"]
    url = re.search(r"(\w+)://localhost:(\d+)(/\S*?);?$", pre["metrics"].rstrip(" }"))
    assert url, pre["metrics"]
    assert url.group(1) == endpoint["scheme"] == "https"
    assert url.group(2) == pre["local"]
    assert url.group(3) == endpoint["path"]
    assert '-H "Authorization: Bearer $TOKEN"' in pre["metrics"]
    subjects = {(s["namespace"], s["name"]) for s in
                load_manifest("scrape-clusterrolebinding.yaml")["subjects"]}
    assert (pre["namespace"], pre["account"]) in subjects
    # Every section scrapes through `metrics`, none with a plain-HTTP curl of its own.
    assert "curl -s localhost" not in RUNBOOKS and "http://localhost:9862" not in RUNBOOKS


def test_the_scrape_command_as_written_prints_metrics(tmp_path):
    if shutil.which("curl") is None:
        pytest.fail("curl not found: scripts/setup.sh test installs it")
    pre = _preamble()
    greps = re.findall(r"^    (metrics \| grep -E '[^']+')$", RUNBOOKS, re.M)
    assert len(greps) >= 5, greps
    with serving_node(str(tmp_path), "auth-node") as api:
        user = f"system:serviceaccount:{pre['namespace']}:{pre['account']}"
        api.add_token("runbook-token", user)
        api.allow_path(f"user:{user}")
        with KubeAuthExporter(api.kubeconfig) as exp:
            define = pre["metrics"].replace(f"localhost:{pre['local']}", f"localhost:{exp.port}")
            outputs = {}
            for grep in greps:
                run = subprocess.run(["bash", "-c", f"TOKEN=runbook-token\n{define}\n{grep}"],
                                     capture_output=True, text=True, timeout=30)
                outputs[grep] = run.stdout
            wrong = subprocess.run(["bash", "-c", f"TOKEN=not-a-token\n{define}\nmetrics"],
                                   capture_output=True, text=True, timeout=30)
    # With --kubernetes off and no kubelet here, the kernel and exporter families answer.
    sources = next(g for g in greps if "source_up" in g)
    assert "node_resize_exporter_source_up{" in outputs[sources], outputs
    kernel = next(g for g in greps if "kernel_(cpus" in g)
    assert "node_resize_kernel_cpus{" in outputs[kernel], outputs
    assert wrong.stdout.strip() == "Unauthorized"


def _alternatives(pattern: str) -> list[str]:
    """The top-level `|` branches of an extended regular expression."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(pattern):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    return [*out, pattern[start:]]


def test_every_grep_in_the_runbooks_names_metrics_that_exist():
    from testkit import metrics_doc

    names = set()
    for name, row in metrics_doc.rows(REPO / "docs" / "metrics.md").items():
        names |= set(metrics_doc.sample_names(row)) | {name}
    for pattern in re.findall(r"metrics \| grep -E '([^']+)'", RUNBOOKS):
        for branch in _alternatives(pattern):
            name_part = branch.split(".*")[0]  # what follows matches labels or values
            assert any(re.match(name_part, f"{n}{{x=\"y\"}} 1") for n in names), \
                f"runbook grep {pattern!r}: {branch!r} matches no metric in docs/metrics.md"
