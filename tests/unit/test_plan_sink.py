"""The plan sink: an agent's sink that plans on the Correlator's forecast and the running-pods
view, it answers GET /plan's query strings and renders the unpluggable gauges from a sysfs tree
(a fake one here: tests/e2e and tests/kernel use the real one)."""
from __future__ import annotations

import json

import pytest

from exporter.correlate.readmission_forecast import ReadmissionForecast
from exporter.correlate.running_pods_view import RunningPodsView
from exporter.events import NodeStatus, ParavirtMemory, PdbsRelisted, VirtioMemDevice
from exporter.kube.convert import node_status, pod_status
from exporter.sinks.plan_collector import PlanSink
from exporter.sources.kernel.sysfs import SysfsReader
from testkit.forecast import T, node, pod
from testkit.plan import fake_host, handle, kubelet_read, plan_agent, pods_listed


def virtio_logged(agent, blocks: range) -> None:
    """What the paravirt source read of fake_host's virtio0 (its driver's log): 2 MiB device
    blocks, sub-block mode, so it gives back a memory block at a time."""
    start, size = blocks.start << 27, len(blocks) << 27
    handle(agent, ParavirtMemory(T, (VirtioMemDevice("virtio0", start, size, size,
                                                     block_size=2 << 20),)))


@pytest.fixture
def wired(tmp_path):
    sysfs, procfs = fake_host(tmp_path, blocks={1: ("online", "DMA32"),
                                                40: ("online", "Movable"),
                                                41: ("online", "Movable"),
                                                42: ("online", "none")},
                              virtio_mem=range(40, 48))
    agent, s = plan_agent(sysfs, procfs)
    handle(agent, SysfsReader(sysfs, procfs).read(T))
    virtio_logged(agent, range(40, 48))
    kubelet_read(agent)
    converted = node_status(node(cpu="2", allocatable_cpu="1"), T).event
    assert isinstance(converted, NodeStatus)
    handle(agent, converted)
    for name in ("a", "b"):
        obj = pod(name, {"cpu": "500m"})
        if name == "a":  # a ReplicaSet's pod; b is a bare pod
            obj["metadata"]["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f",
                 "uid": "rs-uid", "controller": True}]
        handle(agent, pod_status(obj, T, None).event)
    pods_listed(agent)
    return agent, s


@pytest.fixture
def agent(wired):
    return wired[0]


@pytest.fixture
def sink(wired):
    return wired[1]


def values(sink: PlanSink) -> dict[tuple[str, tuple[str, ...]], float]:
    """A scrape, after the gauges' thread would have run (refresh: it is not started here)."""
    sink.refresh()
    return scrape(sink)


def scrape(sink: PlanSink) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(m.name, tuple(sample.labels.values())): sample.value
            for m in sink.collect() for sample in m.samples}


def test_a_plan_query_is_answered_with_the_pods_it_would_cost(sink):
    status, body = sink.http("cpu=-1")
    answer = json.loads(body)
    assert status == 200 and answer["cpu"]["take"] == [1] and not answer["safe"]
    assert [p["reason"] for p in answer["pods"]["rejected"]] == ["OutOfcpu", "OutOfcpu"]
    assert [p["owner_kind"] for p in answer["pods"]["rejected"]] == ["ReplicaSet", None]
    assert all(p["uid"] for p in answer["pods"]["rejected"])
    status, body = sink.http("memory=-256Mi")
    answer = json.loads(body)
    assert sorted(answer["memory"]["take"]) == [40, 41] and answer["safe"], answer
    assert answer["memory"]["devices"][0]["id"] == "virtio0"
    # A hot-add's sign survives the query string, written plainly or escaped; what the
    # machine cannot do is an answer (200, harmful), not a malformed question (400).
    for query in ("cpu=+1", "cpu=%2B1"):
        status, body = sink.http(query)
        assert status == 200 and "add at most 0" in json.loads(body)["harm"][0]


@pytest.mark.parametrize("query, fix", [
    ("cpu=-1&cpu=-1", "given twice"), ("gpu=1", "unknown query key"), ("cpu", "does not parse"),
    ("cpu=-1&" + "x" * 300, "longer than"), ("memory=+1Qi", "not a size"),
    ("cpu=-1&memory=-1&a=1&b=2&c=3&d=4", "does not parse"), ("cpu=-1&generation=xyz", "16 hex"),
])
def test_bad_queries_are_400_with_the_fix(sink, query, fix):
    status, body = sink.http(query)
    answer = json.loads(body)
    assert status == 400 and fix in answer["error"] and "GET /plan?" in answer["fix"]
    assert sink.malformed(query) == body  # what the web checks before charging the budget
    assert sink.malformed("cpu=-2") is None  # more than the machine has: well formed


def test_the_gauges_say_what_can_leave(agent, sink):
    got = values(sink)
    # cpu1 would cost both pods: no CPU can leave; both movable virtio-mem blocks can.
    assert got[("node_resize_unpluggable", ("cpu", "core"))] == 0
    assert got[("node_resize_unpluggable", ("memory", "byte"))] == 2 * 128 * 2**20
    # Memory by zone is the kernel's, in a collector of its own (test_memory_zones_collector).
    assert {name for name, _ in got} == {"node_resize_unpluggable"}


def test_the_gauges_are_worked_out_when_an_input_changes_and_a_scrape_reads_them(
        agent, sink, monkeypatch):
    """A scrape computes nothing (it reads the last value); an input's change, a pod's
    included, makes the gauges' thread work them out again (L1: no 15 s lag on a pod)."""
    import exporter.sinks.plan_collector as module
    calls = []
    real = module.unpluggable
    monkeypatch.setattr(module, "unpluggable", lambda *a: calls.append(1) or real(*a))
    assert sink.refresh() and len(calls) == 1
    assert not sink.refresh() and len(calls) == 1  # nothing changed: nothing worked out
    scrape(sink)
    scrape(sink)
    assert len(calls) == 1  # the scrapes read the value
    cpu = ("node_resize_unpluggable", ("cpu", "core"))
    assert scrape(sink)[cpu] == 0  # cpu1 would cost both pods
    for name in ("a", "b"):  # the pods go: the gauge follows at the next refresh
        handle(agent, pod_status(pod(name, {"cpu": "500m"}), T, None, deleted=True).event)
    assert scrape(sink)[cpu] == 0 and len(calls) == 1  # not on the scrape path
    assert sink.refresh() and len(calls) == 2
    assert scrape(sink)[cpu] == 1
    handle(agent, SysfsReader(sink.sysfs, sink.procfs).read(T + 2))
    assert sink.refresh() and len(calls) == 3  # the kernel changed


def test_the_gauges_thread_follows_a_pod_within_its_interval(agent, sink):
    """The thread serve() starts: woken by the agent's events, it works the gauges out."""
    import time

    from exporter.sinks.plan_collector import GAUGE_MIN_INTERVAL, GAUGE_SETTLE
    cpu = ("node_resize_unpluggable", ("cpu", "core"))
    sink.start()
    try:
        deadline = time.monotonic() + 5
        while cpu not in scrape(sink) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scrape(sink)[cpu] == 0
        for name in ("a", "b"):
            handle(agent, pod_status(pod(name, {"cpu": "500m"}), T, None, deleted=True).event)
        began = time.monotonic()
        while scrape(sink)[cpu] != 1 and time.monotonic() < began + 5:
            time.sleep(0.01)
        assert scrape(sink)[cpu] == 1
        assert time.monotonic() - began < GAUGE_MIN_INTERVAL + GAUGE_SETTLE + 2
    finally:
        sink.close()


def test_the_plan_reads_the_pods_the_agent_keeps_and_keeps_none_of_its_own(agent, sink,
                                                                            monkeypatch):
    # On a node listing 20,000 pods, a forecast or a running-pods view of the plan's own would
    # hold each pod a second time and handle each pod event a second time.
    assert not [name for name, v in vars(sink).items()
                if isinstance(v, (ReadmissionForecast, RunningPodsView))]
    # Nor the kubelet's checkpoints and gates: the kubelet sink's view keeps them (issue 34).
    assert not {"cpu_checkpoint", "memory_checkpoint", "kubelet_resizes"} & set(vars(sink))
    assert sink.shared.forecast is agent.correlator.forecast
    fed: list[str] = []
    for cls, method in ((ReadmissionForecast, "on_pod"), (RunningPodsView, "handle")):
        real = getattr(cls, method)
        monkeypatch.setattr(cls, method, lambda self, event, _real=real, _name=cls.__name__:
                            fed.append(_name) or _real(self, event))

    def rejected() -> list[str]:
        status, body = sink.http("cpu=-1")
        assert status == 200
        return [p["name"] for p in json.loads(body)["pods"]["rejected"]]

    assert rejected() == ["a", "b"]
    handle(agent, pod_status(pod("c", {"cpu": "100m"}, created="10:00:00"), T, None).event)
    assert sorted(fed) == ["ReadmissionForecast", "RunningPodsView"]  # each pod event once
    assert rejected() == ["a", "b", "c"]
    # Handed to the plan sink alone, a pod changes nothing the plan reads: it keeps no copy.
    sink.on_event(pod_status(pod("d", {"cpu": "100m"}, created="10:00:01"), T, None).event)
    assert rejected() == ["a", "b", "c"]


def test_a_plan_leaves_the_correlators_forecast_as_it_was(agent, sink):
    forecast = agent.correlator.forecast
    before = forecast.result()
    assert before is not None and before.rejected_total == 0
    assert sink.http("cpu=-1")[0] == 200 and values(sink)
    assert forecast.result() is before  # not even its cache moved


def test_plans_and_gauges_hold_no_lock_the_agent_needs_while_they_compute(agent, sink,
                                                                          monkeypatch):
    """Issue 34: the agent's lock and the running-pods sink's are taken only to take a view
    and a copy; the planner runs with neither held (here: it checks, from inside)."""
    import exporter.sinks.plan_collector as module
    held: list[tuple[bool, bool]] = []
    real_plan, real_unpluggable = module.answer, module.unpluggable

    def probe() -> None:
        held.append((agent.lock.locked(), sink.shared.running.lock.locked()))

    monkeypatch.setattr(module, "answer", lambda *a, **k: probe() or real_plan(*a, **k))
    monkeypatch.setattr(module, "unpluggable", lambda *a: probe() or real_unpluggable(*a))
    assert sink.http("cpu=-1")[0] == 200
    assert sink.refresh()
    assert held == [(False, False), (False, False)]


def test_a_fifo_where_kpageflags_should_be_is_not_read(tmp_path):
    import os
    import threading

    from exporter.sources.kernel.memory_blocks import PageFlagsReader
    os.mkfifo(tmp_path / "kpageflags")
    got: list[object] = []
    reader = PageFlagsReader(128 * 2**20, str(tmp_path))
    t = threading.Thread(target=lambda: got.append(reader.read(3)), daemon=True)
    t.start()
    t.join(10)
    assert got == [None]
    reader.close()


@pytest.mark.parametrize("status, says", [
    (None, "have not been listed yet"),
    (("list of pods: more than 10000 objects", "truncated"), "cut at its bound"),
    (("pods is forbidden: User cannot list resource", "forbidden"), "forbidden"),
])
def test_a_plan_on_pods_never_listed_is_not_safe_and_the_gauge_is_absent(tmp_path, status,
                                                                         says):
    """The Node is known but the pods are not (not listed yet, past the list bound, forbidden):
    the forecast would say "nothing rejected" about pods it never saw. The plan says they are
    unjudged (not safe, as `plan` does) and node_resize_unpluggable is absent, as the
    forecast's own series are (node_resize_readmission_forecast_valid says why)."""
    from exporter.events import SourceStatus
    sysfs, procfs = fake_host(tmp_path, blocks={40: ("online", "Movable")},
                              virtio_mem=range(40, 48))
    agent, s = plan_agent(sysfs, procfs)
    handle(agent, SysfsReader(sysfs, procfs).read(T))
    virtio_logged(agent, range(40, 48))
    kubelet_read(agent)
    handle(agent, node_status(node(cpu="2", allocatable_cpu="1"), T).event)
    if status is not None:
        handle(agent, SourceStatus("kube_pods", False, T, *status))
    answer = json.loads(s.http("memory=-128Mi")[1])
    assert answer["verdict"] == "unknown" and any(says in u for u in answer["unknown"]), answer
    got = values(s)
    assert not any(name == "node_resize_unpluggable" for name, _ in got)
    pods_listed(agent)
    answer = json.loads(s.http("memory=-128Mi")[1])
    assert answer["safe"] and answer["unknown"] == [], answer
    assert values(s)[("node_resize_unpluggable", ("memory", "byte"))] == 128 * 2**20


@pytest.mark.parametrize("node_seen", [False, True])
def test_with_kubernetes_on_and_no_node_seen_a_plan_is_never_safe(tmp_path, node_seen):
    """Issue 36 H1: Kubernetes on, the Node never seen (API server unreachable, a wrong
    --node-name, a Node not registered yet): 16 CPUs, 10 pods of 1 CPU. The plan judges the
    pods anyway: unjudged, not safe; node_resize_unpluggable absent (it said 15, truth 6)."""
    from exporter.kube.convert import pod_status as convert
    sysfs, procfs = fake_host(tmp_path, cpus=16, blocks={40: ("online", "Movable")})
    agent, s = plan_agent(sysfs, procfs)
    handle(agent, SysfsReader(sysfs, procfs).read(T))
    kubelet_read(agent)
    for i in range(10):
        handle(agent, convert(pod(f"p{i}", {"cpu": "1"}), T, None).event)
    pods_listed(agent)
    handle(agent, PdbsRelisted(T, frozenset()))  # no PodDisruptionBudget in the cluster
    if node_seen:
        handle(agent, node_status(node(cpu="16", allocatable_cpu="16"), T).event)
    answer = json.loads(s.http("cpu=-10")[1])
    got = values(s)
    if not node_seen:
        assert answer["verdict"] == "unknown" and answer["unknown"], answer
        assert any("no Node status" in u for u in answer["unknown"]), answer
        assert not any(name == "node_resize_unpluggable" for name, _ in got)
    else:  # the Node seen: 4 of 10 pods rejected, 6 CPUs can go
        assert answer["safe"] is False and answer["pods"]["rejected_total"] == 4, answer
        assert answer["unknown"] == []
        assert got[("node_resize_unpluggable", ("cpu", "core"))] == 6


def test_with_kubernetes_off_the_pods_are_not_judged_and_the_plan_says_so(tmp_path):
    sysfs, procfs = fake_host(tmp_path, cpus=4, blocks={40: ("online", "Movable")})
    agent, s = plan_agent(sysfs, procfs, kubernetes=False)
    handle(agent, SysfsReader(sysfs, procfs).read(T))
    # No kubelet on this host (no root, no kubepods cgroup): nothing of Kubernetes to hurt.
    s.kubelet_root = str(tmp_path / "no-kubelet")
    answer = json.loads(s.http("cpu=-2")[1])
    assert answer["safe"] and answer["unknown"] == [] and \
        not answer["considered"]["kubernetes"], answer
    assert answer["inputs"]["pods"] == "not needed"
    assert values(s)[("node_resize_unpluggable", ("cpu", "core"))] == 3
    # A kubepods cgroup on the host (a kubelet runs, its root elsewhere): the pods unread.
    from testkit.container_cgroups import construct
    s.cgroup_root = str(construct(tmp_path / "cg", 2, "cgroupfs", [
        ("burstable", "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "a" * 64, {})]))
    answer = json.loads(s.http("cpu=-2")[1])
    assert answer["verdict"] == "unknown" and answer["inputs"]["pods"].startswith(
        "the Kubernetes side is off"), answer


def test_page_flags_cached_are_not_charged_and_repeated_asks_read_further(tmp_path,
                                                                          monkeypatch):
    """L3: the budget counted cache hits, so GET /plan read the same blocks every time and a
    question past the budget never got an answer. Unread blocks are "cannot tell" (never
    "cannot"), and each ask reads further until the answer is whole."""
    from array import array

    import exporter.sinks.plan_collector as module
    from exporter.plan.pages import KPF_BUDDY
    blocks = {n: ("online", "Normal") for n in range(40, 48)}
    sysfs, procfs = fake_host(tmp_path, blocks=blocks, virtio_mem=range(40, 48))
    pages = 128 * 2**20 // 4096
    with open(f"{procfs}/kpageflags", "wb") as f:  # every page of 40-47 free (buddy)
        f.seek(40 * pages * 8)
        array("Q", [KPF_BUDDY] * (8 * pages)).tofile(f)
    agent, s = plan_agent(sysfs, procfs, kubernetes=False)
    handle(agent, SysfsReader(sysfs, procfs).read(T))
    virtio_logged(agent, range(40, 48))
    s.kubelet_root = str(tmp_path / "no-kubelet")
    monkeypatch.setattr(module, "PAGE_BUDGET", 3)
    verdicts = []
    for _ in range(3):
        answer = json.loads(s.http("memory=-1Gi")[1])
        verdicts.append(answer["verdict"])
        assert answer["memory"]["short_bytes"] == 0  # not read is never "cannot"
    assert verdicts == ["unknown", "unknown", "safe"]
    assert answer["memory"]["take"] == list(range(47, 39, -1))


def test_the_plan_reads_the_kubelets_checkpoint_from_the_kubelet_sinks_view(agent, sink):
    """The CPU manager's checkpoint the agent hands on reaches the plan through the kubelet
    sink's view (kept once): a static policy makes stopping the kubelet a step."""
    from testkit.forecast import static_policy
    handle(agent, static_policy())
    assert sink.shared.kubelet.view.cpu_checkpoint is not None
    answer = json.loads(sink.http("cpu=-1")[1])
    assert "stop_kubelet" in [a["do"] for a in answer["actions"]], answer["actions"]


def _cpu1(sysfs, online: bool) -> None:
    """cpu1 on or off in the fake tree, as the kernel writes it; no event for the agent."""
    cpu = sysfs / "devices/system/cpu"
    (cpu / "online").write_text("0-1\n" if online else "0\n")
    (cpu / "offline").write_text("\n" if online else "1\n")
    (cpu / "cpu1/online").write_text("1\n" if online else "0\n")


def test_a_plan_is_of_the_kernel_when_asked_not_of_the_agents_last_snapshot(wired, tmp_path):
    """cpu1 came back online a moment ago and the agent's sysfs poll has not seen it: GET /plan
    reads the kernel itself and takes cpu1, with the pods it costs (CI: an exporter a poll
    behind said "1 CPU online, none can be taken", and a memory plan counted pods the kernel
    had CPUs for as rejected). And the other way: a CPU just gone is not offered."""
    agent, sink = wired
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    _cpu1(sysfs, online=False)
    handle(agent, SysfsReader(str(sysfs), str(procfs)).read(T + 1))  # the agent saw it go
    assert json.loads(sink.http("cpu=-1")[1])["cpu"]["take"] == []  # and so did the plan
    _cpu1(sysfs, online=True)  # back, and the agent not told
    answer = json.loads(sink.http("cpu=-1")[1])
    assert answer["cpu"]["take"] == [1], answer["harm"]
    assert sorted(p["name"] for p in answer["pods"]["rejected"]) == ["a", "b"]
    answer = json.loads(sink.http("memory=-256Mi")[1])
    assert answer["pods"]["rejected"] == [] and answer["safe"], answer["harm"]
    handle(agent, SysfsReader(str(sysfs), str(procfs)).read(T + 2))
    _cpu1(sysfs, online=False)  # gone again, and the agent not told
    answer = json.loads(sink.http("cpu=-1")[1])
    assert answer["cpu"]["take"] == [] and not answer["safe"], answer
    assert "1 CPU online" in answer["harm"][0]


def test_a_kernel_that_cannot_be_read_when_asked_is_a_503_not_an_old_answer(wired, tmp_path):
    """The agent read the kernel before; now its CPU list is garbage: no plan on the old read."""
    _, sink = wired
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-zz\n")
    status, body = sink.http("cpu=-1")
    assert status == 503 and "could not be read" in json.loads(body)["error"]
