"""The running agent takes its start-up heap out of the garbage collector's walks, so
a full collection (9-13 ms over the ~46k start-up objects) cannot land on a kernel event."""
from __future__ import annotations

import gc
import threading

from exporter.app import build_agent
from exporter.clock import MonotonicWallClock
from exporter.config.options import Options


def test_the_agent_freezes_what_start_up_built():
    built = build_agent(Options(sources=("sysfs",), kubernetes="off", no_journal=True),
                        MonotonicWallClock())
    gc.unfreeze()  # whatever this test process froze before
    assert gc.get_freeze_count() == 0
    stop = threading.Event()
    runner = threading.Thread(target=built.agent.run, args=(stop,))
    runner.start()
    try:
        assert built.agent.alive.wait(30)
        assert gc.get_freeze_count() > 1000  # the modules, the agent, its sources
    finally:
        stop.set()
        built.agent.wake()
        runner.join(30)
        gc.unfreeze()
