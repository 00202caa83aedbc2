"""The pod's bill: the exporter's memory as the DaemonSet runs it, next to node_exporter's.

`.venv/bin/python bench/run.py memory` (as root). The exporter runs with the DaemonSet's own
args (read from deploy/daemonset.yaml: --web.auth=kubernetes over TLS, the journal, every
default source) against the test API server holding this node's Node, its Lease and 30 pods
(2 balloons), with the kubelet's podresources socket answering (testkit/fakes), scraped every
15 s with a bearer token as the ServiceMonitor does. Only what cannot be the pod's differs: the
listen address (loopback, a free port), the journal's path (a temporary directory), the
API server (a kubeconfig instead of the service account) and the podresources socket's path.

Measured after a window of scrapes: /proc/PID/smaps_rollup (Rss, Anonymous; file-backed is the
rest), VmHWM (the peak), the thread count and the CPU over the window (the process's and its
reaped children's: a podresources poll is a child), node_exporter the same way in the same
minutes.
Then where the anonymous part goes: a second run of the same exporter under bench/memprobe.py
(tracemalloc, modules, threads; its RSS is not the figure, tracemalloc costs its own), the
anonymous mappings of the plain run by kind (heap, thread stacks, other), and what importing
each library costs a bare interpreter.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import NodeExporter, Scraper, free_port
from testkit.deploy import container_of, load_manifest
from testkit.exporter_proc import terminate
from testkit.kubeauth import PROMETHEUS, bearer_get

MiB = 2**20
REPO = Path(__file__).resolve().parent.parent
NODE = "bench-node"
PODS = 30  # on the node, 2 of them balloons
SCRAPE_INTERVAL = 15.0  # deploy/servicemonitor.yaml
BALLOON = {"node-resize-exporter.io/balloon": "true"}
# What importing each costs a bare interpreter (RSS after the import, less the bare one's).
IMPORTS = ("prometheus_client", "click", "yaml", "h11", "msgspec", "httpx2", "lightkube",
           "psutil", "inotify_simple", "bcrypt", "cryptography.x509", "google.protobuf",
           "grpc", "opentelemetry.sdk.trace", "exporter.cli.main", "exporter.app")


def daemonset_args(port: int, journal: str) -> list[str]:
    """The DaemonSet container's args, with the listen addresses and journal path made local."""
    out = []
    for arg in container_of(load_manifest("daemonset.yaml"))["args"]:
        if arg.startswith("--web.listen-address="):
            arg = f"--web.listen-address=127.0.0.1:{port}"
        elif arg.startswith("--journal="):
            arg = f"--journal={journal}"
        elif arg.startswith("--web.health-listen-address="):  # the liveness probe's listener
            arg = f"--web.health-listen-address=127.0.0.1:{free_port()}"
        out.append(arg)
    return out


def smaps_rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
        elif key == "Threads":
            out[key] = int(value)
    return out


def mappings(pid: int) -> dict[str, dict[str, int]]:
    """RSS by mapping, from /proc/PID/smaps: the anonymous part by kind ([heap]: brk, glibc's
    main arena; thread stacks: the 8 MiB-class private mappings glibc makes for each thread;
    shared libraries' written pages; the rest: pymalloc's arenas, other malloc arenas, large
    blocks mmap'd directly, BPF maps) and the file-backed part by file."""
    anon: dict[str, int] = {}
    files: dict[str, int] = {}
    header = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$")
    size, name, rss, anonymous = 0, "", 0, 0

    def flush() -> None:
        if anonymous:
            if name == "[heap]":
                kind = "heap (brk)"
            elif name == "[stack]":
                kind = "main thread stack"
            elif name == "":
                kind = ("thread stacks" if 7 * MiB < size <= 9 * MiB
                        else "other anonymous (pymalloc and malloc arenas, large blocks)")
            else:
                kind = "shared libraries' written pages (relocations, .data)"
            anon[kind] = anon.get(kind, 0) + anonymous
        if rss > anonymous and name.startswith("/"):
            files[name] = files.get(name, 0) + rss - anonymous

    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = header.match(line)
        if m:
            flush()
            size = int(m.group(2), 16) - int(m.group(1), 16)
            name = m.group(3).strip()
            rss = anonymous = 0
        elif line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Anonymous:"):
            anonymous = int(line.split()[1]) * 1024
    flush()
    top = sorted(files.items(), key=lambda kv: -kv[1])
    return {"anonymous": dict(sorted(anon.items(), key=lambda kv: -kv[1])),
            "file_backed": {Path(k).name: v for k, v in top[:15]}
            | {"(the other files)": sum(v for _, v in top[15:])}}


def import_costs(python: str = sys.executable) -> dict[str, float]:
    """MiB of RSS that importing each module adds to a bare interpreter (one fresh process
    each; the median of 3)."""
    probe = ("import sys, importlib\n"
             "def rss():\n"
             "    for l in open('/proc/self/status'):\n"
             "        if l.startswith('VmRSS:'): return int(l.split()[1]) * 1024\n"
             "base = rss()\n"
             "if sys.argv[1] != '-': importlib.import_module(sys.argv[1])\n"
             "print(base, rss())\n")
    out: dict[str, float] = {}
    for name in ("-", *IMPORTS):
        samples = []
        for _ in range(3):
            done = subprocess.run([python, "-c", probe, name], cwd=REPO, capture_output=True,
                                  text=True, check=True)
            base, after = map(int, done.stdout.split())
            samples.append((after if name == "-" else after - base) / MiB)
        out["(interpreter)" if name == "-" else name] = round(sorted(samples)[1], 1)
    return out


class PodShaped:
    """The test API server (Node, Lease, PODS pods), a podresources socket, a token Prometheus
    presents: what the exporter's DaemonSet pod talks to. `command(port)` is the exporter's."""

    def __init__(self, pods: int = PODS, traces: bool = False, podresources: bool = True):
        self.pods = pods
        self.podresources = podresources
        self.traces = traces
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "PodShaped":
        from exporter.sources.kubelet.proto import podresources_pb2 as pb
        from testkit.fakes.apiserver import FakeApiServer
        from testkit.fakes.podresources import Kubelet, Server
        self.tmp = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="nre-mem-")))
        self.api = self.stack.enter_context(FakeApiServer())
        self.api.set_node(NODE, cpu=str(os.sysconf("SC_NPROCESSORS_CONF")), memory="8Gi")
        self.api.set_lease(NODE, time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()))
        for i in range(self.pods):
            balloon = i < 2
            self.api.put_pod(f"balloon-{i}" if balloon else f"app-{i}", node=NODE,
                             labels=BALLOON if balloon else {"app": f"app-{i % 7}"},
                             requests={"cpu": "250m", "memory": "256Mi"} if balloon
                             else {"cpu": "10m", "memory": "16Mi"})
        self.kubeconfig = self.api.write_kubeconfig(str(self.tmp / "kubeconfig"))
        # The pod's clients trust one CA (the service account's ca.crt); a kubeconfig without
        # one makes every client load the whole certifi bundle (~1 MiB each, 4.8 MiB for the
        # first), which the pod never does. The test API server speaks plain HTTP, so no CA
        # is read at all here: the nearest to the pod's one-certificate store.
        config = json.loads(Path(self.kubeconfig).read_text())
        config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
        Path(self.kubeconfig).write_text(json.dumps(config))
        self.token = "prom-" + secrets.token_urlsafe(24)
        self.api.add_token(self.token, PROMETHEUS, groups=("system:serviceaccounts",))
        self.api.allow_path(f"user:{PROMETHEUS}")
        kubelet = Kubelet()
        kubelet.answer = pb.AllocatableResourcesResponse(cpu_ids=[0, 1])
        self.socket = str(self.tmp / "kubelet.sock")
        server = Server(self.socket, kubelet)
        self.stack.callback(server.stop)
        # The DaemonSet's plain env values (MALLOC_ARENA_MAX), and its Node.
        self.env = {e["name"]: e["value"] for e in container_of(load_manifest(
            "daemonset.yaml")).get("env", []) if "value" in e}
        self.env["NODE_NAME"] = NODE
        if self.traces:
            from testkit.fakes.otlp import HttpReceiver
            rx = self.stack.enter_context(HttpReceiver())
            self.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = rx.endpoint
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def args(self, port: int, extra: tuple[str, ...] = ()) -> list[str]:
        journal = str(self.tmp / f"journal-{port}.db")
        return [*daemonset_args(port, journal), "--kubeconfig", self.kubeconfig,
                "--podresources-socket", self.socket if self.podresources else "", *extra]

    def scrape(self, port: int) -> tuple[int, str]:
        got = bearer_get(port, "/metrics", token=self.token)
        if not isinstance(got, tuple):
            return 0, repr(got)
        return got[0], got[2].decode(errors="replace")


def ready(text: str, podresources: bool = True) -> bool:
    """Everything a pod's steady state holds: the pods listed, the Node seen, podresources
    answered, and the BPF source attached (or said why not)."""
    return ("\nnode_resize_balloon_pods 2" in text
            and "node_resize_kubelet_capacity{" in text
            and (not podresources or "node_resize_podresources_allocatable_cpus 2" in text)
            and 'node_resize_exporter_source_up{source="bpf"}' in text)


class PodExporter:
    """The exporter as a process in a PodShaped world (optionally under bench/memprobe.py)."""

    def __init__(self, world: PodShaped, probe: Path | None = None,
                 extra: tuple[str, ...] = ()):
        self.world = world
        self.port = free_port()
        self.probe = probe
        head = [sys.executable, "-m", "bench.memprobe", str(probe), "--"] if probe \
            else [sys.executable, "-m", "exporter"]
        self.cmd = [*head, *world.args(self.port, extra)]
        self.log = world.tmp / f"exporter-{self.port}.log"

    def __enter__(self) -> "PodExporter":
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, env={**os.environ, **self.world.env},
                                         stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        last = ""
        while time.monotonic() - t0 < 120:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exporter exited {self.proc.returncode}:\n"
                                   f"{self.log.read_text()[-3000:]}")
            code, last = self.world.scrape(self.port)
            if code == 200 and ready(last, self.world.podresources):
                self.startup_s = time.monotonic() - t0
                self.last_scrape = last
                return self
            time.sleep(0.2)
        terminate(self.proc)
        raise RuntimeError(f"not ready in 120 s; last scrape {last[-2000:]}\n"
                           f"{self.log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        terminate(self.proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 3000) -> str:
        """For a failure message: whether the process still runs, and its log's end; after a
        crash, faulthandler's whole dump (the crashing thread comes first: CI's tail of 3,000
        characters cut it off)."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited {code}"
        text = self.log.read_text()
        crash = text.rfind("Fatal Python error")
        shown = text[crash:][:20000] if crash >= 0 else text[-chars:]
        return f"\nexporter (pid {self.pid}) {state}; log tail:\n{shown}"

    def probe_report(self) -> dict:
        assert self.probe is not None
        trigger = self.probe.with_name(self.probe.name + ".trigger")
        self.probe.unlink(missing_ok=True)
        trigger.touch()
        t0 = time.monotonic()
        while not self.probe.exists():
            if time.monotonic() - t0 > 600:  # a snapshot takes ~10-60 s on a loaded machine
                raise RuntimeError("memprobe wrote no report")
            time.sleep(0.2)
        return json.loads(self.probe.read_text())


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and of its children it has waited for (the BPF
    compiler's, the certificate's, a podresources poll's): /proc/PID/stat utime, stime, cutime,
    cstime."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def memory_row(pid: int) -> dict:
    rollup, st = smaps_rollup(pid), status(pid)
    return {"rss_mib": rollup["Rss"] / MiB, "anon_mib": rollup["Anonymous"] / MiB,
            "file_backed_mib": (rollup["Rss"] - rollup["Anonymous"]) / MiB,
            "pss_mib": rollup.get("Pss", 0) / MiB, "hwm_mib": st["VmHWM"] / MiB,
            "threads": st["Threads"]}


def steady_state(window: float = 60.0, peer: bool = True, traces: bool = False,
                 extra: tuple[str, ...] = (), podresources: bool = True) -> dict:
    """Both exporters started, then scraped every 15 s for `window` seconds; memory at the
    end. The exporter is scraped over TLS with a token (a TokenReview on the first)."""
    with PodShaped(traces=traces, podresources=podresources) as world, \
            PodExporter(world, extra=extra) as ours, contextlib.ExitStack() as stack:
        peers = {}
        if peer:
            peers["node_exporter"] = stack.enter_context(NodeExporter())
        scrapers = [Scraper(p.port) for p in peers.values()]
        stack.callback(lambda: [s.close() for s in scrapers])
        series = sum(1 for line in ours.last_scrape.splitlines()
                     if line and not line.startswith("#"))
        pids = {"node-resize-exporter": ours.pid} | {n: p.pid for n, p in peers.items()}
        cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        t0 = time.monotonic()
        end = t0 + window
        while time.monotonic() < end:
            code, text = world.scrape(ours.port)
            assert code == 200, text[-500:]
            for scraper in scrapers:
                scraper.get()
            time.sleep(min(SCRAPE_INTERVAL, max(0.0, end - time.monotonic())))
        elapsed = time.monotonic() - t0
        cpu = {n: round(100 * (cpu_seconds(pid) - cpu0[n]) / elapsed, 3)
               for n, pid in pids.items()}
        out = {"node-resize-exporter": {**memory_row(ours.pid), "startup_s": ours.startup_s,
                                        "cpu_pct_with_children": cpu["node-resize-exporter"],
                                        "series": series,
                                        "by_mapping": mappings(ours.pid)}}
        for name, p in peers.items():
            out[name] = {**memory_row(p.pid), "cpu_pct_with_children": cpu[name]}
        out["window_s"] = round(elapsed, 1)
        out["load_average"] = os.getloadavg()
        return out


def breakdown(window: float = 20.0) -> dict:
    """The same pod-shaped exporter under tracemalloc: what the anonymous memory is."""
    with PodShaped() as world:
        probe = world.tmp / "probe.json"
        with PodExporter(world, probe=probe) as ours:
            time.sleep(window)
            world.scrape(ours.port)
            return ours.probe_report()


def bill(window: float = 60.0, peer: bool = True, breakdown_window: float = 20.0) -> dict:
    """The whole memory benchmark: the DaemonSet's configuration, then everything on (traces,
    Kubernetes Events), the breakdown and the import costs."""
    return {
        "daemonset": steady_state(window, peer=peer),
        "everything_on": steady_state(window, peer=False, traces=True,
                                      extra=("--kube-events",))["node-resize-exporter"],
        "no_podresources_socket": steady_state(window, peer=False, podresources=False
                                               )["node-resize-exporter"],
        "breakdown": breakdown(breakdown_window),
        "import_mib": import_costs(),
    }


if __name__ == "__main__":
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    print(json.dumps(bill(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0), indent=1))
