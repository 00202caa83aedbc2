"""The Kubernetes join end to end on the real kernel: a running exporter, a local API server
that speaks the real list/watch protocol, and cpu1 hot-unplugged and plugged back."""
import time

import pytest

from testkit.exporter_proc import RunningExporter, free_port
from testkit.fakes.apiserver import FakeApiServer, serving_node
from testkit.fakes.kubelet_metrics import Hostile

pytestmark = pytest.mark.kernel
NODE = "resize-test-node"
DELAY = 1.5  # how long the "kubelet" takes to resync in this test


def memtotal_ki() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise AssertionError("no MemTotal")


@pytest.fixture
def api(tmp_path):
    with serving_node(str(tmp_path), NODE, memory=f"{memtotal_ki()}Ki") as server:
        yield server


def kube_exporter(api, *extra):
    return RunningExporter("--kubeconfig", api.kubeconfig, "--node-name", NODE,
                           "--podresources-socket", "/nonexistent/kubelet.sock",
                           "--readmission-settle", "1", *extra)


def drift(s, resource="cpu", unit="core"):
    return s.value("node_resize_capacity_drift", resource=resource, unit=unit)


@pytest.fixture
def kubelet_metrics():
    """The kubelet's /metrics, as far as the exporter reads them: a kubelet started an hour
    ago, watched through --kubelet-metrics-url (this host runs no kubelet process)."""
    started = time.time() - 3600
    body = f"process_start_time_seconds {started:.2f}\n".encode()
    server = Hostile(lambda h: (h.send_response(200),
                                h.send_header("Content-Length", str(len(body))),
                                h.end_headers(), h.wfile.write(body)))
    yield server
    server.stop()


def test_unplug_then_plug_resynced_by_the_kubelet(cpu1, api, kubelet_metrics):
    with kube_exporter(api, "--kubelet-metrics-url", kubelet_metrics.url) as exp:
        # The Node (its watch) and the kernel's snapshot (sysfs) come from two threads.
        s = exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                           unit="core") == 2 and drift(s) is not None)
        assert drift(s) == 0
        assert s.value("node_resize_exporter_source_up", source="kube_node") == 1
        # No kubelet process visible here: that source says so; the metrics watch the kubelet.
        s = exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                           source="kubelet_metrics") == 1)
        assert s.value("node_resize_exporter_source_up", source="kubelet_process") == 0

        # Hot-unplug: the kernel drops to 1 CPU, the Node still says 2.
        unplugged = time.monotonic()
        cpu1.set_online(False)
        # Drift shows while the Node still says 2, before anything resyncs it ("at once").
        s = exp.wait_for(lambda s: drift(s) == -1, timeout=30)
        assert s.value("node_hot_unplug_request_total", resource="cpu") == 1
        assert s.value("node_resize_exporter_episodes_open") == 1
        time.sleep(DELAY)
        api.update_node(NODE, cpu="1", allocatable_cpu="1")
        # The kubelet watched did not restart: the (test) API server's update is a live resync.
        s = exp.wait_for(lambda s: s.value("node_resize_resync_duration_seconds_count",
                                           resource="cpu", direction="decrease",
                                           resynced_by="kubelet_live") == 1)
        took = s.value("node_resize_resync_duration_seconds_sum", resource="cpu",
                       direction="decrease", resynced_by="kubelet_live")
        # From the kernel's transition to the Node's update: no less than the delay, and no
        # more than the test itself saw pass from before the write to this scrape.
        assert DELAY <= took <= time.monotonic() - unplugged, took
        assert drift(s) == 0
        s = exp.wait_for(lambda s: s.value("node_resize_readmission_duration_seconds_count",
                                           resource="cpu") == 1, timeout=10)
        assert s.value("node_resize_exporter_episodes_open") == 0
        assert s.value("node_hot_unplug_errors_total", 0, resource="cpu",
                       reason="resync_timeout") == 0

        # Hot-plug: back to 2.
        plugged = time.monotonic()
        cpu1.set_online(True)
        s = exp.wait_for(lambda s: drift(s) == 1, timeout=30)
        assert s.value("node_resize_resync_request_total", resource="cpu") == 1
        time.sleep(DELAY)
        api.update_node(NODE, cpu="2", allocatable_cpu="2")
        s = exp.wait_for(lambda s: s.value("node_resize_resync_duration_seconds_count",
                                           resource="cpu", direction="increase",
                                           resynced_by="kubelet_live") == 1)
        took = s.value("node_resize_resync_duration_seconds_sum", resource="cpu",
                       direction="increase", resynced_by="kubelet_live")
        assert DELAY <= took <= time.monotonic() - plugged, took
        assert drift(s) == 0 and s.value("node_resize_exporter_episodes_open") == 0


def test_kubelet_that_never_resyncs_times_out_and_drift_stays(cpu1, api):
    with kube_exporter(api, "--resync-deadline", "2") as exp:
        exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                       unit="core") == 2)
        cpu1.set_online(False)
        # The timeout is the correlator's timer; the drift needs the reconciler's read (its
        # own thread) after the unplug: wait for both.
        s = exp.wait_for(lambda s: s.value("node_hot_unplug_errors_total", resource="cpu",
                                           reason="resync_timeout") == 1 and drift(s) == -1,
                         timeout=30)
        first = s.value("node_resize_capacity_drift_seconds", resource="cpu")
        time.sleep(1.0)
        s = exp.scrape()
        assert s.value("node_resize_capacity_drift_seconds", resource="cpu") >= first + 0.9
        assert s.value("node_resize_exporter_episodes_open") == 0


def test_api_unreachable_at_start_then_recovers_without_restart(cpu1, tmp_path):
    server = FakeApiServer(port=free_port())  # the port is known before anyone listens on it
    server.set_node(NODE, cpu="2", memory=f"{memtotal_ki()}Ki")
    kubeconfig = server.write_kubeconfig(str(tmp_path / "kubeconfig"))  # port reserved, closed
    with RunningExporter("--kubeconfig", kubeconfig, "--node-name", NODE,
                         "--podresources-socket", "/nonexistent/kubelet.sock") as exp:
        exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                       source="kube_node") == 0, timeout=15)
        # The kernel side keeps working meanwhile.
        cpu1.set_online(False)
        exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="online") == 1)
        cpu1.set_online(True)
        server.start()
        try:
            exp.wait_for(lambda s: s.value("node_resize_exporter_source_up",
                                               source="kube_node") == 1
                             and s.value("node_resize_kubelet_capacity", resource="cpu",
                                         unit="core") == 2, timeout=60)  # backoff <= 30 s
        finally:
            server.stop()
