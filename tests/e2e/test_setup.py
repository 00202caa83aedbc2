"""Every program the tests, the lab and the benchmarks run is installed by scripts/setup.sh.

A program that is on this machine only because someone installed it by hand is missing on a
fresh one (`cpio` was: the lab's initramfs test was skipped there, and under CI=true a skip is a
failure). The programs are read from the code itself: the first word of every literal argv
handed to subprocess, and every shutil.which("...") name. Each must resolve here, and the
Debian package that ships it must be one setup.sh installs or one Debian installs on every
system (Essential or Priority required).
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup.sh"
WHERE = ("tests", "testkit", "lab", "bench")
RUNNERS = {"run", "Popen", "check_output", "check_call", "call", "execvp", "execv"}
# Interpreters and the exporter itself come from the venv, not from Debian.
FROM_THE_VENV = {"node-resize-exporter", "python", "python3", "py-spy", "kubectl"}


def _argv0(node: ast.Call) -> str | None:
    name = node.func.attr if isinstance(node.func, ast.Attribute) else \
        node.func.id if isinstance(node.func, ast.Name) else None
    if name == "which" and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        return value if isinstance(value, str) else None
    if name in RUNNERS and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
        first = node.args[0].elts[0] if node.args[0].elts else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def programs() -> dict[str, set[str]]:
    """program -> the files that run it."""
    found: dict[str, set[str]] = {}
    for folder in WHERE:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call):
                    prog = _argv0(node)
                    if prog and "/" not in prog and prog not in FROM_THE_VENV:
                        found.setdefault(prog, set()).add(str(path.relative_to(REPO)))
    return found


@cache
def _setup_packages() -> set[str]:
    text = re.sub(r"#[^\n]*", "", SETUP.read_text())  # comments name packages too
    words: set[str] = set()
    # each call with its continuation lines, up to the end of the command
    for call in re.findall(r"apt_install ((?:[^\n;\\]|\\\n)*)", text):
        words.update(w for w in re.split(r"[\s\\]+", call) if re.fullmatch(r"[a-z0-9.+-]+", w))
    return words


def _packages_of(path: str) -> list[str]:
    """The Debian packages that ship `path` and each link it goes through (/usr/bin/cc ->
    /etc/alternatives/cc -> /usr/bin/gcc -> gcc-12: `gcc` ships the /usr/bin/gcc link)."""
    hops, seen = [path], set()
    while os.path.islink(hops[-1]) and hops[-1] not in seen:
        seen.add(hops[-1])
        hops.append(os.path.join(os.path.dirname(hops[-1]), os.readlink(hops[-1])))
    hops.append(str(Path(path).resolve()))
    # Debian 12 merged /usr: dpkg may know /bin/tar where the path is /usr/bin/tar.
    hops += [h.removeprefix("/usr") for h in hops if h.startswith("/usr/")]
    found = []
    for candidate in hops:
        out = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        found += [ln.split(":")[0].split(",")[0].strip() for ln in out.stdout.splitlines()
                  if out.returncode == 0 and not ln.startswith("diversion")]
    return found


def _always_there(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Essential} ${Priority}", package],
                         capture_output=True, text=True)
    return out.stdout.split()[:1] == ["yes"] or out.stdout.endswith("required")


def test_the_scan_finds_the_programs_the_suite_is_known_to_run():
    found = programs()
    for known in ("cpio", "promtool", "runc", "curl"):
        assert known in found, sorted(found)


def test_setup_reads_the_apt_lists_of_every_mode():
    assert {"cpio", "prometheus", "runc", "qemu-system-x86", "python3-bpfcc"} <= \
        _setup_packages()


@pytest.mark.parametrize("program", sorted(programs()))
def test_every_program_the_tests_run_is_installed_by_setup(program):
    path = shutil.which(program)
    assert path, f"{program} (run by {sorted(programs()[program])}) is not installed: " \
                 "add its Debian package to scripts/setup.sh"
    packages = _packages_of(path)
    assert packages, f"{program} at {path} belongs to no Debian package: install it from one"
    assert any(p in _setup_packages() or _always_there(p) for p in packages), \
        f"{program} comes from {packages}, none of which scripts/setup.sh installs"
