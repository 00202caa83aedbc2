"""Load: 50 concurrent scrapers during a cpu1 flap storm and a burst of Pod
watch events, three storms in a row: zero failed scrapes, zero lost episodes, memory flat.

Each storm lasts 60 s under CI=true; NRE_LOAD_SECONDS shortens it for a local run (default 10).
Nothing here is timed: the counts must come out exact, whatever the machine's speed; only the
exporter's resident memory is compared across storms, with a bound for allocator noise.
"""
from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest

from testkit.clients import ClientThreads
from testkit.exporter_proc import RunningExporter, free_port
from testkit.fakes.apiserver import FakeApiServer

pytestmark = pytest.mark.kernel
NODE = "load-test-node"
SCRAPERS = 50
STORMS = 3
STORM_SECONDS = 60.0 if os.environ.get("CI") == "true" else float(
    os.environ.get("NRE_LOAD_SECONDS", "10"))
PODS = 100  # balloon pods created then deleted per storm
RSS_GROWTH_BOUND = 16 * 2**20  # storm 3 vs storm 1; a leak of one object per event or scrape
#                                would be far beyond this (thousands of each per storm)


def _memtotal_ki() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise AssertionError("no MemTotal")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Scrapers(ClientThreads):
    """SCRAPERS threads scraping /metrics back to back, each on a new connection."""

    join_timeout = 60.0

    def __init__(self, url: str):
        self.url = url + "/metrics"
        self.ok = 0
        self.failed: list[str] = []
        super().__init__(SCRAPERS, lambda i: self._run())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=30) as r:
                    body = r.read()
                    good = r.status == 200 and b"node_resize_kernel_cpus" in body
            except OSError as e:
                good, body = False, repr(e).encode()
            with self._lock:
                if good:
                    self.ok += 1
                else:
                    self.failed.append(body[:200].decode(errors="replace"))


def test_fifty_scrapers_through_three_storms(cpu1, tmp_path):
    with FakeApiServer(port=free_port()) as api:
        api.set_node(NODE, cpu="2", memory=f"{_memtotal_ki()}Ki")
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        # A tiny coalescing window: every transition of the storm is its own episode, so the
        # episode counts below are exact.
        with RunningExporter("--kubeconfig", kubeconfig, "--node-name", NODE,
                             "--podresources-socket", "/nonexistent/kubelet.sock",
                             "--coalesce-window", "0.05", "--readmission-settle", "1") as exp:
            # The scrapers count a scrape without node_resize_kernel_cpus as failed: wait for the
            # first sysfs read too (its own thread; the Node comes on the watch's).
            exp.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                           unit="core") == 2
                         and s.value("node_resize_kernel_cpus", state="online") is not None,
                         timeout=30)
            rss = []
            for storm in range(STORMS):
                base = exp.scrape()
                unplugs0 = base.value("node_hot_unplug_request_total", 0.0, resource="cpu")
                plugs0 = base.value("node_resize_resync_request_total", 0.0, resource="cpu")
                flaps = 0
                with Scrapers(exp.url) as scrapers:
                    deadline = time.monotonic() + STORM_SECONDS
                    pod = 0
                    while time.monotonic() < deadline:
                        cpu1.set_online(False)
                        time.sleep(0.1)  # > coalesce window: separate episodes
                        cpu1.set_online(True)
                        flaps += 1
                        for _ in range(5):  # the Pod watch burst, interleaved
                            if pod < PODS:
                                api.put_pod(f"balloon-{storm}-{pod}", node=NODE,
                                            priority_class="system-balloon",
                                            requests={"cpu": "10m", "memory": "1Mi"})
                                pod += 1
                        time.sleep(0.1)
                    while pod < PODS:
                        api.put_pod(f"balloon-{storm}-{pod}", node=NODE,
                                    priority_class="system-balloon",
                                    requests={"cpu": "10m", "memory": "1Mi"})
                        pod += 1
                    exp.wait_for(lambda s: s.value("node_resize_balloon_pods") == PODS, timeout=60)
                    for p in range(PODS):
                        api.delete_pod(f"balloon-{storm}-{p}")
                    exp.wait_for(lambda s: s.value("node_resize_balloon_pods") == 0, timeout=60)
                assert scrapers.failed == [], scrapers.failed[:5]
                assert scrapers.ok > SCRAPERS
                # Zero lost episodes: one hot-unplug and one hot-plug episode per flap.
                s = exp.wait_for(
                    lambda s: s.value("node_hot_unplug_request_total", 0.0, resource="cpu")
                    - unplugs0 >= flaps and s.value("node_resize_resync_request_total", 0.0,
                                                    resource="cpu") - plugs0 >= flaps,
                    timeout=60)
                assert s.value("node_hot_unplug_request_total", resource="cpu") - unplugs0 \
                    == flaps
                assert s.value("node_resize_resync_request_total", resource="cpu") - plugs0 \
                    == flaps
                assert s.value("node_resize_exporter_events_lost_total", 0.0, source="bpf") == 0
                # The sysfs truth follows the last poke within one storm read gap.
                exp.wait_for(lambda s: s.value("node_resize_kernel_cpus", state="online") == 2,
                             timeout=10)
                rss.append(_rss(exp.proc.pid))
                print(f"storm {storm + 1}: {flaps} flaps, {scrapers.ok} scrapes, "
                      f"RSS {rss[-1] / 2**20:.1f} MiB")
            assert rss[-1] - rss[0] < RSS_GROWTH_BOUND, [r // 2**20 for r in rss]
