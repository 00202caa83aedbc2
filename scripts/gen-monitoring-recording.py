#!/usr/bin/env python3
"""Records tests/fixtures/hot-unplug-scrapes.om.gz: what Prometheus would have stored while a
real exporter on this machine watched cpu1 go away and come back (run as root; ~80 s).

A real `node-resize-exporter run` (every kernel source that works here) joined to the test API
server (testkit/fakes/apiserver.py, the real list/watch protocol) and a podresources socket is
scraped every SCRAPE seconds while, under the machine-wide hotplug lock:

   0 s  in sync: Node 2 CPUs, pods a and b Running (500m each)
   8 s  cpu1 offlined (hot-unplug); the Node still says 2: stale
  16 s  the "kubelet restart": Node 1 CPU (resync), pod b Failed OutOfcpu (readmission)
  26 s  cpu1 onlined (hot-plug); the Node says 1: stranded
  32 s  Node 2 CPUs (resync)
  38 s  cpu1 offlined again and never resynced: resync_timeout after RESYNC_DEADLINE
  70 s  recording ends while the capacity is still stale; cpu1 is put back online

Each scrape becomes OpenMetrics samples with the scrape's timestamp and the target labels a
ServiceMonitor adds (job, instance, node, cluster) plus `up`, ready for
`promtool tsdb create-blocks-from openmetrics` (tests/e2e/test_dashboards_prometheus.py).
Every sample name is its own family of type unknown, which keeps the format valid for counters
and histograms alike; PromQL does not read metric types.
"""
from __future__ import annotations

import gzip
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.sources.kubelet.proto import podresources_pb2 as pb  # noqa: E402
from testkit.exporter_proc import RunningExporter  # noqa: E402
from testkit.fakes.apiserver import FakeApiServer  # noqa: E402
from testkit.fakes.podresources import Kubelet, Server  # noqa: E402
from testkit.kernel import Cpu, hotplug_lock  # noqa: E402

OUT = REPO / "tests" / "fixtures" / "hot-unplug-scrapes.om.gz"
NODE, CLUSTER, JOB, SCRAPE, RESYNC_DEADLINE = "rec-node", "rec-cluster", "node-resize-exporter", \
    2.0, 20


def _mem_total_ki() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise SystemExit("no MemTotal in /proc/meminfo")


class Recorder(threading.Thread):
    """Scrapes every SCRAPE seconds until stopped: [(time, exposition text)]."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.scrapes, self.done = url, [], threading.Event()

    def run(self) -> None:
        next_at = time.time()
        while not self.done.is_set():
            t = time.time()
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
                self.scrapes.append((t, r.read().decode()))
            next_at += SCRAPE
            self.done.wait(max(0.0, next_at - time.time()))


def openmetrics(scrapes: list[tuple[float, str]], instance: str) -> str:
    target = {"job": JOB, "instance": instance, "node": NODE, "cluster": CLUSTER}
    series: dict[str, dict[tuple, list[tuple[float, float]]]] = {}
    for t, text in scrapes:
        series.setdefault("up", {}).setdefault(tuple(sorted(target.items())), []).append((t, 1))
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted({**s.labels, **target}.items()))
                series.setdefault(s.name, {}).setdefault(labels, []).append((t, s.value))
    out = []
    for name in sorted(series):
        out.append(f"# TYPE {name} unknown")
        for labels, points in sorted(series[name].items()):
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            out.extend(f"{name}{{{text}}} {v!r} {t:.3f}" for t, v in points)
    return "\n".join(out) + "\n# EOF\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def record(workdir: Path) -> str:
    cpu1 = Cpu(1)
    if not cpu1.hotpluggable():
        raise SystemExit("cpu1 cannot be hotplugged here (run as root on a 2+ CPU machine)")
    kubelet = Kubelet()
    kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
    sock = Server(str(workdir / "kubelet.sock"), kubelet)
    with hotplug_lock(), FakeApiServer() as api:
        try:
            cpu1.set_online(True)
            api.set_node(NODE, cpu="2", memory=f"{_mem_total_ki()}Ki")
            for pod in ("pod-a", "pod-b"):
                api.put_pod(pod, node=NODE, requests={"cpu": "500m", "memory": "64Mi"})
            kubeconfig = api.write_kubeconfig(str(workdir / "kubeconfig"))
            with RunningExporter("--kubeconfig", kubeconfig, "--node-name", NODE,
                                 "--podresources-socket", str(workdir / "kubelet.sock"),
                                 "--podresources-interval", "1",
                                 "--resync-deadline", str(RESYNC_DEADLINE),
                                 "--readmission-settle", "2") as exporter:
                exporter.wait_for(lambda s: s.value("node_resize_kubelet_capacity", resource="cpu",
                                                    unit="core") == 2, timeout=30)
                recorder = Recorder(exporter.url)
                recorder.start()
                t0 = time.monotonic()

                def at(seconds: float) -> None:
                    time.sleep(max(0.0, t0 + seconds - time.monotonic()))

                at(8)
                cpu1.set_online(False)
                kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
                at(16)
                api.update_node(NODE, cpu="1", allocatable_cpu="1")
                api.put_pod("pod-b", node=NODE, requests={"cpu": "500m", "memory": "64Mi"},
                            phase="Failed", reason="OutOfcpu", ready=False)
                kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0])
                at(26)
                cpu1.set_online(True)
                at(32)
                api.update_node(NODE, cpu="2", allocatable_cpu="2")
                kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
                at(38)
                cpu1.set_online(False)
                at(70)
                recorder.done.set()
                recorder.join()
                instance = exporter.url.removeprefix("http://")
        finally:
            cpu1.set_online(True)
            sock.stop()
    return openmetrics(recorder.scrapes, instance)


def main() -> int:
    import tempfile
    with tempfile.TemporaryDirectory(prefix="nre-record-") as tmp:
        text = record(Path(tmp))
    OUT.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"wrote {OUT.relative_to(REPO)}: {text.count(chr(10))} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
