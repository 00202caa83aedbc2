"""Shared test plumbing: the real-kernel guards, CI's no-skip rule, and the folders' markers.

tests/unit needs neither root nor a server and runs in seconds; tests/e2e runs real processes
and servers on loopback (the exporter, Prometheus, a test API server, a gRPC kubelet);
tests/kernel drives the real kernel (cpu1, memory blocks, BPF) or a QEMU guest's. A test's
folder is its marker: `pytest -m kernel` and `pytest tests/kernel` select the same tests.

Several pytest processes may run on one machine at once (developers in parallel); every test
that hotplugs takes one machine-wide lock, so counters one test asserts are not moved by another.
"""
from __future__ import annotations

import os

import pytest

from testkit import kernel


def pytest_sessionstart(session):
    session.config._hotplug_baseline = kernel.Baseline.capture()


def pytest_sessionfinish(session, exitstatus):
    # Belt and braces: every test restores in its own finally; this catches a crash between.
    # Under the lock: another session's test may hold cpu1 offline right now, and onlining it
    # under that test moved its counts (test_faults saw a CPU come back mid-episode).
    baseline = getattr(session.config, "_hotplug_baseline", None)
    # Taken only when something is off, so sessions that hotplug nothing never wait for it.
    if baseline is not None and baseline.changed():
        with kernel.hotplug_lock():
            baseline.restore()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test but the lab's runs sharing the machine, its set-up and tear-down included
    (a module's servers start and stop there), so that the lab's vCPU scenarios can have it
    alone (testkit.kernel.alone_on_the_machine, tests/kernel/test_lab.py)."""
    if chain_of(item.nodeid)[1] == "lab":  # the lab's file: it holds the machine alone
        yield
        return
    with kernel.sharing_the_machine():
        yield


FOLDER_MARKERS = {"unit": "unit", "e2e": "e2e", "kernel": "kernel"}


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        folder = item.path.parent.name
        marker = FOLDER_MARKERS.get(folder)
        if marker is None:
            misplaced.append(f"{item.nodeid}: not in tests/unit, tests/e2e or tests/kernel")
            continue
        if folder != "kernel" and (item.get_closest_marker("kernel")
                                   or item.get_closest_marker("lab")):
            misplaced.append(f"{item.nodeid}: drives a kernel, so it belongs in tests/kernel")
        item.add_marker(marker)
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder:\n" + "\n".join(misplaced))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the long chains first
        items.sort(key=lambda item: chain_of(item.nodeid)[0])  # stable: file order within


# `make test` runs the root pass on pytest-xdist workers (`-n 3`) in chains, each chain on one
# worker, in order: the QEMU lab (one guest boot, minutes; the host's hotplug untouched); every
# other kernel file, one after another as a plain run has them (they share cpu1 and memory
# blocks; those that hotplug also hold the machine-wide lock, as does every test elsewhere that
# asserts on the kernel's state); each e2e file (its module's servers started once); each unit
# test. The two long chains are handed out first, so neither is the tail. (pytest-xdist's own
# `--dist loadgroup` cannot do this with pytest 9: it renames node ids pytest 9 no longer reads.)
LAB_FILE = "tests/kernel/test_lab.py"


def chain_of(nodeid: str) -> tuple[int, str]:
    """(order, chain) of a test: the chain names the worker's unit of work."""
    path = nodeid.split("::", 1)[0]
    folder = path.rsplit("/", 2)[-2] if path.count("/") >= 1 else ""
    if folder == "kernel":
        return (0, "lab") if path == LAB_FILE else (1, "kernel")
    if folder == "e2e":
        return 2, path
    return 3, nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Chains(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return chain_of(nodeid)[1]

    config.option.loadscopereorder = False  # the workers' order (chain_of's), not by size
    return Chains(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # CI runs as root on machines where BPF, tracepoints and CPU hot-unplug are real: a skip there
    # means a broken set-up, not a missing feature, so it must fail the run.
    if report.skipped and os.environ.get("CI") == "true" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"


@pytest.fixture
def cpu1():
    """Exclusive use of cpu1 for the whole test; it is online again afterwards, whatever happens."""
    with kernel.hotplug_lock():
        cpu = kernel.Cpu(1)
        if not cpu.hotpluggable():
            pytest.skip("cpu1 is not hot-pluggable here (needs root and a second CPU)")
        cpu.set_online(True)
        try:
            yield cpu
        finally:
            cpu.set_online(True)


@pytest.fixture
def memory_block():
    """An offlinable memory block (found by trying), online again afterwards, whatever happens."""
    with kernel.hotplug_lock():
        block = kernel.find_offlinable_memory_block()
        if block is None:
            pytest.skip("no memory block here can be offlined (needs root and MEMORY_HOTREMOVE)")
        try:
            yield block
        finally:
            block.set_online(True)


@pytest.fixture
def refused_memory_block():
    """A memory block whose offline the kernel refuses (EBUSY)."""
    with kernel.hotplug_lock():
        block = kernel.find_refused_memory_block()
        if block is None:
            pytest.skip("found no memory block that the kernel refuses to offline")
        try:
            yield block
        finally:
            block.set_online(True)

