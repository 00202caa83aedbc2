"""Hostile and broken inputs, each against a real running exporter (`run` as a child
process) where the issue found it that way; the API server is testkit/fakes/apiserver.py speaking
the real list/watch protocol on loopback."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from testkit.exporter_proc import REPO, RunningExporter, free_port
from testkit.fakes.apiserver import FakeApiServer

NODE = "hostile-test-node"


@pytest.fixture
def api():
    server = FakeApiServer(port=free_port())
    server.set_node(NODE, cpu="2", memory="8Gi")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _exporter(api, *extra: str) -> RunningExporter:
    return RunningExporter("--kubeconfig", api.kubeconfig_path, "--node-name", NODE,
                           "--source", "sysfs", "--podresources-socket",
                           "/nonexistent/kubelet.sock", *extra)


def test_silent_api_server_from_start_up_is_source_up_0_then_1(api):
    """Item 1: an API server that accepts connections and never answers. Every source has its
    source_up series from the first scrape, and the Kubernetes ones stay 0 (never 1) until the
    server speaks; then they come up without a restart."""
    api.set_silent(True)
    with _exporter(api) as exp:
        first = exp.scrape()
        sources = {dict(k)["source"] for k in first.series("node_resize_exporter_source_up")}
        assert {"sysfs", "kube_node", "kube_pods", "podresources"} <= sources
        assert first.value("node_resize_exporter_source_up", source="kube_node") == 0
        # The list is not answered within its 10 s request timeout: down, said once, with why.
        exp.wait_for(lambda s: "did not answer the nodes list within 10 s" in exp.logs(),
                     timeout=40)
        s = exp.scrape()
        assert s.value("node_resize_exporter_source_up", source="kube_node") == 0
        assert s.value("node_resize_exporter_source_up", source="kube_pods") == 0
        # Staleness: kube_node last said something when it went down; sysfs is newer.
        stamp = "node_resize_exporter_source_last_event_timestamp_seconds"
        assert {dict(k)["source"] for k in s.series(stamp)} >= sources
        assert 0 < s.value(stamp, source="kube_node") <= time.time()
        api.set_silent(False)
        # Each watch comes back on its own backoff (up to 30 s): wait for both.
        exp.wait_for(lambda s: s.value("node_resize_exporter_source_up", source="kube_node") == 1
                     and s.value("node_resize_exporter_source_up", source="kube_pods") == 1
                     and s.value("node_resize_kubelet_capacity", resource="cpu", unit="core") == 2,
                     timeout=60)


def _run_exit(*args: str) -> subprocess.CompletedProcess:
    """`run` that must refuse to start: its exit status and what it said."""
    return subprocess.run([sys.executable, "-m", "exporter", "run", "--web.listen-address",
                           f"127.0.0.1:{free_port()}", "--kubernetes", "off", "--source",
                           "sysfs", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_journal_path_that_is_a_symlink_exits_2_and_leaves_the_target(tmp_path):
    """Item 3: as root, a journal link to another file chmodded that file 0600 and made it a
    database; now `run` refuses with exit 2 and the reason."""
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    target.chmod(0o644)
    link = tmp_path / "journal.db"
    link.symlink_to(target)
    done = _run_exit("--journal", str(link))
    assert done.returncode == 2, done.stderr
    assert "is a symbolic link" in done.stderr and "Fix: remove the link" in done.stderr
    assert target.read_text() == "keep me\n" and target.stat().st_mode & 0o777 == 0o644
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "created-by-nobody")
    assert _run_exit("--journal", str(dangling)).returncode == 2
    assert not (tmp_path / "created-by-nobody").exists()


def test_journal_in_a_directory_writable_by_others_exits_2(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    done = _run_exit("--journal", str(loose / "journal.db"))
    assert done.returncode == 2, done.stderr
    assert "writable by others" in done.stderr and "chmod 0700" in done.stderr


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "check", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _journal_line(done: subprocess.CompletedProcess) -> str:
    return next(line for line in done.stdout.splitlines()
                if line.startswith(("OK   journal", "FAIL journal")))


def test_journal_of_a_future_schema_is_left_alone_and_run_goes_on(tmp_path):
    """Item 12 and rollback safety: a newer exporter's journal is not relabelled, and the older
    binary does not exit 2 over it (the journal is a hostPath: a rolled-back DaemonSet would
    crash-loop on every node). `run` serves with the journal sink down; `check` says what to do."""
    from exporter.sinks.journal.schema import SCHEMA_VERSION
    path = tmp_path / "journal.db"
    newer = SCHEMA_VERSION + 1
    with sqlite3.connect(path) as c:
        c.execute(f"PRAGMA user_version={newer}")
        c.execute("CREATE TABLE t(x)")
    before = path.read_bytes()
    line = _journal_line(_check("--journal", str(path)))
    assert line.startswith("FAIL journal") and f"schema {newer}, newer" in line, line
    done = _check("--journal", str(path))
    assert f"mv {path} {path}.newer" in done.stdout and "roll forward" in done.stdout
    with RunningExporter("--kubernetes", "off", "--source", "sysfs", "--journal",
                         str(path)) as exp:
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_sink_up", sink="journal") == 0
                         and s.value("node_resize_exporter_source_up", source="sysfs") == 1)
        assert s.value("node_resize_kernel_cpus", state="online") >= 1
        assert exp.logs().count("journal sink down") == 1
        assert f"schema version {newer}, newer" in exp.logs()
    assert exp.proc.returncode == 0
    assert path.read_bytes() == before
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == newer


@pytest.mark.parametrize("where", ["/proc/nope/j.db", "/sys/j.db"])
def test_a_journal_path_that_cannot_be_created_fails_check_and_run(where):
    """`check --journal /proc/nope/j.db` said OK (root passes access() there) and `run` went on
    with every write failing. Both now try, and fail with the fix."""
    line = _journal_line(_check("--journal", where))
    assert line.startswith("FAIL journal") and "cannot create" in line, line
    done = _run_exit("--journal", where)
    assert done.returncode == 2, done.stderr
    assert "cannot create" in done.stderr and "--no-journal" in done.stderr


def _peak_rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_64_mib_watch_line_does_not_grow_the_heap(api):
    """Item 7: a watch line without a newline was held whole (512 MiB -> RSS +514 MiB). Now
    it is refused at MAX_LINE_BYTES: the peak RSS grows by far less than the line."""
    from exporter.kube.client import MAX_LINE_BYTES
    with _exporter(api) as exp:
        exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                       unit="core") == 2, timeout=30)
        api.wait_for_watches(1, "nodes")
        before = _peak_rss_mib(exp.proc.pid)
        piece = b"x" * 2**20
        for _ in range(64):
            streams = api.send_raw(piece)  # into every open watch: nodes, pods, leases, ...
        exp.wait_for(lambda s: f"watch event line longer than {MAX_LINE_BYTES} bytes"
                     in exp.logs(), timeout=60)
        api.update_node(NODE, cpu="3")
        exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                       unit="core") == 3, timeout=60)  # relisted, working
        grown = _peak_rss_mib(exp.proc.pid) - before
        # Bounded by the line limit, not by what was sent (64 MiB into each stream): at most
        # two MAX_LINE_BYTES of a line in flight per stream (raw chunks and the join); seen:
        # 10.6-11.4 MiB a stream (34 MiB with 3 streams, 42-44 MiB with 4 since budgets).
        bound = streams * 2 * MAX_LINE_BYTES / 2**20
        assert grown < bound < streams * 64, \
            f"peak RSS grew {grown:.0f} MiB for a 64 MiB line in each of {streams} streams"


def test_a_trickling_kubelet_metrics_is_source_up_0_not_a_wedge(api):
    """Item 4: a /metrics trickled one byte at a time wedged the source with no source_up."""
    import threading

    from testkit.fakes.kubelet_metrics import Hostile
    stop = threading.Event()

    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Length", "1000000")
        h.end_headers()
        while not stop.is_set():
            h.wfile.write(b"#")
            h.wfile.flush()
            stop.wait(0.2)

    kubelet = Hostile(trickle)
    try:
        with _exporter(api, "--kubelet-metrics-url", kubelet.url) as exp:
            first = exp.scrape()
            assert first.value("node_resize_exporter_source_up", source="kubelet_metrics") == 0
            exp.wait_for(lambda s: "answer not complete after 5 s" in exp.logs(), timeout=40)
            s = exp.scrape()
            assert s.value("node_resize_exporter_source_up", source="kubelet_metrics") == 0
    finally:
        stop.set()
        kubelet.stop()


def test_a_hostile_podresources_answer_is_not_amplified(api, tmp_path):
    """Item 5: 100k negative CPU ids in every answer made 272,033 events in 20 s. Now the same
    bad answer, polled again and again, is one malformed input, and the gauge counts only CPU
    ids the kernel can have."""
    from exporter.sources.kernel.sysfs import parse_cpu_list
    from exporter.sources.kubelet.proto import podresources_pb2 as pb
    from testkit.event_log import wait_until
    from testkit.fakes.podresources import Kubelet, Server

    possible = parse_cpu_list(open("/sys/devices/system/cpu/possible").read())
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(
        cpu_ids=sorted(possible) + list(range(-100_000, 0)) + [len(possible) + 5])
    sock = str(tmp_path / "kubelet.sock")
    server = Server(sock, servicer=kubelet)
    try:
        with RunningExporter("--kubeconfig", api.kubeconfig_path, "--node-name", NODE,
                             "--source", "sysfs", "--podresources-socket", sock,
                             "--podresources-interval", "0.2") as exp:
            exp.wait_for(lambda s: s.value("node_resize_podresources_allocatable_cpus")
                         == len(possible), timeout=30)
            calls = kubelet.calls
            wait_until(lambda: kubelet.calls >= calls + 10, "ten more polls", bound=60)
            s = exp.scrape()
            assert s.value("node_resize_exporter_malformed_total", source="podresources") == 1
            assert s.value("node_resize_podresources_allocatable_cpus") == len(possible)
            assert s.value("node_resize_exporter_source_up", source="podresources") == 1
    finally:
        server.stop()


@pytest.mark.kernel
def test_forged_uevents_are_not_counted_by_a_running_exporter(cpu1):
    """Item 9: 100 forged `offline@/devices/system/cpu/cpu1` were counted while cpu1 stayed
    online. From user space (port id != 0) they are malformed input now, never transitions."""
    from testkit.uevent import send_forged
    with RunningExporter("--source", "uevent", "--kubernetes", "off") as exp:
        exp.wait_for(lambda s: s.value("node_resize_exporter_source_up", source="uevent") == 1)
        send_forged(100)
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_malformed_total",
                                           source="uevent") == 100)
        assert s.value("node_resize_kernel_transitions_total", resource="cpu", direction="offline",
                       result="success") == 0
        assert s.value("node_resize_kernel_cpus", state="online") == s.value(
            "node_resize_kernel_cpus", state="present"
        )


@pytest.mark.kernel
def test_sigkill_then_restart_counts_changes_while_down_and_no_request_twice(cpu1, api, tmp_path):
    """Item 14: over a SIGKILL and a restart, a resumed episode's request was counted again
    (51 requests for 50 unplugs), and what the kernel did meanwhile was lost. Now the new
    process counts the cpu1 online made while it was down, and not the resumed request."""
    journal = str(tmp_path / "journal.db")
    args = ("--source", "uevent", "--journal", journal, "--coalesce-window", "60")
    first = _exporter(api, *args).start()
    try:
        cpu1.set_online(False)
        first.wait_for(
            lambda s: (
                s.value("node_hot_unplug_request_total", resource="cpu") == 1
                and s.value("node_resize_exporter_episodes_open") == 1
            ),
            timeout=30,
        )
        first.proc.kill()  # SIGKILL: no flush, no close
        first.proc.wait(10)
    finally:
        first.stop()
        first.tmp.cleanup()
    cpu1.set_online(True)  # while no exporter runs
    with _exporter(api, *args) as second:
        s = second.wait_for(
            lambda s: s.value("node_resize_exporter_episodes_open") == 1, timeout=30
        )
        assert "resumed 1 open episode" in second.logs()
        assert s.value("node_hot_unplug_request_total", resource="cpu") == 0
        assert (
            s.value("node_resize_exporter_down_changes_total", resource="cpu", direction="online")
            == 1
        )
        # Only what changed has a series.
        assert (
            s.value("node_resize_exporter_down_changes_total", resource="cpu", direction="offline")
            is None
        )
        assert "while the exporter was down: 1 cpu online" in second.logs()


def _corrupt_journal(path) -> None:
    """A real journal whose pages are then overwritten in the middle (a bad disk, a bad copy)."""
    from exporter.events import EventsLost
    from exporter.sinks.journal.sink import JournalSink

    j = JournalSink(path)
    for i in range(200):
        j.on_event(EventsLost("bpf", i + 1, 1000.0 + i))
    j.close()
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\xde\xad\xbe\xef" * 2048)


def test_a_corrupt_journal_is_reported_by_check_and_counted_by_run(api, tmp_path):
    """Item 15: a corrupt journal turned journaling off with one warning and a counter. `check`
    now says so with the fix, and `run` counts it in sink_errors_total{sink="journal"} (the
    series an alert watches) while /metrics keeps serving."""
    path = tmp_path / "journal.db"
    _corrupt_journal(path)
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "check", "--journal", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(
        l for l in done.stdout.splitlines() if l.startswith(("OK   journal", "FAIL journal"))
    )
    assert line.startswith("FAIL journal") and "is corrupt" in line, done.stdout
    assert f"mv {path} {path}.corrupt" in done.stdout
    with _exporter(api, "--journal", str(path)) as exp:
        # The journal's error and sysfs's up come from two threads, in either order.
        exp.wait_for(
            lambda s: (
                s.value("node_resize_exporter_sink_errors_total", sink="journal", default=0) > 0
                and s.value("node_resize_exporter_source_up", source="sysfs") == 1
            ),
            timeout=30,
        )


def test_sigterm_with_a_collector_that_never_answers_exits_within_the_grace_period(cpu1):
    """Second round: with OTEL_EXPORTER_OTLP_TIMEOUT=30 and a collector that accepts and never
    answers, SIGTERM took 57 s (past Kubernetes' 30 s grace period). The trace sink's close is
    bounded now: exit 0 by itself well within 30 s, the trace not sent counted."""
    import socket
    import threading

    from testkit.exporter_proc import terminate

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    exp = RunningExporter("--podresources-socket", "", "--kubernetes", "off",
                          "--coalesce-window", "0.3", env={
                              "OTEL_EXPORTER_OTLP_ENDPOINT":
                                  f"http://127.0.0.1:{listener.getsockname()[1]}",
                              "OTEL_EXPORTER_OTLP_TIMEOUT": "30",
                              "OTEL_BSP_SCHEDULE_DELAY": "600000"})
    try:
        exp.start()
        cpu1.set_online(False)
        cpu1.set_online(True)
        exp.wait_for(lambda s: s.total("node_hot_unplug_request_total") >= 1
                     and s.value("node_resize_exporter_episodes_open") == 0)
        started = time.monotonic()
        code = terminate(exp.proc, timeout=25)  # SIGKILL past 25 s: the grace period's margin
        took = time.monotonic() - started
        exp.log.close()
        assert code == 0, f"not stopped by itself (code {code}) in {took:.1f} s:\n{exp.logs()}"
        assert "did not take the last traces" in exp.logs()
        print(f"SIGTERM to exit with a silent collector: {took:.1f} s")
    finally:
        exp.stop()
        exp.tmp.cleanup()
        listener.close()
        for conn in held:
            conn.close()
