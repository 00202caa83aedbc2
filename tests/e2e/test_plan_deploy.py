"""RBAC for GET /plan: the base grants it to nobody (a ClusterRole, no binding), the opt-in
component binds it to one service account, and scraping /metrics does not include it. Built
with the real `kubectl kustomize` and validated against the Kubernetes schemas."""
from __future__ import annotations

import kubernetes_validate

from testkit.deploy import DEPLOY, render


def build(components: list[str]) -> list[dict]:
    """deploy/ with `components`, rendered by the test extra's kubectl as `kubectl apply -k`
    would (testkit/deploy.py)."""
    return render(DEPLOY, *(DEPLOY / "components" / c for c in components))


def grants(docs: list[dict], path: str) -> list[dict]:
    """Subjects of the bindings whose role allows get on `path`."""
    roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"
             and any(path in r.get("nonResourceURLs", ()) and "get" in r["verbs"]
                     for r in d["rules"])}
    return [s for d in docs if d["kind"] == "ClusterRoleBinding"
            and d["roleRef"]["name"] in roles for s in d["subjects"]]


def test_the_base_grants_plan_to_nobody_and_metrics_does_not_include_it():
    docs = build([])
    assert grants(docs, "/plan") == []
    assert grants(docs, "/metrics")  # Prometheus may scrape


def test_the_plan_component_binds_it_to_one_service_account():
    docs = build(["plan"])
    assert grants(docs, "/plan") == [{"kind": "ServiceAccount", "name": "node-resizer",
                                      "namespace": "node-resize-exporter"}]
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            kubernetes_validate.validate(doc, "1.33", strict=True)
