"""Threads decoding API answers at once never crash the agent (exporter/kube/client.py,
prepare_decoding).

msgspec builds a Struct type's decoding information on the type's first decode, and two threads
doing so together crash the process with SIGSEGV: CI lost an exporter that way when two watches
were told 410 Expired at once. Here each child process builds the agent as `run` does, then four
threads decode, together and for the first time in that process, what the watches decode (a
Status, a watch event, a list of each resource the sources read), with a 1 us switch interval
so they interleave inside msgspec. Without the preparation, 21 of 40 such children crashed on
this machine; with it, none may.
"""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CHILDREN = 20  # P(all 20 pass) unprepared: 0.48**20, about 4e-7

CHILD = r"""
import sys, threading

from lightkube.core import decoders

from exporter.app import build_agent
from exporter.clock import MonotonicWallClock
from exporter.config.options import Options
from exporter.kube.client import RawNode, RawPdb, RawPod
from exporter.sources.apiserver.kube_lease import RawLease
from exporter.sources.apiserver.kube_node_events import RawEvent

build_agent(Options(sources=("sysfs",), kubernetes="off", no_journal=True), MonotonicWallClock())
sys.setswitchinterval(1e-6)
STATUS = (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
          b'"message":"too old resource version: 1 (2)","reason":"Expired","code":410}')
EVENT = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"p"}}}'
LIST = b'{"metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"p"}}]}'
THREADS = 4
barrier = threading.Barrier(THREADS)


def decode():
    barrier.wait()
    assert decoders.decode_status(STATUS).code == 410
    assert decoders.decode_watch_event(EVENT).type == "ADDED"
    for resource in (RawNode, RawPod, RawPdb, RawLease, RawEvent):
        assert decoders.decode_list(LIST, resource)[1] == "7"


threads = [threading.Thread(target=decode) for _ in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("decoded")
"""


def _child(_: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD],
                          capture_output=True, text=True, timeout=120)


def test_threads_decoding_their_first_answers_at_once_do_not_crash_the_agent():
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(_child, range(CHILDREN)))
    crashed = [d for d in done if d.returncode != 0 or "decoded" not in d.stdout]
    assert not crashed, (f"{len(crashed)} of {CHILDREN} children died; the first "
                         f"(exit {crashed[0].returncode}):\n{crashed[0].stderr[-3000:]}")
