"""Starts that used to crash: not root, a read-only root without a
writable /tmp, odd --path.sysfs / --path.procfs trees, a FIFO where a checkpoint should be.
Each is a real `run` or `check` process: it must degrade (the rest runs, the reason said once)
or exit 2 with the fix, and never print a traceback or hang."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from testkit.exporter_proc import REPO, RunningExporter, free_port

# setpriv: the real unprivileged user, no capability in any set (a `run` as a plain user).
AS_NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             "--inh-caps=-all", "--bounding-set=-all")
# A private mount namespace whose / (and so /tmp, /var/tmp and the checkout) is read-only;
# the machine's mounts are untouched, and it ends with the process.
READ_ONLY_ROOT = ("unshare", "-m", "--propagation", "private", "sh", "-c",
                  'mount -o remount,bind,ro / && exec "$@"', "sh")


def cli(*args: str, wrapper: tuple[str, ...] = (), env: dict | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([*wrapper, sys.executable, "-m", "exporter", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def run(*args: str) -> subprocess.CompletedProcess:
    return cli("run", "--source", "sysfs", "--no-journal", "--web.listen-address",
               f"127.0.0.1:{free_port()}", *args)


def test_run_as_an_unprivileged_user_starts_what_works_and_says_why_not_the_rest():
    # setpriv keeps root's HOME: the default journal (under ~/.local/state) cannot be made
    with RunningExporter(wrapper=AS_NOBODY, journal=True, env={"HOME": "/root"}) as exp:
        exp.wait_for(lambda s: s.value("node_resize_exporter_source_up", source="bpf") == 0
                         and s.value("node_resize_exporter_source_up", source="sysfs") == 1)
        logs = exp.logs()
    assert "source bpf unavailable: not root" in logs
    assert "journal off: cannot create /root/.local/state" in logs  # degraded, not exit 2
    assert "Traceback" not in logs


def test_check_as_an_unprivileged_user_reports_without_a_traceback():
    r = cli("check", wrapper=AS_NOBODY, env={"HOME": "/nonexistent"})
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "FAIL bpf source: not root" in r.stdout
    assert "OK   sysfs source" in r.stdout


def test_a_read_only_root_without_a_writable_tmp_still_loads_bpf():
    """bcc's loader child wrote clang's diagnostics to a temporary file: no usable temporary
    directory was a failed start. It is an anonymous memory file now."""
    with RunningExporter(wrapper=READ_ONLY_ROOT) as exp:
        exp.wait_for(lambda s: s.value("node_resize_exporter_source_up", source="bpf") == 1)
        logs = exp.logs()
    assert "temporary directory" not in logs and "Traceback" not in logs


def sysfs_tree(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the host's CPU lists and meminfo: a --path.sysfs / --path.procfs that works."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    cpu = sysfs / "devices/system/cpu"
    cpu.mkdir(parents=True)
    for name in ("online", "offline", "present", "possible"):
        shutil.copyfile(f"/sys/devices/system/cpu/{name}", cpu / name)
    procfs.mkdir()
    shutil.copyfile("/proc/meminfo", procfs / "meminfo")
    return sysfs, procfs


def test_odd_trees_exit_2_with_the_fix_never_hang_or_trace(tmp_path):
    sysfs, procfs = sysfs_tree(tmp_path)
    paths = ("--path.sysfs", str(sysfs), "--path.procfs", str(procfs))
    assert run(*paths, "--podresources-socket", "", "--help").returncode == 0
    (procfs / "meminfo").unlink()
    os.mkfifo(procfs / "meminfo")
    r = run(*paths)  # hung in open() before
    assert r.returncode == 2, r.stderr
    assert "not a regular file (a FIFO)" in r.stderr and "--path.procfs" in r.stderr
    assert "Traceback" not in r.stderr
    (procfs / "meminfo").unlink()
    shutil.copyfile("/proc/meminfo", procfs / "meminfo")
    (sysfs / "devices/system/cpu/online").write_text("0-1,garbage\n")
    r = run(*paths)  # a ValueError traceback, exit 1 before
    assert r.returncode == 2, r.stderr
    assert "garbage" in r.stderr and "Traceback" not in r.stderr


def test_check_with_a_fifo_checkpoint_answers(tmp_path):
    os.mkfifo(tmp_path / "cpu_manager_state")
    r = cli("check", "--kubelet-root-dir", str(tmp_path))  # hung until killed before
    assert "Traceback" not in r.stdout + r.stderr
    assert "kubelet restart: not checked" in r.stdout and "a FIFO" in r.stdout
