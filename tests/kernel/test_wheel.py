"""The package as users get it: a wheel built from this tree, installed into a fresh venv (system
site packages, for Debian's bcc), run from a directory that is not the checkout. The BPF C ships
inside the wheel: `--print-bpf` prints it and `run --source bpf` attaches the cpuhp programs and
counts a real cpu1 offline/online. Root and the real kernel, like the other kernel tests."""
from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from testkit.exporter_proc import Scrape, free_port, poll_until, terminate

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]
NOT_SOURCES = shutil.ignore_patterns(".venv", ".git", "dist", "build", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis", "out", "results")
BPF_FILES = {"exporter/bpf/cpuhp.bpf.c", "exporter/bpf/memory.bpf.c", "exporter/bpf/hotplug.h"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv with the wheel installed; the wheel is beside it."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    # A copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    shutil.copytree(REPO, src, ignore=NOT_SOURCES, symlinks=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(tmp / "dist"),
                    str(src)], check=True, timeout=300)
    venv = tmp / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    wheel, = (tmp / "dist").glob("node_resize_exporter-*.whl")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, timeout=600)
    return venv / "bin"


def test_the_wheel_carries_the_bpf_c(installed):
    wheel, = (installed.parent.parent / "dist").glob("*.whl")
    assert BPF_FILES <= set(zipfile.ZipFile(wheel).namelist())


def test_print_bpf_from_another_directory(installed, tmp_path):
    out = subprocess.run([str(installed / "node-resize-exporter"), "run", "--print-bpf"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "TRACEPOINT_PROBE(cpuhp, cpuhp_exit)" in out.stdout
    assert "struct hotplug_record" in out.stdout  # the header, inlined from the installed copy


def test_installed_exporter_attaches_bpf_and_counts_cpu1(installed, tmp_path, cpu1):
    exe = installed / "node-resize-exporter"
    port = free_port()
    log = open(tmp_path / "exporter.log", "w")
    proc = subprocess.Popen([str(exe), "run", "--web.listen-address", f"127.0.0.1:{port}",
                             "--source", "bpf", "--no-journal"],
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)

    def scrape() -> Scrape | None:
        if proc.poll() is not None:
            raise AssertionError(f"exporter exited {proc.returncode}: "
                                 f"{(tmp_path / 'exporter.log').read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return Scrape(r.read().decode())
        except OSError:
            return None

    def wait(predicate, what):
        return poll_until(scrape, lambda s: s is not None and predicate(s), 60, 0.1,
                          lambda s: AssertionError(f"{what}; log:\n"
                                                   f"{(tmp_path / 'exporter.log').read_text()}"))

    try:
        up = wait(lambda s: s.value("node_resize_exporter_source_up", source="bpf") == 1,
                  "the bpf source never came up")
        for program in ("cpuhp_enter", "cpuhp_multi_enter", "cpuhp_exit"):
            assert up.value("node_resize_exporter_bpf_program_attached", program=program) == 1
        cpu1.set_online(False)
        cpu1.set_online(True)
        done = wait(lambda s: s.value("node_resize_kernel_transition_duration_seconds_count",
                                      resource="cpu", direction="online") == 1,
                    "cpu1 online not timed by bpf")
        assert done.value("node_resize_kernel_transition_duration_seconds_count",
                          resource="cpu", direction="offline") == 1
    finally:
        terminate(proc)
        log.close()
