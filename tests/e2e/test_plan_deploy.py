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


def test_the_default_install_mounts_what_the_plan_needs_read_only():
    """Issue 35 item 2: `kubectl apply -k deploy/` gives the exporter the kubelet's checkpoints
    and configuration and the host's cgroups, read-only, where its defaults read them: the
    default install answers the kubelet-restart question instead of "cannot tell"."""
    from exporter.sources.kubelet.kubelet_checkpoint import KUBELET_ROOT_DIR
    from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
    [ds] = [d for d in build([]) if d["kind"] == "DaemonSet"]
    [container] = [c for c in ds["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "exporter"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    for path, host in ((KUBELET_ROOT_DIR.default, "/var/lib/kubelet"),
                       (CGROUP_ROOT.default, "/sys/fs/cgroup")):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == host
    args = " ".join(container.get("args", []))
    assert "--kubelet-root-dir" not in args and "--cgroup-root" not in args
    assert not ds["spec"]["template"]["spec"].get("hostPID")  # still the component's
    kubernetes_validate.validate(ds, "1.33", strict=True)
