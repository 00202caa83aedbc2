#!/usr/bin/env python3
"""Print the Secret `node-resize-exporter-web` as YAML: the exporter's web config (TLS and basic
auth, docs/security.md), a self-signed certificate for the name the ServiceMonitor verifies
(node-resize-exporter), its key, and the scrape user's password. Run once per cluster:

    deploy/web-secret.py | kubectl apply -f -

Needs `openssl` and Python's bcrypt (the project's venv has it). A fresh key and password every
run: re-running rotates them (restart the DaemonSet afterwards).
"""
from __future__ import annotations

import base64
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import bcrypt
import yaml

NAME = "node-resize-exporter-web"
NAMESPACE = "node-resize-exporter"
SERVER_NAME = "node-resize-exporter"  # ServiceMonitor tlsConfig.serverName
USER = "prometheus"
DAYS = 3650


def certificate() -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        key, crt = Path(tmp) / "tls.key", Path(tmp) / "tls.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", str(DAYS),
                        "-subj", f"/CN={SERVER_NAME}",
                        "-addext", f"subjectAltName=DNS:{SERVER_NAME}",
                        "-keyout", str(key), "-out", str(crt)],
                       check=True, capture_output=True)
        return crt.read_text(), key.read_text()


def secret(password: str | None = None) -> dict:
    crt, key = certificate()
    password = password or secrets.token_urlsafe(24)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    web_config = yaml.safe_dump({
        "tls_server_config": {"cert_file": "/etc/node-resize-exporter/web/tls.crt",
                              "key_file": "/etc/node-resize-exporter/web/tls.key",
                              "min_version": "TLS12"},
        "basic_auth_users": {USER: hashed},
    }, sort_keys=False)
    data = {"web-config.yml": web_config, "tls.crt": crt, "tls.key": key,
            "username": USER, "password": password}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {"app.kubernetes.io/name": "node-resize-exporter"}},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


if __name__ == "__main__":
    sys.stdout.write(yaml.safe_dump(secret(), sort_keys=False))
