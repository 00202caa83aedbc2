"""The lab's vCPU scenarios have the machine alone (testkit.kernel.alone_on_the_machine): a
test that shares it (every other test, tests/conftest.py) holds them off until it ends, and
waits to start while they run, however many others keep starting."""
from __future__ import annotations

import threading
import time

import pytest

from testkit import kernel


@pytest.fixture(autouse=True)
def private_locks(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel, "QUIET_PATH", str(tmp_path / "quiet.lock"))
    monkeypatch.setattr(kernel, "TURNSTILE_PATH", str(tmp_path / "turnstile.lock"))


def test_alone_waits_for_the_tests_running_and_they_for_it():
    log: list[str] = []
    running = threading.Event()
    release = threading.Event()

    # Each writes its last line while it still holds the machine: written after the release,
    # the next holder's first line could come first (CI, under load).
    def a_test(name: str, hold: threading.Event | None = None) -> None:
        with kernel.sharing_the_machine():
            log.append(f"{name} runs")
            running.set()
            if hold is not None:
                hold.wait(10)
            log.append(f"{name} done")

    def the_lab() -> None:
        with kernel.alone_on_the_machine() as waited:
            log.append(f"lab alone after {waited:.1f}s")
            time.sleep(0.3)
            log.append("lab done")

    first = threading.Thread(target=a_test, args=("first", release))
    first.start()
    assert running.wait(5)
    lab = threading.Thread(target=the_lab)
    lab.start()
    time.sleep(0.3)
    assert log == ["first runs"]  # the lab waits for the test running
    later = threading.Thread(target=a_test, args=("later",))
    later.start()
    time.sleep(0.3)
    assert log == ["first runs"]  # a test starting now waits behind the lab
    release.set()
    for t in (first, lab, later):
        t.join(10)
    assert log[:2] == ["first runs", "first done"]
    assert log[2].startswith("lab alone after ") and float(log[2].split()[-1][:-1]) >= 0.3
    assert log[3:] == ["lab done", "later runs", "later done"]


def test_tests_share_the_machine_with_each_other():
    inside = threading.Barrier(3, timeout=5)

    def a_test() -> None:
        with kernel.sharing_the_machine():
            inside.wait()  # all three inside at once, or the barrier breaks

    threads = [threading.Thread(target=a_test) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not inside.broken
