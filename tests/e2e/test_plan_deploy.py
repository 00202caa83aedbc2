"""RBAC for GET /plan: the base grants it to nobody (a ClusterRole, no binding), the opt-in
component binds it to one service account, and scraping /metrics does not include it. Built
with the real `kubectl kustomize` and validated against the Kubernetes schemas."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl")


def build(tmp_path: Path, components: list[str]) -> list[dict]:
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../deploy"],
        "components": [f"../deploy/components/{c}" for c in components]}))
    out = subprocess.run(["kubectl", "kustomize", str(overlay)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def grants(docs: list[dict], path: str) -> list[dict]:
    """Subjects of the bindings whose role allows get on `path`."""
    roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"
             and any(path in r.get("nonResourceURLs", ()) and "get" in r["verbs"]
                     for r in d["rules"])}
    return [s for d in docs if d["kind"] == "ClusterRoleBinding"
            and d["roleRef"]["name"] in roles for s in d["subjects"]]


def test_the_base_grants_plan_to_nobody_and_metrics_does_not_include_it(tmp_path):
    docs = build(tmp_path, [])
    assert grants(docs, "/plan") == []
    assert grants(docs, "/metrics")  # Prometheus may scrape


def test_the_plan_component_binds_it_to_one_service_account(tmp_path):
    docs = build(tmp_path, ["plan"])
    assert grants(docs, "/plan") == [{"kind": "ServiceAccount", "name": "node-resizer",
                                      "namespace": "node-resize-exporter"}]
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            kubernetes_validate.validate(doc, "1.33", strict=True)
