"""Capabilities dropped after the BPF programs are attached: the real BPF source keeps working
(records from a real cpu1 flap, the lost-records map still readable), loading a new program no
longer works, and /proc says no thread holds more than what was kept."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from exporter.privileges import CAPS, kernel_version, needed_after_start
from testkit.exporter_proc import REPO

CHILD = r"""
import json, sys, threading
from exporter.clock import MonotonicWallClock
from exporter.events import SourceStatus, Transition
from exporter.privileges import capabilities, drop_capabilities, needed_after_start
from exporter.sources.kernel.bpf.source import BpfSource

said = threading.Lock()

def say(**kw):                      # one write per line: two threads say things
    with said:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

source = BpfSource(MonotonicWallClock())
source.open()                       # the loader child compiles, loads, attaches: CAP_BPF+PERFMON
keep = needed_after_start(bpf_running=True)
result = drop_capabilities(keep)
try:                                # proves the drop is real: no new program may load now
    from bcc import BPF
    BPF(text='TRACEPOINT_PROBE(cpuhp, cpuhp_exit) { return 0; }')
    load_after_drop = "loaded"
except Exception as e:
    load_after_drop = str(e)[:200]
errors = []

def emit(event):
    if isinstance(event, Transition):
        say(kind="transition", unit=event.unit, direction=event.direction.value,
            steps=event.steps)
    elif isinstance(event, SourceStatus) and not event.up:  # the loop raised
        errors.append(event.reason)
        say(kind="loop_failed", error=event.reason)

source.start(emit)                  # its thread also reads the "lost" map after each batch
tasks = {tid: capabilities(tid) for tid in __import__("os").listdir("/proc/self/task")}
say(kind="ready", keep=sorted(keep), before=result.effective_before, after=result.effective_after,
    prm=capabilities("self", "CapPrm"), bnd=capabilities("self", "CapBnd"),
    nnp=open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0],
    tasks=tasks, load_after_drop=load_after_drop)
sys.stdin.readline()                # the test says when it is done
source.stop()                       # wakes the loop's poll, joins it, closes every fd
say(kind="done", errors=errors)
"""


def _lines(proc, kind: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited: {proc.stderr.read()}")
        msg = json.loads(line)
        if msg["kind"] == "loop_failed":
            raise AssertionError(f"BPF loop failed after the drop: {msg['error']}")
        if msg["kind"] == kind:
            return msg
    raise AssertionError(f"no {kind} from the child in {timeout}s")


@pytest.mark.kernel
def test_bpf_source_works_after_capabilities_dropped(cpu1):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = _lines(proc, "ready")
        keep_mask = sum(1 << CAPS[n] for n in ready["keep"])
        assert ready["before"] & (1 << CAPS["CAP_BPF"]), "test needs to start privileged"
        assert ready["after"] == keep_mask
        assert ready["prm"] == keep_mask
        assert ready["bnd"] & ~keep_mask == 0  # bounding set shrunk too (we had CAP_SETPCAP)
        assert ready["nnp"] == "1"
        assert all(eff & ~keep_mask == 0 for eff in ready["tasks"].values()), ready["tasks"]
        assert ready["load_after_drop"] != "loaded"
        # The attached programs still deliver: a real offline/online of cpu1.
        cpu1.set_online(False)
        cpu1.set_online(True)
        seen = {_lines(proc, "transition")["direction"], _lines(proc, "transition")["direction"]}
        assert seen == {"offline", "online"}
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert _lines(proc, "done")["errors"] == []
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_what_is_kept_depends_on_the_kernel():
    assert needed_after_start(False, "6.18.0") == set()
    assert needed_after_start(True, "6.18.0") == set()
    assert needed_after_start(True, "6.1.0-28-amd64") == {"CAP_BPF"}
    assert needed_after_start(True, "5.4.0") == {"CAP_SYS_ADMIN"}
    assert kernel_version("garbage") == (0, 0)


def _task_caps(pid: int) -> dict[str, tuple[int, int]]:
    """{thread name/tid: (CapEff, CapPrm)} of every thread of a process."""
    from pathlib import Path
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = dict(line.split(":\t", 1) for line in (task / "status").read_text()
                      .splitlines() if ":\t" in line)
        out[f"{fields['Name'].strip()}/{task.name}"] = (int(fields["CapEff"], 16),
                                                        int(fields["CapPrm"], 16))
    return out


@pytest.mark.kernel
@pytest.mark.parametrize("traces", [False, True], ids=["journal-kube-bpf", "with-otlp-traces"])
def test_running_exporter_keeps_no_capability_after_start(tmp_path, traces):
    """A real `run` with the pieces that start threads (BPF, Kubernetes, journal, optionally
    OTLP traces): once serving, no thread holds more than needed_after_start() says."""
    from testkit.exporter_proc import RunningExporter
    from testkit.fakes.apiserver import FakeApiServer
    from testkit.fakes.otlp import HttpReceiver
    with FakeApiServer() as api, HttpReceiver() as rx:
        api.set_node("priv-node", cpu="2", memory="8Gi")
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        with RunningExporter("--kubeconfig", kubeconfig, "--node-name", "priv-node",
                             "--podresources-socket", str(tmp_path / "kubelet.sock"),
                             "--journal", str(tmp_path / "journal.db"), journal=True,
                             env={"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint} if traces
                             else {}) as exp:
            # Two sources, two threads: either can say it is up first.
            exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="kube_node") == 1
                         and s.value("node_resize_exporter_source_up", source="bpf") == 1,
                         timeout=30)
            keep = needed_after_start(True)
            keep_mask = sum(1 << CAPS[n] for n in keep)
            caps = _task_caps(exp.proc.pid)
            assert len(caps) > 1  # really a multi-threaded process
            assert {t: c for t, c in caps.items() if c[0] & ~keep_mask or c[1] & ~keep_mask} \
                == {}, caps
            assert "capabilities dropped after start-up" in exp.logs()
            assert "keep their capabilities" not in exp.logs()
