"""The QEMU hotplug lab, end to end: real DIMM and vCPU hotplug in a guest kernel.

One guest for the module (boot ~8 s, bcc compile in the guest ~14 s under TCG); the scenario
tests run in file order on it (the DIMM added first is removed later). QEMU is stopped by the
fixture's finally, by lab.qemu's atexit hook, and the last tests prove both paths.
Artifacts of each run: lab/out/pytest-<timestamp>-<pid>/ (serial.log, scratch/exporter.log, ...).
The plain unit tests at the top (initramfs, cpulists) need no guest.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import initramfs
from lab.control import LabGuest
from lab.qemu import QEMU, Guest
from lab.scenarios import (
    LabRun,
    Scenario,
    cpu_count,
    cpu_hot_add,
    exporter_up,
    hostfwd_http,
)
from lab.scenarios_orchestrator import LAB_ORDER
from testkit import kernel

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "lab" / "out"


def lab_missing() -> str | None:
    if shutil.which(QEMU) is None:
        return f"{QEMU} not installed (scripts/setup.sh lab)"
    try:
        initramfs.Kernel.find()
    except FileNotFoundError as e:
        return str(e)
    return None


needs_lab = pytest.mark.skipif(lab_missing() is not None, reason=str(lab_missing()))


# ---------------------------------------------------------------- no guest needed


def test_module_load_order_puts_dependencies_first():
    kernel = initramfs.Kernel.find() if lab_missing() is None else None
    if kernel is None:
        pytest.skip(str(lab_missing()))
    order = [Path(p).name.split(".ko")[0] for p in initramfs.module_load_order(kernel.modules)]
    for before, after in (("virtio", "virtio_pci"), ("virtio_ring", "virtio_pci"),
                          ("9pnet", "9pnet_virtio"), ("netfs", "9p"), ("fscache", "9p"),
                          ("failover", "net_failover"), ("net_failover", "virtio_net")):
        assert order.index(before) < order.index(after), order
    assert len(order) == len(set(order))


def test_initramfs_is_a_cpio_the_cpio_tool_reads(tmp_path):
    if lab_missing() is not None or shutil.which("cpio") is None:
        pytest.skip(str(lab_missing() or "no cpio binary to cross-check with"))
    archive = initramfs.build(tmp_path / "initrd.cpio")
    listing = subprocess.run(["cpio", "-itv"], input=archive.read_bytes(), capture_output=True,
                             check=True).stdout.decode()
    names = {line.split()[-1] if "->" not in line else line.split()[-3]
             for line in listing.splitlines()}
    assert {"init", "bin/busybox", "bin/sh", "dev/console", "modules.list"} <= names
    console = next(line for line in listing.splitlines() if line.endswith("dev/console"))
    assert re.match(r"crw.*\b5,\s*1\b", console), console
    extracted = tmp_path / "x"
    extracted.mkdir()
    subprocess.run(["cpio", "-id", "--quiet"], input=archive.read_bytes(), cwd=extracted,
                   check=True, capture_output=True)
    init = (extracted / "init").read_text()
    assert init.startswith("#!/bin/busybox sh") and "chroot /host" in init
    for rel in (extracted / "modules.list").read_text().split():
        assert (extracted / "lib" / "modules" / rel).stat().st_size > 0


@pytest.mark.parametrize("cpulist,count", [("", 0), ("0", 1), ("0-1", 2), ("0-3,8,10-11", 7)])
def test_cpu_count(cpulist, count):
    assert cpu_count(cpulist) == count


# ---------------------------------------------------------------- the guest


@pytest.fixture(scope="module")
def lab_run():
    missing = lab_missing()
    if missing:
        pytest.skip(missing)
    out = OUT / f"{time.strftime('pytest-%Y%m%d-%H%M%S')}-{os.getpid()}"
    lab = LabGuest.boot(out)  # stops QEMU itself if the boot fails
    try:
        yield LabRun(lab)
    finally:
        try:
            lab.collect()
        finally:
            lab.shutdown()


# From the vCPU's hot-add on, the lab has the machine to itself (the other workers' tests wait):
# under load QEMU 7.2's TCG left a hot-added vCPU asleep with its timer interrupt pending for
# minutes (lab/README.md; 5 of 12 runs of these scenarios beside four CPU hogs, and CI).
VCPU_SCENARIOS = LAB_ORDER[LAB_ORDER.index(cpu_hot_add):]


@pytest.fixture(scope="module")
def machine_alone(lab_run):
    """Held from the first vCPU scenario to the last (closed there, or at the module's end);
    the wait is not charged to the lab's time budget, and is written to the run's alone.log."""
    with contextlib.ExitStack() as stack:  # test_scenario closes it after the last one
        began = time.monotonic()
        waited = stack.enter_context(kernel.alone_on_the_machine())
        lab_run.started += waited
        stack.callback(lambda: (lab_run.lab.guest.out / "alone.log").write_text(
            f"waited {waited:.1f}s for the machine, had it alone "
            f"{time.monotonic() - began - waited:.1f}s\n"))
        yield stack


def passes(scenario: Scenario, run: LabRun) -> None:
    outcome = scenario.run(run)
    assert outcome.passed, (f"{outcome.name}: {outcome.detail}\n  kernel: {outcome.kernel}\n"
                            f"  exporter: {outcome.exporter}\n  artifacts: {run.lab.guest.out}")


@pytest.mark.lab
@needs_lab
def test_guest_boots_with_the_host_root_and_the_agent(lab_run):
    st = lab_run.lab.state()
    assert st["cpus_online"] == "0" and st["cpus_present"] == "0"
    assert st["block_size_bytes"] == 128 << 20
    assert len(st["memory_blocks"]) == 8  # 1 GiB of boot RAM, 128 MiB blocks
    assert set(st["memory_blocks"].values()) == {"online"}
    assert "lab-init: ready" in lab_run.lab.guest.serial()
    # What an unanswered request reports: the vCPU's thread, its state and CPU time
    assert re.search(r"CPU 0/TCG [RSD] \d+\.\ds", lab_run.lab.guest.threads())
    # and the guest kernel's stacks, asked on its keyboard
    assert "Show Blocked State" in lab_run.lab.guest.sysrq("w")


@pytest.mark.lab
@needs_lab
def test_hostfwd_reaches_a_guest_http_server(lab_run):
    passes(hostfwd_http, lab_run)


@pytest.mark.lab
@needs_lab
def test_exporter_runs_in_the_guest_with_every_source(lab_run):
    passes(exporter_up, lab_run)


@pytest.mark.lab
@needs_lab
@pytest.mark.parametrize("scenario", LAB_ORDER, ids=lambda s: s.fn.__name__)
def test_scenario(lab_run, scenario, request):
    if lab_run.lab.exporter_pid is None:
        pytest.fail("the exporter never started in the guest (see the test before)")
    if scenario not in VCPU_SCENARIOS:
        passes(scenario, lab_run)
        return
    alone = request.getfixturevalue("machine_alone")
    try:
        passes(scenario, lab_run)
    finally:
        if scenario is VCPU_SCENARIOS[-1]:  # the last: the other tests go on
            alone.close()


# ---------------------------------------------------------------- QEMU dies in every outcome


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is dead for our purpose.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.lab
@needs_lab
def test_qemu_is_killed_when_the_with_block_raises(tmp_path):
    pid = None
    with pytest.raises(RuntimeError, match="scenario blew up"):
        with Guest(tmp_path) as guest:
            pid = guest.proc.pid
            assert guest.alive()
            raise RuntimeError("scenario blew up")
    assert pid is not None and _gone(pid)


@pytest.mark.lab
@needs_lab
def test_qemu_is_killed_at_interpreter_exit_without_stop(tmp_path):
    """A lab process that forgets stop() (or dies of an exception) still takes QEMU with it."""
    script = ("import sys; from pathlib import Path; from lab.qemu import Guest; "
              f"g = Guest(Path({str(tmp_path)!r})).start(); print(g.proc.pid, flush=True); "
              "raise SystemExit(3)")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert _gone(int(done.stdout.split()[0]))
