"""Debian's real Prometheus as a test daemon on loopback, and its HTTP API."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run scripts/setup.sh test")
    return path



def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_for(what: str, predicate, timeout: float = 60.0, interval: float = 0.2, logs=None):
    """Poll predicate() until it returns something truthy; fail with `what` and logs if not."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError as e:  # not listening yet
            last_error = e
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    pytest.fail(f"waited {timeout}s for {what}{detail}\n{logs() if logs else ''}")


class Daemon:
    """A Prometheus-family server run from its Debian binary, logs kept for failures."""

    def __init__(self, name: str, args: list[str], port: int, workdir: Path) -> None:
        self.name, self.port = name, port
        self.log_path = workdir / f"{Path(name).name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary(name), *args], cwd=workdir, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return f"--- {self.name} log ---\n{self.log_path.read_text()[-4000:]}"

    def wait_ready(self) -> None:
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited {self.proc.returncode}\n{self.logs()}")
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        wait_for(f"{self.name} to be ready", ready, timeout=30, logs=self.logs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
