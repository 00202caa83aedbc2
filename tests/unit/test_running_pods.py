"""The running-pods judge (the kubelet's formulas, each kind) and the cgroup parser on
constructed trees of both cgroup versions and drivers, hostile ones included."""
from __future__ import annotations

import pytest

from exporter.correlate.running_pods_view import (
    KINDS,
    RunningPodsView,
    container_oom_score_adj,
    limited_swap,
    possible_oom_score_adjs,
)
from exporter.events import (
    ContainerCgroup,
    ContainerSizing,
    CpuManagerCheckpoint,
    KernelSnapshot,
    MalformedInput,
    PodsRelisted,
    PodStatus,
    RunningContainers,
)
from exporter.kube.convert import pod_status
from exporter.sources.kubelet.running_pods import RunningPodsSource, scan
from testkit.container_cgroups import CID, PAUSE, UID, construct, container_rel, procfs

GI = 1 << 30
CAPACITY = 25276502016  # MemTotal of the recorded v1.36 node (README)


# ---------------------------------------------------------------- the kubelet's formulas


def test_burstable_score_is_the_kubelets_and_goes_stale_when_memory_goes():
    # Recorded on kubelet v1.36: a Burstable pod requesting 2Gi got 916 on this capacity.
    assert container_oom_score_adj("Burstable", 2 * GI, CAPACITY) == 916
    # 36 memory blocks of 128 MiB offline: the kubelet would give a new container 895.
    assert container_oom_score_adj("Burstable", 2 * GI, CAPACITY - 36 * 128 * 2**20) == 895


@pytest.mark.parametrize("qos, request_, critical, want", [
    ("Guaranteed", 2 * GI, False, -997),
    ("BestEffort", 0, False, 1000),
    ("Burstable", 2 * GI, True, -997),  # node-critical: fixed, whatever its QoS
    ("Burstable", 0, False, 999),  # 1000 would tie with BestEffort
    ("Burstable", 2 * CAPACITY, False, 3),  # floor: above Guaranteed's 1000 - 997
    ("Burstable", CAPACITY, False, 3),
])
def test_scores_clamps_and_fixed_classes(qos, request_, critical, want):
    assert container_oom_score_adj(qos, request_, CAPACITY, node_critical=critical) == want


def test_sidecar_score_is_not_above_the_apps():
    # A sidecar asking 64Mi beside an app asking 2Gi gets the app's score.
    assert container_oom_score_adj("Burstable", 64 << 20, CAPACITY,
                                   sidecar_min_request=2 * GI) == 916


def test_tie_break_gate_moves_the_score_a_few_points_down():
    off, on = (container_oom_score_adj("Burstable", 2 * GI, CAPACITY, memory_limit=2 * GI,
                                       tie_break=tb) for tb in (False, True))
    assert off == 916 and 900 < on < off
    assert possible_oom_score_adjs("Burstable", 2 * GI, CAPACITY, memory_limit=2 * GI) == {off, on}


def test_limited_swap_share():
    assert limited_swap("Burstable", 2 * GI, 4 * GI, 16 * GI, 8 * GI) == GI
    assert limited_swap("Burstable", 2 * GI, 2 * GI, 16 * GI, 8 * GI) == 0  # request == limit
    assert limited_swap("Guaranteed", 2 * GI, 2 * GI, 16 * GI, 8 * GI) == 0
    assert limited_swap("Burstable", 2 * GI, 4 * GI, 16 * GI, 8 * GI, node_critical=True) == 0


# ---------------------------------------------------------------- the view, kind by kind


def snap(online=frozenset({0, 1}), mem=CAPACITY, swap=0) -> KernelSnapshot:
    return KernelSnapshot(1.0, frozenset(online), frozenset({0, 1}) - frozenset(online),
                          frozenset({0, 1}), frozenset({0, 1}), 0, frozenset(), frozenset(),
                          mem, swap)


def pod(qos="Burstable", request=2 * GI, limit=4 * GI) -> PodStatus:
    return PodStatus(1.0, UID, "shop", "cart-0", "Running", "", True, qos_class=qos,
                     containers=(ContainerSizing("cart", CID, request, limit),))


def view_of(*events) -> RunningPodsView:
    view = RunningPodsView()
    for event in events:
        view.handle(event)
    return view


def cgroup(**values) -> RunningContainers:
    return RunningContainers(1.0, 1, (ContainerCgroup(UID, CID, "burstable", **values),))


def test_nothing_before_a_scan_and_a_snapshot():
    assert view_of(snap()).counts() == {}
    assert view_of(cgroup(oom_score_adj=916)).counts() == {}


def test_oom_score_adj_stale_after_memory_goes():
    view = view_of(snap(), pod(), cgroup(oom_score_adj=916))
    assert view.counts() == dict.fromkeys(KINDS, 0)
    view.handle(snap(mem=CAPACITY - 36 * 128 * 2**20))
    assert view.counts()["oom_score_adj"] == 1
    [finding] = view.findings()
    assert finding.line() == ("shop/cart-0 cart: oom_score_adj 916, the kubelet would set "
                              f"895 on today's {CAPACITY - 36 * 128 * 2**20} bytes")


def test_oom_score_adj_not_judged_without_the_pod_or_for_fixed_classes():
    assert view_of(snap(mem=GI), cgroup(oom_score_adj=916)).counts()["oom_score_adj"] == 0
    assert view_of(snap(mem=GI), pod(qos="Guaranteed"),
                   cgroup(oom_score_adj=-997)).counts()["oom_score_adj"] == 0
    # the sandbox's pause process (-998) is no container of the pod's
    sandbox = RunningContainers(1.0, 1, (ContainerCgroup(UID, PAUSE, "burstable", -998),))
    assert view_of(snap(mem=GI), pod(), sandbox).counts()["oom_score_adj"] == 0


def test_pods_deleted_or_gone_in_a_relist_are_forgotten():
    view = view_of(snap(), snap(mem=GI), pod(), cgroup(oom_score_adj=916))
    assert view.counts()["oom_score_adj"] == 1
    view.handle(PodsRelisted(2.0, frozenset()))
    assert view.counts()["oom_score_adj"] == 0


def test_cpusets_offline_and_missing():
    assert view_of(snap({0}), cgroup(cpus=frozenset({0, 1}))).counts()["cpuset_offline"] == 1
    counts = view_of(snap({0, 1}), cgroup(cpus=frozenset({0}))).counts()
    assert (counts["cpuset_offline"], counts["cpuset_missing"]) == (0, 1)


def test_exclusive_cpus_are_not_missing_from_the_shared_pool():
    checkpoint = CpuManagerCheckpoint(1.0, "/x", True, "static", frozenset({0}),
                                      frozenset({1}))
    # a container holding cpu1 exclusively lacks cpu0 by design; a shared one lacks nothing
    assert view_of(snap(), checkpoint, cgroup(cpus=frozenset({1}))).counts()[
        "cpuset_missing"] == 0
    assert view_of(snap(), checkpoint, cgroup(cpus=frozenset({0}))).counts()[
        "cpuset_missing"] == 0


def test_limits_above_what_the_node_has():
    counts = view_of(snap({0}), cgroup(cpu_limit=2.0, memory_limit=CAPACITY + 1)).counts()
    assert counts["cpu_limit_above_online"] == 1
    assert counts["memory_limit_above_capacity"] == 1
    counts = view_of(snap({0, 1}), cgroup(cpu_limit=2.0, memory_limit=CAPACITY)).counts()
    assert counts["cpu_limit_above_online"] == counts["memory_limit_above_capacity"] == 0


def test_swap_limit_from_another_capacity():
    share = limited_swap("Burstable", 2 * GI, 4 * GI, CAPACITY, 8 * GI)
    ok = view_of(snap(swap=8 * GI), pod(), cgroup(swap_limit=share // 4096 * 4096))
    assert ok.counts()["swap_limit"] == 0
    stale = view_of(snap(mem=CAPACITY // 2, swap=8 * GI), pod(), cgroup(swap_limit=share))
    assert stale.counts()["swap_limit"] == 1
    assert view_of(snap(), pod(), cgroup(swap_limit=0)).counts()["swap_limit"] == 0


# ---------------------------------------------------------------- the pod watch's side


def test_pod_status_carries_qos_and_container_sizing():
    obj = {"metadata": {"uid": UID, "name": "cart-0", "namespace": "shop"},
           "spec": {"priorityClassName": "system-node-critical",
                    "containers": [{"name": "cart", "resources": {
                        "requests": {"memory": "1Gi"}, "limits": {"memory": "4Gi"}}}],
                    "initContainers": [
                        {"name": "log", "restartPolicy": "Always",
                         "resources": {"limits": {"memory": "64Mi"}}},
                        {"name": "setup"}]},
           "status": {"qosClass": "Burstable", "containerStatuses": [
               {"name": "cart", "containerID": f"containerd://{CID}",
                "allocatedResources": {"memory": "2Gi"}}],
               "initContainerStatuses": [{"name": "log", "containerID": "cri-o://../etc"}]}}
    event = pod_status(obj, 1.0, None).event
    assert event.qos_class == "Burstable" and event.node_critical
    assert event.containers == (
        ContainerSizing("cart", CID, 2 * GI, 4 * GI),  # allocated, not the spec's 1Gi
        ContainerSizing("log", "", 64 << 20, 64 << 20, sidecar=True))  # hostile id dropped


# ---------------------------------------------------------------- the cgroup parser


V1_FILES = {"cgroup.procs": "4242\n4241\n", "cpuset.cpus": "0-1\n",
            "cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n",
            "memory.limit_in_bytes": "4294967296\n",
            "memory.memsw.limit_in_bytes": "4294967296\n"}
V2_FILES = {"cgroup.procs": "4242\n4241\n", "cpuset.cpus.effective": "0-1\n",
            "cpu.max": "150000 100000\n", "memory.max": "4294967296\n",
            "memory.swap.max": "1073741824\n"}


@pytest.mark.parametrize("version, driver", [(1, "cgroupfs"), (1, "systemd"), (2, "systemd"),
                                             (2, "cgroupfs")])
def test_reads_every_value_in_every_layout(tmp_path, version, driver):
    files = V1_FILES if version == 1 else V2_FILES
    root = construct(tmp_path / "cg", version, driver, [
        ("burstable", UID, CID, files),
        ("guaranteed", UID.replace("1", "2"), PAUSE, {"cgroup.procs": ""})])
    proc = procfs(tmp_path / "proc", {4241: 916, 4242: 0})
    event = scan(root, proc, 5.0)
    assert (event.cgroup_version, event.truncated, event.skipped) == (version, False, 0)
    by_id = {c.container_id: c for c in event.containers}
    assert by_id[CID] == ContainerCgroup(
        UID, CID, "burstable", oom_score_adj=916,  # the lowest PID's
        cpus=frozenset({0, 1}), cpu_limit=1.5, memory_limit=4 * GI,
        swap_limit=0 if version == 1 else GI)
    assert by_id[PAUSE].qos == "guaranteed" and by_id[PAUSE].oom_score_adj is None


def test_unlimited_values_are_none(tmp_path):
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("besteffort", UID, CID, {
        "cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n",
        "memory.limit_in_bytes": "9223372036854771712\n"})])
    [c] = scan(root, tmp_path, 1.0).containers
    assert (c.cpu_limit, c.memory_limit, c.swap_limit) == (None, None, None)
    root = construct(tmp_path / "v2", 2, "systemd", [("besteffort", UID, CID, {
        "cpu.max": "max 100000\n", "memory.max": "max\n", "memory.swap.max": "max\n"})])
    [c] = scan(root, tmp_path, 1.0).containers
    assert (c.cpu_limit, c.memory_limit, c.swap_limit) == (None, None, None)


def test_a_process_that_exited_while_read_is_skipped_silently(tmp_path):
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cgroup.procs": "10\n11\n12\n"})])
    proc = procfs(tmp_path / "proc", {12: 500})  # 10 and 11 are gone
    event = scan(root, proc, 1.0)
    assert event.skipped == 0 and event.containers[0].oom_score_adj == 500


@pytest.mark.parametrize("name, text", [
    ("cpuset.cpus", "0-4294967295"), ("cpu.cfs_quota_us", "lots"),
    ("memory.limit_in_bytes", "-5"), ("cgroup.procs", "12\nnot-a-pid\n"),
    ("cgroup.procs", "1\n" * 40000),  # more than the bytes read of it
])
def test_hostile_files_are_counted_and_skipped(tmp_path, name, text):
    root = construct(tmp_path / "cg", 1, "cgroupfs", [
        ("burstable", UID, CID, {"cgroup.procs": "", "cpu.cfs_period_us": "100000", name: text}),
        ("burstable", UID, PAUSE, {"cpuset.cpus": "0", "cgroup.procs": ""})])
    problems: list[str] = []
    event = scan(root, tmp_path, 1.0, problems=problems)
    assert event.skipped == 1 and [c.container_id for c in event.containers] == [PAUSE]
    assert len(problems) == 1


def test_an_unreadable_file_is_counted(tmp_path):
    root = construct(tmp_path / "cg", 2, "systemd", [("burstable", UID, CID, {})])
    (root / "kubepods.slice/kubepods-burstable.slice").mkdir(exist_ok=True)
    (root / container_rel(2, "systemd", "burstable", UID, CID) / "memory.max").mkdir()
    assert scan(root, tmp_path, 1.0).skipped == 1


def test_a_huge_tree_is_scanned_within_its_budget(tmp_path):
    root = construct(tmp_path / "cg", 1, "cgroupfs", [
        ("burstable", f"{UID[:-4]}{i:04x}", f"{i:064x}", {}) for i in range(300)])
    # the kernel's runtime names only; directories of other names are not containers
    (root / "memory/kubepods/burstable/not-a-pod").mkdir()
    (root / "memory/kubepods/burstable" / f"pod{UID}" / "crio-conmon-" f"{CID}.scope").mkdir(
        parents=True)
    event = scan(root, tmp_path, 1.0, max_containers=100)
    assert event.truncated and len(event.containers) == 100
    assert len(scan(root, tmp_path, 1.0).containers) == 300


def test_no_kubepods_is_version_0(tmp_path):
    assert scan(tmp_path, tmp_path, 1.0) == RunningContainers(1.0, 0)


def test_source_emits_a_scan_when_it_changes_and_counts_what_it_skipped(tmp_path):
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cpuset.cpus": "0-1"})])

    class Clock:
        def now(self):
            return 1.0

    source = RunningPodsSource(Clock(), str(root), str(tmp_path), min_interval=0.001)
    got: list = []
    try:
        source.read(got.append)
        source.read(got.append)  # nothing changed: nothing emitted
        assert [type(e) for e in got] == [RunningContainers]
        (root / "cpuset" / "kubepods/burstable" / f"pod{UID}" / CID / "cpuset.cpus").write_text(
            "zero")
        source.read(got.append)
        assert [type(e) for e in got[1:]] == [MalformedInput, RunningContainers]
        assert got[2].skipped == 1
    finally:
        source.close()


def test_no_kubepods_cgroup_is_the_source_down_not_an_empty_scan(tmp_path):
    """Issue 35 item 1: no kubepods cgroup under --cgroup-root is "not read" (the source
    down, saying why; no scan handed on, so no series), never "no container is stale"."""
    from exporter.events import SourceStatus

    class Clock:
        def now(self):
            return 1.0

    source = RunningPodsSource(Clock(), str(tmp_path / "cg"), str(tmp_path), min_interval=0.001)
    got: list = []
    try:
        source.read(got.append)
        [down] = got
        assert isinstance(down, SourceStatus) and not down.up
        assert "no kubepods cgroup found" in down.reason and "--cgroup-root" in down.reason
        construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
            "cpuset.cpus": "0-1"})])
        source.read(got.append)
        assert [type(e) for e in got[1:]] == [SourceStatus, RunningContainers]
        assert got[1].up
        rmdir = __import__("shutil").rmtree
        rmdir(tmp_path / "cg")  # gone again: down, and one empty scan clears the last
        source.read(got.append)
        assert [type(e) for e in got[3:]] == [SourceStatus, RunningContainers]
        assert not got[3].up and got[4].cgroup_version == 0
    finally:
        source.close()


# ---------------------------------------------------------------- check


def test_check_names_stale_containers_and_the_fix(tmp_path):
    from exporter.config.options import Options
    from exporter.sinks.running_pods_collector import check_running_pods
    sys_ = tmp_path / "sys/devices/system/cpu"
    sys_.mkdir(parents=True)
    for name, text in (("online", "0"), ("offline", "1"), ("present", "0-1"),
                       ("possible", "0-1")):
        (sys_ / name).write_text(text + "\n")
    # 182 blocks of 128 MiB offline: with them the node had the ~23.8 GiB the kubelet gave
    # the container its 916 for
    memory = tmp_path / "sys/devices/system/memory"
    memory.mkdir(parents=True)
    (memory / "block_size_bytes").write_text(f"{128 << 20:x}\n")
    for n in range(190):
        (memory / f"memory{n}").mkdir()
        (memory / f"memory{n}/state").write_text("online\n" if n < 8 else "offline\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1048576 kB\nSwapTotal: 0 kB\n")
    procfs(tmp_path / "proc", {4242: 916})
    construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cgroup.procs": "4242\n", "cpuset.cpus": "0-1\n", "cpu.cfs_quota_us": "200000\n",
        "cpu.cfs_period_us": "100000\n", "memory.limit_in_bytes": str(4 * GI)})])
    options = Options(sysfs_root=str(tmp_path / "sys"), procfs_root=str(tmp_path / "proc"),
                      cgroup_root=str(tmp_path / "cg"))
    check = check_running_pods(options, pods=[pod()])
    assert check.status == "warn"
    assert check.detail.startswith(
        "4 finding(s) in running containers the kubelet would not create so today "
        "(oom_score_adj 1, cpuset_offline 1, cpu_limit_above_online 1, "
        "memory_limit_above_capacity 1; 1 container cgroups (cgroup v1)):")
    assert "oom_score_adj: shop/cart-0 cart: oom_score_adj 916, the kubelet would set 3" \
        in check.detail
    assert check.fix.startswith("restart the pod")
    empty = Options(sysfs_root=str(tmp_path / "sys"), procfs_root=str(tmp_path / "proc"),
                    cgroup_root=str(tmp_path / "none"))
    check = check_running_pods(empty, pods=[])  # nothing seen: not "none stale"
    assert check.status == "warn" and "no kubepods cgroup found" in check.detail
    assert "--cgroup-root" in check.fix


def test_without_a_checkpoint_cpus_only_guaranteed_containers_hold_are_exclusive():
    exclusive = ContainerCgroup("g", "1" * 64, "guaranteed", cpus=frozenset({1}))
    shared = ContainerCgroup(UID, CID, "burstable", cpus=frozenset({0}))
    scan_ = RunningContainers(1.0, 1, (exclusive, shared))
    assert view_of(snap(), scan_).counts()["cpuset_missing"] == 0
    # under the none policy (every container on every CPU) a CPU nobody has is missing
    lost = RunningContainers(1.0, 1, (ContainerCgroup("g", "1" * 64, "guaranteed",
                                                      cpus=frozenset({0})), shared))
    assert view_of(snap(), lost).counts()["cpuset_missing"] == 2


# ---------------------------------------------------------------- hostile trees, third round


def _scan_in_thread(*args, **kwargs):
    """scan() in a thread, so a read that blocks fails the test instead of hanging it."""
    import threading
    out: list = []
    t = threading.Thread(target=lambda: out.append(scan(*args, **kwargs)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the scan blocked"
    return out[0]


@pytest.mark.parametrize("name", ["cgroup.procs", "cpuset.cpus", "memory.limit_in_bytes"])
def test_a_fifo_in_the_cgroup_tree_is_refused_without_blocking(tmp_path, name):
    import os
    root = construct(tmp_path / "cg", 1, "cgroupfs", [
        ("burstable", UID, CID, {"cgroup.procs": "", "cpu.cfs_period_us": "100000"}),
        ("burstable", UID, PAUSE, {"cpuset.cpus": "0", "cgroup.procs": ""})])
    rel = container_rel(1, "cgroupfs", "burstable", UID, CID)
    from testkit.container_cgroups import _controller
    path = root / _controller(name) / rel / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path)  # no writer: a plain open() waits for one for ever
    problems: list[str] = []
    event = _scan_in_thread(root, tmp_path, 1.0, problems=problems)
    assert event.skipped == 1 and [c.container_id for c in event.containers] == [PAUSE]
    assert "not a regular file (a FIFO)" in problems[0]


def test_a_link_in_the_cgroup_tree_is_not_followed(tmp_path):
    secret = tmp_path / "elsewhere"
    secret.write_text("4096\n")
    root = construct(tmp_path / "cg", 2, "systemd", [("burstable", UID, CID, {})])
    (root / container_rel(2, "systemd", "burstable", UID, CID) / "memory.max").symlink_to(
        secret)
    assert _scan_in_thread(root, tmp_path, 1.0).skipped == 1


def test_a_scan_out_of_time_reports_the_source_down_until_one_completes(tmp_path):
    from exporter.events import SourceStatus
    root = construct(tmp_path / "cg", 1, "cgroupfs", [
        ("burstable", f"{UID[:-4]}{i:04x}", f"{i:064x}", {"cpuset.cpus": "0-1"})
        for i in range(50)])

    class Clock:
        def now(self):
            return 1.0

    source = RunningPodsSource(Clock(), str(root), str(tmp_path), min_interval=0.001,
                               seconds=0.0)
    got: list = []
    try:
        source.read(got.append)  # a budget of nothing: it stops inside the first container
        [down] = [e for e in got if isinstance(e, SourceStatus)]
        assert not down.up and "did not complete within its 0 s budget" in down.reason
        [scanned] = [e for e in got if isinstance(e, RunningContainers)]
        assert scanned.truncated and len(scanned.containers) < 50
        [bad] = [e for e in got if isinstance(e, MalformedInput)]
        assert "time budget" in bad.detail
        got.clear()
        source.read(got.append)  # still short: said once
        assert not [e for e in got if isinstance(e, SourceStatus)]
        source.seconds = 60.0
        source.read(got.append)
        [up] = [e for e in got if isinstance(e, SourceStatus)]
        assert up.up
        [scanned] = [e for e in got if isinstance(e, RunningContainers)]
        assert not scanned.truncated and len(scanned.containers) == 50
    finally:
        source.close()


def test_a_huge_cpuset_is_refused_and_equal_ones_share_one_set(tmp_path):
    import tracemalloc
    containers = [("burstable", f"{UID[:-4]}{i:04x}", f"{i:064x}", {"cpuset.cpus": "0-8191\n"})
                  for i in range(300)]
    containers.append(("burstable", UID, CID, {"cpuset.cpus": "0-65535\n"}))
    root = construct(tmp_path / "cg", 1, "cgroupfs", containers)
    tracemalloc.start()
    try:
        problems: list[str] = []
        event = scan(root, tmp_path, 1.0, problems=problems)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert event.skipped == 1 and "0-65535" in problems[0]
    assert len(event.containers) == 300
    first = event.containers[0].cpus
    assert len(first) == 8192 and all(c.cpus is first for c in event.containers)
    # one set of 8192 ints, not 300 of them (~140 MiB); the scan's own strings besides
    assert peak < 16 * 2**20, peak


def test_names_with_a_trailing_newline_are_not_the_container(tmp_path):
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cgroup.procs": ""})])
    pod_dir = root / "memory/kubepods/burstable" / f"pod{UID}"
    (pod_dir / f"{CID}\n").mkdir()
    (root / "memory/kubepods/burstable" / f"pod{UID}\n" / CID).mkdir(parents=True)
    event = scan(root, tmp_path, 1.0)
    assert [(c.pod_uid, c.container_id) for c in event.containers] == [(UID, CID)]


# ---------------------------------------------------------------- a tenant's own OOM score


@pytest.fixture
def sleeper():
    import subprocess
    proc = subprocess.Popen(["sleep", "3600"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _write_adj(pid: int, value: int) -> None:
    from pathlib import Path
    Path(f"/proc/{pid}/oom_score_adj").write_text(str(value))


def test_a_process_raising_its_own_oom_score_is_not_a_stale_container(tmp_path, sleeper):
    """998 -> 999 by the process itself, no resize: never counted, neither by a view that saw
    998 first nor by one (a fresh `check`) that only sees 999."""
    capacity = 16 * GI
    request = capacity * 25 // 10000  # 1000 * request / capacity = 2.5: the kubelet sets 998
    assert possible_oom_score_adjs("Burstable", request, capacity) == {998}
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cgroup.procs": f"{sleeper}\n"})])
    _write_adj(sleeper, 998)
    view = view_of(snap(mem=capacity), pod(request=request), scan(root, "/proc", 1.0))
    assert view.scan.containers[0].oom_score_adj == 998
    assert view.counts()["oom_score_adj"] == 0
    _write_adj(sleeper, 999)  # the tenant's own doing
    view.handle(scan(root, "/proc", 2.0))
    assert view.scan.containers[0].oom_score_adj == 999
    assert view.counts()["oom_score_adj"] == 0
    fresh = view_of(snap(mem=capacity), pod(request=request), scan(root, "/proc", 3.0))
    assert fresh.counts()["oom_score_adj"] == 0
    # The same 999 after memory really went (the kubelet computed 999 for the capacity the
    # node had before): stale.
    bigger = capacity * 2  # 1000 * request / bigger = 1.25: 999
    resized = view_of(snap(mem=bigger), snap(mem=capacity), pod(request=request),
                      scan(root, "/proc", 4.0))
    assert resized.counts()["oom_score_adj"] == 1


def test_a_score_moved_by_the_process_is_its_own_even_beside_offline_memory(tmp_path, sleeper):
    """Memory blocks offline since boot (the kubelet may have seen them online): the view saw
    the container at 998, the kubelet's; 999 later, with no capacity change, is the process's
    own, though the kubelet would compute 999 with the offline blocks back."""
    capacity = 16 * GI
    request = capacity * 25 // 10000
    block = 128 << 20
    offline = frozenset(range(128, 168))  # 40 blocks: 21 GiB with them, where 999 is due
    assert 999 in possible_oom_score_adjs("Burstable", request, capacity + 40 * block)
    booted = KernelSnapshot(1.0, frozenset({0, 1}), frozenset(), frozenset({0, 1}),
                            frozenset({0, 1}), block, frozenset(range(128)), offline,
                            capacity, 0)
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cgroup.procs": f"{sleeper}\n"})])
    _write_adj(sleeper, 998)
    view = view_of(booted, pod(request=request), scan(root, "/proc", 1.0))
    assert view.counts()["oom_score_adj"] == 0
    _write_adj(sleeper, 999)
    view.handle(scan(root, "/proc", 2.0))
    assert view.counts()["oom_score_adj"] == 0


def test_a_score_that_is_no_capacitys_is_not_blamed_on_a_resize(tmp_path, sleeper):
    """After a real resize, a score the kubelet computes for neither capacity (a tenant's
    -500 in a Burstable container) is not counted as left stale by it."""
    capacity = 16 * GI
    request = capacity * 25 // 10000
    root = construct(tmp_path / "cg", 1, "cgroupfs", [("burstable", UID, CID, {
        "cgroup.procs": f"{sleeper}\n"})])
    _write_adj(sleeper, 500)
    view = view_of(snap(mem=capacity * 2), snap(mem=capacity), pod(request=request),
                   scan(root, "/proc", 1.0))
    assert view.counts()["oom_score_adj"] == 0


def test_a_scan_still_running_past_its_budget_is_down_until_it_completes(tmp_path):
    """The watchdog, for a read the kernel holds (the budget cannot be checked inside a read
    that does not return): here a scan of 2,000 real containers overdue after a millisecond
    says down from the timer's thread, then up when it ends."""
    import threading

    from exporter.events import SourceStatus
    root = construct(tmp_path / "cg", 1, "cgroupfs", [
        ("burstable", f"{UID[:-4]}{i % 65536:04x}", f"{i:064x}", {"cpuset.cpus": "0-1"})
        for i in range(2000)])

    class Clock:
        def now(self):
            return 1.0

    source = RunningPodsSource(Clock(), str(root), str(tmp_path), min_interval=0.001,
                               seconds=60.0, watchdog_grace=-59.999)
    got: list = []
    lock = threading.Lock()

    def emit(event):
        with lock:
            got.append(event)
    try:
        source.read(emit)
    finally:
        source.close()
    statuses = [e for e in got if isinstance(e, SourceStatus)]
    assert [s.up for s in statuses] == [False, True]
    assert "has not completed in 0.001 s" in statuses[0].reason
    [scanned] = [e for e in got if isinstance(e, RunningContainers)]
    assert not scanned.truncated and len(scanned.containers) == 2000


def test_check_ends_with_a_fifo_in_the_cgroup_tree(tmp_path):
    """`check` scanned the tree with the same reads: a FIFO there once kept it waiting for ever."""
    import os
    import threading

    from exporter.config.options import Options
    from exporter.sinks.running_pods_collector import check_running_pods
    from exporter.sources import registry

    registry.load()
    cpu = tmp_path / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    for name, text in (("online", "0-1"), ("offline", ""), ("present", "0-1"),
                       ("possible", "0-1")):
        (cpu / name).write_text(text + "\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1048576 kB\nSwapTotal: 0 kB\n")
    root = construct(tmp_path / "cg", 2, "systemd", [("burstable", UID, CID, {})])
    os.mkfifo(root / container_rel(2, "systemd", "burstable", UID, CID) / "cgroup.procs")
    options = Options(sysfs_root=str(tmp_path / "sys"), procfs_root=str(tmp_path / "proc"),
                      cgroup_root=str(root))
    out: list = []
    t = threading.Thread(target=lambda: out.append(check_running_pods(options, pods=[])),
                         daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "check blocked on the FIFO"
    assert "1 unreadable" in out[0].detail and "not a regular file (a FIFO)" in out[0].detail


def test_cpusets_are_shared_by_value_and_bounded_whatever_their_text(tmp_path):
    """L6 (issue 36): 1,000 containers whose cpusets are written differently but name the same
    CPUs (`0-8191,N`) share one set: a few MiB, not the +748 MiB of one set per text. Distinct
    sets are bounded too: a tree whose every container names its own 8,191 CPUs costs at most
    MEMBERS_PER_SCAN CPUs of sets, the containers past it unreadable (counted), not memory."""
    import tracemalloc

    from exporter.sources.kubelet import running_pods

    def scanned(cpuset) -> tuple[object, int, list[str]]:
        containers = [("burstable", f"{UID[:-4]}{i:04x}", f"{i:064x}",
                       {"cpuset.cpus": cpuset(i)}) for i in range(1000)]
        root = construct(tmp_path / f"cg{len(list(tmp_path.iterdir()))}", 1, "cgroupfs",
                         containers)
        problems: list[str] = []
        tracemalloc.start()
        try:
            event = scan(root, tmp_path, 1.0, problems=problems, seconds=60)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return event, peak, problems

    event, peak, _ = scanned(lambda i: f"0-8191,{i}\n")
    assert len(event.containers) == 1000 and event.skipped == 0
    first = event.containers[0].cpus
    assert len(first) == running_pods.NR_CPUS_MAX
    assert all(c.cpus is first for c in event.containers)
    assert peak < 16 * 2**20, peak
    event, peak, problems = scanned(lambda i: f"0-{i},{i + 2}-8191\n")  # all distinct
    held = sum(len(s) for s in {id(c.cpus): c.cpus for c in event.containers}.values())
    assert held <= running_pods.MEMBERS_PER_SCAN
    assert event.skipped == 1000 - len(event.containers) > 0
    assert "distinct cpusets" in problems[0]
    assert peak < 32 * 2**20, peak
