"""Faults the exporter must survive: the ones that need no Kubernetes pieces.

- BPF unavailable at start, three ways, made for the child process only so the machine (other
  tests need BPF) is untouched: tracefs unmounted and kernel headers hidden in a private mount
  namespace (`unshare -m`), capabilities taken away with `setpriv --bounding-set`. The exporter
  must fall back to uevent + sysfs, say why once, keep counting a real cpu1 flap, and `check`
  (run the same way) must say how to fix it.
- Wall-clock jump: no time namespace or faketime here, so exporter.clock is tested directly: the
  wall clock moving under a running MonotonicWallClock must not move its readings.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.clock import MonotonicWallClock
from testkit.exporter_proc import REPO, RunningExporter, poll_until

TRACEFS = Path("/sys/kernel/tracing")
_PRIVATE_MOUNTS = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
# Each way BPF can be unavailable, made for the child process only: (wrapper, what the exporter
# logs as the reason, what `check` says to do).
NO_BPF = {
    "tracefs-unmounted": (
        [*_PRIVATE_MOUNTS, "umount /sys/kernel/debug/tracing 2>/dev/null; umount "
         "/sys/kernel/debug 2>/dev/null; umount /sys/kernel/tracing && exec \"$@\"", "sh"],
        "tracefs is not mounted at /sys/kernel/tracing",
        "mount -t tracefs nodev /sys/kernel/tracing"),
    "headers-missing": (
        [*_PRIVATE_MOUNTS, "mount -t tmpfs none /lib/modules/$(uname -r) && exec \"$@\"", "sh"],
        "bcc needs kernel headers",
        "installs linux-headers-amd64"),
    "capability-missing": (
        # Root without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN: bcc's load is refused (EPERM).
        ["setpriv", "--bounding-set=-bpf,-perfmon,-sys_admin", "--inh-caps=-all"],
        "bcc could not compile or load bpf/",
        "add capabilities BPF and PERFMON"),
}


@pytest.mark.kernel
@pytest.mark.parametrize("fault", sorted(NO_BPF))
def test_bpf_unavailable_at_start_falls_back_and_says_why_once(cpu1, fault):
    wrapper, reason, fix = NO_BPF[fault]
    assert (TRACEFS / "events").exists(), "the machine's tracefs must be mounted for this test"
    with RunningExporter("--kubernetes", "off", wrapper=wrapper) as exp:
        # uevent says it is up from its own thread, which /healthz does not wait for.
        first = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                               source="uevent") == 1)
        assert first.value("node_resize_exporter_source_up", source="bpf") == 0
        before = first.value("node_resize_kernel_transitions_total", 0.0, resource="cpu",
                             direction="offline", result="success")
        cpu1.set_online(False)
        exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="offline") == 1
                     and s.value("node_resize_kernel_transitions_total", 0.0, resource="cpu",
                                 direction="offline", result="success") == before + 1)
        cpu1.set_online(True)
        exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="offline") == 0)
        logs = exp.logs()
    # Said with the fix once, and only at start-up: never again per event or per scrape.
    unavailable = [line for line in logs.splitlines() if "source bpf unavailable" in line]
    assert len(unavailable) == 1 and reason in unavailable[0] and "(fix: " in unavailable[0], \
        logs
    assert sum(reason in line for line in logs.splitlines()) == 1, logs
    started = logs.index("serving http://")
    assert reason not in logs[started:], logs[started:]
    # The machine's own tracefs and headers were never touched.
    assert (TRACEFS / "events").exists()
    check = subprocess.run([*wrapper, sys.executable, "-m", "exporter", "check"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 1, check.stdout + check.stderr
    assert fix in check.stdout, check.stdout
    assert "falls back to uevent and sysfs" in check.stdout


def test_wall_clock_jump_does_not_move_episode_times(monkeypatch):
    clock = MonotonicWallClock()
    readings = [clock.now()]
    real_time, real_time_ns = time.time, time.time_ns
    # An operator's `date -s` / an NTP step: one hour back, then two hours forward.
    for jump in (-3600.0, 7200.0):
        monkeypatch.setattr(time, "time", lambda j=jump: real_time() + j)
        monkeypatch.setattr(time, "time_ns", lambda j=jump: real_time_ns() + int(j * 1e9))
        time.sleep(0.01)
        readings.append(clock.now())
    monkeypatch.undo()
    readings.append(clock.now())
    assert readings == sorted(readings)
    # Still on the axis anchored at start: within the elapsed monotonic time of the real wall.
    assert abs(readings[-1] - time.time()) < 1.0
    # A kernel CLOCK_MONOTONIC stamp and now() agree (the one conversion every source uses).
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert clock.from_ktime_ns(mono) <= clock.now()


def test_a_clock_made_after_a_jump_is_on_the_new_axis_but_monotonic_within(monkeypatch):
    # A restarted exporter anchors on the wall clock of its start: spans and journal times of
    # one process never go backwards, whatever the wall clock does while it runs.
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - 3600 * 10**9)
    shifted = MonotonicWallClock()
    monkeypatch.undo()
    normal = MonotonicWallClock()
    assert 3599 < normal.now() - shifted.now() < 3601
    a, b = shifted.now(), shifted.now()
    assert a <= b


# ------------------------------------------------------------------ the API server misbehaving

NODE = "fault-test-node"


def _memtotal_ki() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise AssertionError("no MemTotal")


def _restart(api) -> None:
    """Stop and start the fake API server on the same port with its state kept."""
    api.stop()
    time.sleep(0.2)
    api.start()


@pytest.fixture
def api():
    from testkit.exporter_proc import free_port
    from testkit.fakes.apiserver import FakeApiServer
    server = FakeApiServer(port=free_port())  # fixed: a restart must come back on it
    server.set_node(NODE, cpu="2", memory=f"{_memtotal_ki()}Ki")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _kube_exporter(api, tmp_path, *extra: str):
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    return RunningExporter("--kubeconfig", kubeconfig, "--node-name", NODE, "--source", "bpf",
                           "--podresources-socket", "/nonexistent/kubelet.sock",
                           "--readmission-settle", "1", *extra)  # a later flag wins


def _unplug_and_wait_open(exp, cpu1):
    exp.wait_for(
        lambda s: s.value("node_resize_kubelet_capacity", resource="cpu", unit="core") == 2,
        timeout=30,
    )
    cpu1.set_online(False)
    exp.wait_for(
        lambda s: (
            s.value("node_resize_exporter_episodes_open") == 1
            and s.value("node_resize_capacity_drift", resource="cpu", unit="core") == -1
        ),
        timeout=30,
    )


def _resync_and_check_counted_once(exp, api):
    api.update_node(NODE, cpu="1", allocatable_cpu="1")
    s = exp.wait_for(
        lambda s: (
            s.value(
                "node_resize_resync_duration_seconds_count",
                resource="cpu",
                direction="decrease",
                resynced_by="unknown",  # no kubelet watched here
            )
            == 1
            and s.value("node_resize_exporter_episodes_open") == 0
        ),
        timeout=60,
    )
    assert s.value("node_hot_unplug_request_total", resource="cpu") == 1
    assert s.value("node_resize_capacity_drift", resource="cpu", unit="core") == 0
    for reason in ("kernel_failed", "resync_timeout", "mismatch", "readmission_rejected"):
        assert s.value("node_hot_unplug_errors_total", 0.0, resource="cpu", reason=reason) == 0
    return s


@pytest.mark.kernel
def test_api_server_restarted_10_times_during_an_open_episode(cpu1, api, tmp_path):
    with _kube_exporter(api, tmp_path) as exp:
        _unplug_and_wait_open(exp, cpu1)
        for _ in range(10):
            watches = len(api.requests_for("nodes", watch=True))
            _restart(api)
            # The exporter came back by itself: a new Node watch reached the new server.
            exp.wait_for(
                lambda s: len(api.requests_for("nodes", watch=True)) > watches,
                timeout=60,
                interval=0.2,
            )
        s = exp.scrape()
        assert s.value("node_resize_exporter_episodes_open") == 1  # still waiting, not lost
        _resync_and_check_counted_once(exp, api)
        cpu1.set_online(True)


@pytest.mark.kernel
def test_watch_expired_410_in_the_middle_of_an_episode(cpu1, api, tmp_path):
    with _kube_exporter(api, tmp_path) as exp:
        _unplug_and_wait_open(exp, cpu1)
        lists_before = len(api.requests_for("nodes", watch=False))
        api.compact()  # open watches get 410 Gone: the exporter must relist
        exp.wait_for(
            lambda s: len(api.requests_for("nodes", watch=False)) > lists_before, timeout=30
        )
        assert exp.scrape().value("node_resize_exporter_episodes_open") == 1
        _resync_and_check_counted_once(exp, api)
        cpu1.set_online(True)


@pytest.mark.kernel
def test_slow_api_still_resyncs_once(cpu1, api, tmp_path):
    with _kube_exporter(api, tmp_path) as exp:
        _unplug_and_wait_open(exp, cpu1)
        api.set_delay(2.0)  # every response from now on is 2 s late
        api.drop_watches()  # so the reconnect (list + watch) meets the delay
        s = _resync_and_check_counted_once(exp, api)
        assert (
            s.value(
                "node_resize_resync_duration_seconds_sum",
                resource="cpu",
                direction="decrease",
                resynced_by="unknown",  # no kubelet watched here
            )
            >= 0
        )
        api.set_delay(0.0)
        cpu1.set_online(True)


@pytest.mark.kernel
def test_api_restarts_while_readmission_settles_count_each_pod_once(cpu1, api, tmp_path):
    """Pods rejected after the unplug are judged once, however often the API server restarts
    (each restart is a relist of every pod) while readmission is settling."""
    api.put_pod("web-0", node=NODE, requests={"cpu": "500m"})
    api.put_pod("web-1", node=NODE, requests={"cpu": "500m"})
    with _kube_exporter(api, tmp_path, "--readmission-settle", "4") as exp:
        _unplug_and_wait_open(exp, cpu1)
        api.update_node(NODE, cpu="1", allocatable_cpu="1")
        exp.wait_for(
            lambda s: (
                s.value(
                    "node_resize_resync_duration_seconds_count",
                    resource="cpu",
                    direction="decrease",
                    resynced_by="unknown",  # no kubelet watched here
                )
                == 1
            )
        )
        api.put_pod(
            "web-1",
            node=NODE,
            requests={"cpu": "500m"},
            phase="Failed",
            reason="OutOfcpu",
            ready=False,
        )
        for _ in range(3):
            _restart(api)
            time.sleep(0.3)
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_episodes_open") == 0, timeout=30)
        pods = s.series("node_resize_readmission_pods_total")
        assert pods == {
            frozenset({("outcome", "rejected"), ("reason", "OutOfcpu")}): 1,
            frozenset({("outcome", "kept"), ("reason", "Running")}): 1,
        }, pods
        assert (
            s.value("node_hot_unplug_errors_total", resource="cpu", reason="readmission_rejected")
            == 1
        )
        assert s.value("node_resize_readmission_duration_seconds_count", resource="cpu") == 1
        cpu1.set_online(True)


# ------------------------------------------------------------------ ring buffer overflow


@pytest.mark.kernel
def test_ring_buffer_overflow_is_counted_and_gauges_end_right(cpu1):
    import signal

    # One page holds ~60 records. The consumer is frozen (SIGSTOP) while cpu1 flaps 60 times
    # (120 records), so the kernel must fail reservations; the BPF side counts them.
    with RunningExporter(
        "--source", "bpf", "--ringbuf-pages", "1", "--kubernetes", "off", "--sysfs-interval", "1"
    ) as exp:
        # Up is said from the BPF source's thread, which /healthz does not wait for.
        before = exp.wait_for(
            lambda s: s.value("node_resize_exporter_source_up", source="bpf") == 1
        )
        exp.proc.send_signal(signal.SIGSTOP)
        try:
            for _ in range(60):
                cpu1.set_online(False)
                cpu1.set_online(True)
        finally:
            exp.proc.send_signal(signal.SIGCONT)

        def offlines(s) -> float:
            return s.value(
                "node_resize_kernel_transitions_total",
                0.0,
                resource="cpu",
                direction="offline",
                result="success",
            ) - before.value(
                "node_resize_kernel_transitions_total",
                0.0,
                resource="cpu",
                direction="offline",
                result="success",
            )

        # The stop/continue interrupts the ring buffer's epoll_wait (EINTR), so the lost count
        # can be reported one poll before the records that did fit: wait for both.
        s = exp.wait_for(
            lambda s: (
                s.value("node_resize_exporter_events_lost_total", 0.0, source="bpf") > 0
                and offlines(s) > 0
            ),
            timeout=30,
        )
        lost = s.value("node_resize_exporter_events_lost_total", source="bpf")
        assert offlines(s) < 60 and lost > 0, (offlines(s), lost)
        # The reconciler puts every gauge right whatever was lost.
        s = exp.wait_for(
            lambda s: (
                s.value("node_resize_kernel_cpus", state="online") == 2
                and s.value("node_resize_kernel_cpus", state="offline") == 0
            )
        )
        assert s.value("node_resize_kernel_capacity", resource="cpu", unit="core") == 2
        # And it still follows new transitions.
        cpu1.set_online(False)
        exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="offline") == 1)
        cpu1.set_online(True)


# ------------------------------------------------------------------ SIGTERM mid-episode


def _journal_episodes(path: Path):
    from exporter.sinks.journal.reader import JournalReader

    j = JournalReader(path)
    try:
        return j.episodes(), {ep.id: j.is_exported(ep.id) for ep in j.episodes()}
    finally:
        j.close()


def _past_the_window(s, window: float = 0.3, margin: float = 2.0) -> None:
    """Until the coalescing window has passed since the last kernel event as the exporter
    stamped it (arrival for a uevent: late on a loaded machine), with a margin for a duplicate
    stamped later still."""
    stamped = max(s.value("node_resize_exporter_source_last_event_timestamp_seconds", 0.0,
                          source=name) for name in ("bpf", "uevent"))
    poll_until(time.time, lambda now: now > stamped + window + margin, 60, 0.05,
               lambda now: AssertionError(f"{now} vs {stamped}"))


@pytest.mark.kernel
def test_sigterm_mid_episode_flushes_journal_and_spans(cpu1, api, tmp_path):
    from exporter.correlate.model import Change
    from testkit.fakes.otlp import HttpReceiver

    journal = tmp_path / "journal.db"
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    with HttpReceiver() as rx:

        def start() -> RunningExporter:
            return RunningExporter(
                "--kubeconfig",
                kubeconfig,
                "--node-name",
                NODE,
                "--journal",
                str(journal),
                "--podresources-socket",
                "/nonexistent/kubelet.sock",
                "--coalesce-window",
                "0.3",
                "--readmission-settle",
                "1",
                journal=True,
                # Spans leave only when flushed: a batch delay far longer than this test.
                env={
                    "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                    "OTEL_BSP_SCHEDULE_DELAY": "600000",
                },
            ).start()

        exp = start()
        try:
            exp.wait_for(
                lambda s: s.value("node_resize_kubelet_capacity", resource="cpu", unit="core") == 2,
                timeout=30,
            )
            # Two episodes that end (unplug superseded by the plug, the plug converged at once:
            # the Node already says 2), then one left open waiting for a resync.
            cpu1.set_online(False)
            s = exp.wait_for(lambda s: s.value("node_resize_exporter_episodes_open") == 1)
            # Past the coalescing window (else the plug joins it as a flap): a fixed 0.5 s after
            # the write was crossed on a loaded machine, where the offline arrived late, and the
            # next offline, right after the plug's episode ended, joined a late duplicate of the
            # plug as a flap (the fixed wait: 2 of 4 runs failed on the shared test machine;
            # this: 6 of 6 passed).
            _past_the_window(s)
            cpu1.set_online(True)
            s = exp.wait_for(lambda s: s.value("node_resize_exporter_episodes_open") == 0)
            _past_the_window(s)  # the same for the plug: a late duplicate of it is no flap
            cpu1.set_online(False)
            exp.wait_for(lambda s: s.value("node_resize_exporter_episodes_open") == 1)
            assert rx.received.spans == []  # nothing exported yet: all still batched
            assert exp.stop() == 0  # SIGTERM
        finally:
            exp.stop()
            exp.tmp.cleanup()
        episodes, exported = _journal_episodes(journal)
        ended = [ep for ep in episodes if ep.ended is not None]
        still_open = [ep for ep in episodes if ep.ended is None]
        assert len(ended) == 2 and len(still_open) == 1, episodes
        assert still_open[0].change is Change.DECREASE and still_open[0].transitions
        # Spans of the ended episodes were flushed at SIGTERM, and the journal knows it.
        spans = rx.received.wait_spans(2)
        roots = {
            s.attributes.get("node_resize.episode.id") for s in spans if s.parent_span_id == b""
        }
        assert roots == {ep.id for ep in ended}
        assert all(exported[ep.id] for ep in ended) and not exported[still_open[0].id]
        # The open one is resumed by the next start.
        again = start()
        try:
            assert "resumed 1 open episode" in again.logs()
        finally:
            again.stop()
            again.tmp.cleanup()
        cpu1.set_online(True)


@pytest.mark.kernel
def test_podresources_missing_then_garbage_then_answering_through_a_running_run(
    cpu1, api, tmp_path
):
    """The kubelet's podresources socket is missing at start, then answers garbage, then the
    real proto: counted and skipped, never fatal; then the KEP-2403 case this metric exists
    for: the kubelet keeps offering a CPU the kernel has taken offline."""
    from concurrent import futures

    import grpc

    from exporter.sources.kubelet.proto import podresources_pb2 as pb

    sock = str(tmp_path / "kubelet.sock")
    answer = {"garbage": True}

    def allocatable(request, context):
        if answer["garbage"]:
            return b"\x0f\xff\xff not a protobuf"
        return pb.AllocatableResourcesResponse(cpu_ids=[0, 1]).SerializeToString()

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                allocatable, request_deserializer=None, response_serializer=None
            )
        },
    )
    with RunningExporter(
        "--kubeconfig",
        api.kubeconfig_path,
        "--node-name",
        NODE,
        "--podresources-socket",
        sock,
        "--podresources-interval",
        "0.3",
    ) as exp:
        exp.wait_for(
            lambda s: s.value("node_resize_exporter_source_up", source="podresources") == 0
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        assert server.add_insecure_port(f"unix://{sock}") == 1
        server.start()
        try:
            s = exp.wait_for(
                lambda s: (
                    s.value("node_resize_exporter_malformed_total", 0, source="podresources") >= 1
                )
            )
            assert s.value("node_resize_podresources_allocatable_cpus") is None  # nothing made up
            answer["garbage"] = False
            s = exp.wait_for(
                lambda s: (
                    s.value("node_resize_podresources_allocatable_cpus") == 2
                    and s.value("node_resize_exporter_source_up", source="podresources") == 1
                )
            )
            assert s.value("node_resize_podresources_offline_cpus") == 0
            cpu1.set_online(False)
            exp.wait_for(lambda s: s.value("node_resize_podresources_offline_cpus") == 1)
        finally:
            server.stop(None).wait()
