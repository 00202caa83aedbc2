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
