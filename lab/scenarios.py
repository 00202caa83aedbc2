"""The lab's scenarios: real hotplug in the guest, and what the guest's exporter counted.

Each scenario does one thing to the guest (through QMP or the guest agent), waits until the
kernel has done it (the guest's own sysfs says so), then scrapes the exporter through the
hostfwd until its counters show it, and compares exactly: deltas of
node_resize_kernel_transitions_total, of the duration histogram's _count (BPF records only), the
gauges, and node_resize_kernel_capacity against the guest's MemTotal. The scenarios share one guest
and run in order (the DIMM added first is the one removed later).

`run_all` boots the guest, runs the infrastructure checks and every scenario, and always stops
QEMU; the outcomes carry a one-line account of what the kernel did and what the exporter
counted, for the summary and for the pytest module.
"""
from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab.control import EPISODES_ARGV, GUEST_PYTHON, LabGuest, Scrape
from lab.initramfs import GUEST_PORT
from lab.qemu import GiB, GuestConfig

BUDGET_SECONDS = 1080.0  # the whole lab, boot included, must end inside 18 minutes
DIMM_ID = "dimm0"
CPU_ID = "cpu1"
TX = "node_resize_kernel_transitions_total"
DURATION_COUNT = "node_resize_kernel_transition_duration_seconds_count"
DURATION_SUM = "node_resize_kernel_transition_duration_seconds_sum"
EVENTS = "node_resize_exporter_events_total"


class ScenarioFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ScenarioFailed(message)


@dataclass
class Outcome:
    name: str
    passed: bool = False
    kernel: str = ""  # what the kernel did, from the guest's own sysfs/procfs
    exporter: str = ""  # what the exporter counted
    detail: str = ""  # why it failed
    seconds: float = 0.0


@dataclass
class Counts:
    """The counters a scenario compares, read from one scrape."""

    scrape: Scrape

    def tx(self, resource: str, direction: str, result: str = "success") -> float:
        return self.scrape.value(TX, 0.0, resource=resource, direction=direction, result=result)

    def durations(self, resource: str, direction: str) -> float:
        return self.scrape.value(DURATION_COUNT, 0.0, resource=resource, direction=direction)

    def duration_sum(self, resource: str, direction: str) -> float:
        return self.scrape.value(DURATION_SUM, 0.0, resource=resource, direction=direction)

    def events(self, source: str) -> float:
        return self.scrape.value(EVENTS, 0.0, source=source)

    def capacity(self, resource: str) -> float | None:
        unit = "core" if resource == "cpu" else "byte"
        return self.scrape.value("node_resize_kernel_capacity", None, resource=resource, unit=unit)

    def cpus(self, state: str) -> float | None:
        return self.scrape.value("node_resize_kernel_cpus", None, state=state)

    def blocks(self, state: str) -> float | None:
        return self.scrape.value("node_resize_kernel_memory_blocks", None, state=state)


def online_blocks(state: dict) -> set[str]:
    return {b for b, s in state["memory_blocks"].items() if s == "online"}


def block_range(names: set[str]) -> str:
    nums = sorted(int(n[6:]) for n in names)
    return f"memory{nums[0]}-{nums[-1]}" if len(nums) > 1 else ", ".join(f"memory{n}" for n in nums)


def cpu_count(cpulist: str) -> int:
    """Count CPUs in a kernel cpulist such as "0-1,3" (empty string: none)."""
    total = 0
    for part in filter(None, cpulist.strip().split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


@dataclass
class LabRun:
    """One guest with the exporter, and what the scenarios learnt along the way."""

    lab: LabGuest
    started: float = field(default_factory=time.monotonic)
    boot_mem_kb: int = 0
    dimm_blocks: set[str] = field(default_factory=set)
    refused_block: int | None = None

    def remaining(self) -> float:
        return BUDGET_SECONDS - (time.monotonic() - self.started)

    def budget(self, seconds: float) -> float:
        """A wait's timeout, cut so the whole lab stays inside its budget."""
        left = self.remaining()
        if left <= 1:
            raise ScenarioFailed(f"lab time budget ({BUDGET_SECONDS:.0f}s) used up")
        return min(seconds, left)

    def counts(self) -> Counts:
        return Counts(self.lab.scrape())

    def wait_counts(self, predicate: Callable[[Counts], bool], what: str,
                    timeout: float = 60.0) -> Counts:
        deadline = time.monotonic() + self.budget(timeout)
        while True:
            counts = self.counts()
            if predicate(counts):
                return counts
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"exporter never showed {what} in {timeout:.0f}s; "
                                     f"last scrape (hotplug lines):\n" + "\n".join(
                                         line for line in counts.scrape.text.splitlines()
                                         if "hotplug" in line or "capacity_kernel" in line
                                         and not line.startswith("#")))
            time.sleep(0.5)

    def wait_guest(self, predicate: Callable[[dict], bool], what: str,
                   timeout: float = 60.0) -> dict:
        try:
            return self.lab.wait_guest(predicate, self.budget(timeout), what)
        except TimeoutError as e:
            raise ScenarioFailed(f"the guest kernel did not: {e}") from None

    def episodes(self) -> list[dict]:
        rc, out = self.lab.run_program(EPISODES_ARGV, "episodes.json", self.budget(90))
        check(rc == 0, f"`exporter episodes list` exited {rc}: "
                       f"{self.lab.artifact('episodes.json.err')[-1500:]}")
        return json.loads(out)


def mean_ms(before: Counts, after: Counts, resource: str, direction: str) -> str:
    n = after.durations(resource, direction) - before.durations(resource, direction)
    s = after.duration_sum(resource, direction) - before.duration_sum(resource, direction)
    return f"{1000 * s / n:.1f} ms mean" if n else "no samples"


@dataclass(frozen=True)
class Scenario:
    name: str
    fn: Callable[[LabRun, Outcome], None]  # fills the outcome in as it learns; raises if red

    def run(self, run: LabRun) -> Outcome:
        out = Outcome(self.name)
        t0 = time.monotonic()
        try:
            self.fn(run, out)
            out.passed = True
        except Exception as e:  # a scenario's failure is its outcome; the next ones still run
            out.detail = f"{type(e).__name__}: {e}"
            if not isinstance(e, (AssertionError, RuntimeError, TimeoutError)):
                out.detail += "\n" + traceback.format_exc(limit=-3)
        out.seconds = time.monotonic() - t0
        return out


def scenario(name: str) -> Callable[[Callable[[LabRun, Outcome], None]], Scenario]:
    return lambda fn: Scenario(name, fn)


# ---------------------------------------------------------------- infrastructure


@scenario("hostfwd reaches a guest http.server")
def hostfwd_http(run: LabRun, out: Outcome) -> None:
    """A trivial http.server in the guest answers through the hostfwd on 127.0.0.1."""
    lab = run.lab
    pid = lab.spawn([GUEST_PYTHON, "-m", "http.server", str(GUEST_PORT), "--directory", "/tmp"],
                    "http-server.log")
    try:
        waited = lab.wait_http("/", run.budget(60), pid)
    finally:
        lab.stop_program(pid)
    out.kernel = f"guest python3 http.server on :{GUEST_PORT}"
    out.exporter = f"GET {lab.guest.url}/ -> 200 after {waited:.1f}s"



@scenario("exporter starts in the guest (bpf, uevent, sysfs)")
def exporter_up(run: LabRun, out: Outcome) -> None:
    """The exporter from the checkout runs in the guest with every kernel source up."""
    waited = run.lab.start_exporter(run.budget(300))
    sources = ("bpf", "uevent", "sysfs")

    def source_up(c: Counts) -> dict[str, float | None]:
        return {src: c.scrape.value("node_resize_exporter_source_up", None, source=src)
                for src in sources}

    # Sources report their status as they come up: wait until each one has said something.
    c = run.wait_counts(lambda c: c.capacity("memory") is not None
                        and None not in source_up(c).values(),
                        "a first sysfs snapshot and the status of every source")
    s = c.scrape
    up = source_up(c)
    attached = {dict(lab)["program"]: v for lab, v in
                ((k[1], v) for k, v in s.samples.items()
                 if k[0] == "node_resize_exporter_bpf_program_attached")}
    out.kernel = f"/healthz after {waited:.0f}s (bcc compiles under TCG)"
    out.exporter = (f"source_up {up}; programs attached "
                    f"{sum(1 for v in attached.values() if v == 1)}/{len(attached)}")
    check(all(v == 1 for v in up.values()), f"a source is not up: {up}")
    memory_progs = {p: v for p, v in attached.items() if "pages" in p}
    check(len(memory_progs) == 4 and all(v == 1 for v in memory_progs.values()),
          f"memory kprobes not all attached: {attached}")
    st = run.lab.state()
    run.boot_mem_kb = st["mem_total_kb"]
    check(c.capacity("memory") == st["mem_total_kb"] * 1024,
          f"node_resize_kernel_capacity memory {c.capacity('memory')} != guest MemTotal "
          f"{st['mem_total_kb'] * 1024}")



# ---------------------------------------------------------------- memory


@scenario("memory: hot-add 1 GiB DIMM (online_movable)")
def memory_hot_add(run: LabRun, out: Outcome) -> None:
    lab = run.lab
    before_state, before = lab.state(), run.counts()
    lab.guest.qmp.add_dimm(DIMM_ID, GiB)
    want_online = len(online_blocks(before_state)) + 8
    after_state = run.wait_guest(lambda st: len(online_blocks(st)) == want_online,
                                 f"online 8 more memory blocks (to {want_online})")
    run.dimm_blocks = online_blocks(after_state) - online_blocks(before_state)
    mem = after_state["mem_total_kb"] * 1024
    out.kernel = (f"{block_range(run.dimm_blocks)} online, MemTotal "
                  f"{before_state['mem_total_kb']} -> {after_state['mem_total_kb']} kB")
    after = run.wait_counts(
        lambda c: c.tx("memory", "online") - before.tx("memory", "online") >= 8
        and c.durations("memory", "online") - before.durations("memory", "online") >= 8
        and c.capacity("memory") == mem,
        "8 memory online transitions with durations and capacity = MemTotal")
    d_tx = after.tx("memory", "online") - before.tx("memory", "online")
    d_dur = after.durations("memory", "online") - before.durations("memory", "online")
    d_uev = after.events("uevent") - before.events("uevent")
    d_bpf = after.events("bpf") - before.events("bpf")
    out.exporter = (f"online success +{d_tx:.0f}, BPF durations +{d_dur:.0f} "
                    f"({mean_ms(before, after, 'memory', 'online')}), uevent events "
                    f"+{d_uev:.0f}, bpf events +{d_bpf:.0f}, "
                    f"capacity {after.capacity('memory'):.0f}")
    check(d_tx == 8, f"memory online transitions +{d_tx}, want exactly 8")
    check(d_dur == 8, f"memory online duration samples +{d_dur}, want 8 (one per online_pages)")
    check(d_uev >= 16, f"uevent events +{d_uev}, want >= 16 (8 add + 8 online)")
    check(d_bpf >= 8, f"bpf events +{d_bpf}, want >= 8 online_pages records")
    check(after.blocks("online") == want_online,
          f"node_resize_kernel_memory_blocks online {after.blocks('online')} != {want_online}")
    check(after.tx("memory", "online", "failed") == before.tx("memory", "online", "failed"),
          "a memory online was counted as failed")



@scenario("memory: refused offline of a ZONE_NORMAL boot block")
def memory_refused_offline(run: LabRun, out: Outcome) -> None:
    lab = run.lab
    before_state, before = lab.state(), run.counts()
    r = lab.call("refuse_memory_offline")
    check(r["block"] is not None, f"no boot block was refused: {r}")
    run.refused_block = r["block"]
    extra = len(r["restored"])  # blocks that went offline instead, put straight back online
    out.kernel = (f"offline memory{r['block']} -> {r['error']}"
                  + (f" (also offlined+onlined {r['restored']})" if extra else ""))
    after = run.wait_counts(
        lambda c: c.tx("memory", "offline", "failed")
        - before.tx("memory", "offline", "failed") >= 1
        and c.tx("memory", "offline") - before.tx("memory", "offline") >= extra,
        "the refused memory offline counted as failed")
    d_failed = after.tx("memory", "offline", "failed") - before.tx("memory", "offline", "failed")
    mem = lab.state()["mem_total_kb"] * 1024
    check(mem == before_state["mem_total_kb"] * 1024 or extra, "MemTotal moved on a refusal")
    # The reason lives in the transition the BPF record made; the journal has it.
    failed = [t for ep in run.episodes() for t in ep.get("transitions", [])
              if t.get("resource") == "memory" and t.get("direction") == "offline"
              and t.get("result") == "failed" and t.get("unit") == r["block"]]
    reasons = sorted({f"{t.get('source')}:{t.get('error')}" for t in failed})
    out.exporter = (f"offline failed +{d_failed:.0f}, reason {', '.join(reasons) or 'none'}, "
                    f"capacity {after.capacity('memory'):.0f}")
    check(d_failed == 1, f"memory offline failed +{d_failed}, want exactly 1")
    check(any(t.get("source") == "bpf" and t.get("error") == "EBUSY" for t in failed),
          f"no episode transition for memory{r['block']} offline failed with EBUSY from bpf; "
          f"found {failed}")
    check(after.capacity("memory") == mem,
          f"capacity {after.capacity('memory')} != MemTotal {mem} after the refusal")



@scenario("memory: hot-remove the DIMM")
def memory_hot_remove(run: LabRun, out: Outcome) -> None:
    lab = run.lab
    check(bool(run.dimm_blocks), "no DIMM was added (hot-add scenario failed)")
    before_state, before = lab.state(), run.counts()
    lab.guest.qmp.remove_dimm(DIMM_ID, timeout=run.budget(120))
    after_state = run.wait_guest(lambda st: not (run.dimm_blocks & set(st["memory_blocks"])),
                                 f"remove {block_range(run.dimm_blocks)}")
    mem = after_state["mem_total_kb"] * 1024
    out.kernel = (f"DEVICE_DELETED, {block_range(run.dimm_blocks)} gone, MemTotal "
                  f"{before_state['mem_total_kb']} -> {after_state['mem_total_kb']} kB")
    after = run.wait_counts(
        lambda c: c.tx("memory", "offline") - before.tx("memory", "offline") >= 8
        and c.durations("memory", "offline") - before.durations("memory", "offline") >= 8
        and c.capacity("memory") == mem,
        "8 memory offline transitions with durations and capacity = MemTotal")
    d_tx = after.tx("memory", "offline") - before.tx("memory", "offline")
    d_dur = after.durations("memory", "offline") - before.durations("memory", "offline")
    out.exporter = (f"offline success +{d_tx:.0f}, BPF durations +{d_dur:.0f} "
                    f"({mean_ms(before, after, 'memory', 'offline')}), capacity "
                    f"{after.capacity('memory'):.0f}")
    check(d_tx == 8, f"memory offline transitions +{d_tx}, want exactly 8")
    check(d_dur == 8, f"memory offline duration samples +{d_dur}, want 8")
    check(after_state["mem_total_kb"] == run.boot_mem_kb,
          f"MemTotal {after_state['mem_total_kb']} kB is not back to boot {run.boot_mem_kb} kB")
    check(after.blocks("online") == len(online_blocks(after_state)),
          f"node_resize_kernel_memory_blocks online {after.blocks('online')} != "
          f"{len(online_blocks(after_state))}")



# ---------------------------------------------------------------- before you unplug


def _plan_http(run: LabRun, query: str) -> dict:
    """GET /plan through the hostfwd (2 a second at most: a 429 is waited out)."""
    deadline = time.monotonic() + run.budget(60)
    while True:
        try:
            status, body = run.lab.http_get(f"/plan?{query}", timeout=30)
        except OSError as e:  # urllib raises HTTPError (an OSError) for 4xx
            if getattr(e, "code", None) == 429 and time.monotonic() < deadline:
                time.sleep(1)
                continue
            raise
        check(status == 200, f"GET /plan?{query}: {status}")
        return json.loads(body)


@scenario("plan: the online_movable DIMM can leave (GET /plan, gauges)")
def plan_movable_dimm(run: LabRun, out: Outcome) -> None:
    """After the hot-add, the plan takes the DIMM's blocks (ZONE_MOVABLE, preferred) for
    -1 GiB and calls it safe; the gauges count them. The hot-remove that follows is the
    kernel's answer."""
    check(bool(run.dimm_blocks), "no DIMM was added (hot-add scenario failed)")
    answer = _plan_http(run, "memory=-1Gi")
    taken = {f"memory{n}" for n in answer["memory"]["take"]}
    c = run.wait_counts(lambda c: c.scrape.value("node_resize_memory_hot_added_blocks", None,
                                                 zone="Movable") == len(run.dimm_blocks),
                        "the DIMM's blocks as hot-added into Movable")
    # The gauge is worked out by the plan sink's thread after its inputs change (about a
    # second): a scrape reads the last value.
    try:
        c = run.wait_counts(lambda c: (c.scrape.value(
            "node_resize_unpluggable", None, resource="memory", unit="byte") or 0) >= GiB,
            "unpluggable memory of at least the DIMM", timeout=15)
    except ScenarioFailed:
        pass  # the check below says what it read
    can = c.scrape.value("node_resize_unpluggable", None, resource="memory", unit="byte")
    out.kernel = f"{block_range(run.dimm_blocks)} online_movable"
    out.exporter = (f"plan -1Gi takes {block_range(taken) if taken else 'nothing'}, safe "
                    f"{answer['safe']}; unpluggable memory {can:.0f} bytes")
    check(taken == run.dimm_blocks, f"the plan took {sorted(taken)}, not the DIMM's "
          f"{sorted(run.dimm_blocks)}")
    check(answer["safe"] is True, f"the plan says it would hurt: {answer['harm']}")
    check(can is not None and can >= GiB, f"unpluggable memory {can} < 1 GiB")


NORMAL_DIMM_ID = "dimm1"
AUTO_ONLINE = "/sys/devices/system/memory/auto_online_blocks"


def hot_add_kernel_dimm(run: LabRun, dimm_id: str) -> set[str]:
    """A 1 GiB DIMM left offline at hot-add (auto_online_blocks set to offline meanwhile),
    then onlined into ZONE_NORMAL by hand (online_kernel): its 8 blocks' names."""
    lab = run.lab
    policy = lab.call("read", path=AUTO_ONLINE)["value"].strip()
    check(lab.call("write", path=AUTO_ONLINE, value="offline")["errno"] == 0,
          "cannot set auto_online_blocks")
    try:
        before = set(lab.state()["memory_blocks"])
        lab.guest.qmp.add_dimm(dimm_id, GiB)
        st = run.wait_guest(lambda st: len(set(st["memory_blocks"]) - before) == 8,
                            "8 new (offline) memory blocks")
    finally:
        lab.call("write", path=AUTO_ONLINE, value=policy)
    blocks = set(st["memory_blocks"]) - before
    for name in sorted(blocks):
        r = lab.call("write", path=f"/sys/devices/system/memory/{name}/state",
                     value="online_kernel")
        check(r["errno"] == 0, f"online_kernel {name}: {r['error']}")
    return blocks


@scenario("plan: a DIMM onlined into Normal, then device_del")
def plan_normal_dimm(run: LabRun, out: Outcome) -> None:
    """A DIMM left offline at hot-add and onlined into ZONE_NORMAL by hand (online_kernel):
    the gauges show it hot-added into Normal (the alert's case), and so does the exporter
    restarted afterwards, which never saw the hot-add (the count is the kernel's state: the
    blocks' device links and zones); `plan` (the CLI, reading kpageflags as root) says whether
    its blocks can go, device_del says whether they did, and the count drops when they did."""
    lab = run.lab
    blocks = hot_add_kernel_dimm(run, NORMAL_DIMM_ID)
    zones = {lab.call("read", path=f"/sys/devices/system/memory/{n}/valid_zones")["value"]
             .strip() for n in blocks}
    c = run.wait_counts(lambda c: c.scrape.value("node_resize_memory_hot_added_blocks", None,
                                                 zone="Normal") == 8,
                        "8 hot-added blocks in Normal")
    lab.stop_program(lab.exporter_pid)
    lab.start_exporter(timeout=run.budget(240))
    c = run.wait_counts(lambda c: c.scrape.value("node_resize_memory_hot_added_blocks", None,
                                                 zone="Normal") == 8,
                        "8 hot-added blocks in Normal after a restart")
    rc, text = lab.run_program([GUEST_PYTHON, "-m", "exporter", "plan", "--memory", "-1Gi",
                                "--output", "json", "--kubernetes", "off"],
                               "plan-normal.json", timeout=run.budget(120))
    check(rc in (0, 1), f"plan exited {rc}")
    answer = json.loads(text)
    taken = {f"memory{n}" for n in answer["memory"]["take"]}
    predicted = blocks <= taken
    try:
        lab.guest.qmp.remove_dimm(NORMAL_DIMM_ID, timeout=run.budget(90))
        removed = True
    except (TimeoutError, RuntimeError):
        removed = False  # the guest refused to offline a block: the DIMM stays
    out.kernel = (f"{block_range(blocks)} online in {', '.join(sorted(zones))}; device_del "
                  f"{'done' if removed else 'refused (not ejected)'}")
    added = c.scrape.value("node_resize_memory_hot_added_blocks", None, zone="Normal")
    if removed:
        run.wait_counts(lambda c: c.scrape.value("node_resize_memory_hot_added_blocks", None,
                                                 zone="Normal") is None,
                        "no hot-added block in Normal once the DIMM left")
    out.exporter = (f"hot-added Normal {added:.0f}, {added:.0f} after a restart"
                    f"{', none once it left' if removed else ''}; "
                    f"plan -1Gi takes {block_range(taken) if taken else 'nothing'} "
                    f"({'all of the DIMM' if predicted else 'not all of the DIMM'})")
    check(zones == {"Normal"}, f"valid_zones {zones}")
    check(predicted == removed, f"the plan said the DIMM {'could' if predicted else 'could not'} "
          f"leave, device_del {'did' if removed else 'did not'} remove it")


# ---------------------------------------------------------------- CPU


def _cpu_step(run: LabRun, out: Outcome, direction: str, want_online: int, before: Counts,
              want_present: int | None = None) -> Counts:
    after = run.wait_counts(
        lambda c: c.tx("cpu", direction) - before.tx("cpu", direction) >= 1
        and c.durations("cpu", direction) - before.durations("cpu", direction) >= 1
        and c.cpus("online") == want_online and c.capacity("cpu") == want_online
        and (want_present is None or c.cpus("present") == want_present),
        f"a cpu {direction} transition with its duration, {want_online} CPUs online")
    d_tx = after.tx("cpu", direction) - before.tx("cpu", direction)
    d_dur = after.durations("cpu", direction) - before.durations("cpu", direction)
    out.exporter += (f"{'; ' if out.exporter else ''}{direction} success +{d_tx:.0f}, durations "
                     f"+{d_dur:.0f} ({mean_ms(before, after, 'cpu', direction)}), cpus online "
                     f"{after.cpus('online'):.0f} present {after.cpus('present'):.0f}")
    check(d_tx == 1, f"cpu {direction} transitions +{d_tx}, want exactly 1")
    check(d_dur == 1, f"cpu {direction} duration samples +{d_dur}, want 1")
    check(after.tx("cpu", direction, "failed") == before.tx("cpu", direction, "failed"),
          f"a cpu {direction} counted as failed")
    mem = run.lab.mem_total_bytes()
    check(after.capacity("memory") == mem,
          f"node_resize_kernel_capacity memory {after.capacity('memory')} != MemTotal {mem}")
    return after


@scenario("cpu: hot-add a vCPU and bring it online")
def cpu_hot_add(run: LabRun, out: Outcome) -> None:
    lab = run.lab
    before = run.counts()
    slot = lab.guest.qmp.add_cpu(CPU_ID)
    st = run.wait_guest(lambda st: cpu_count(st["cpus_present"]) == 2, "make cpu1 present")
    # Without udev nothing onlines a hot-added CPU; the lab does what udev's rule would. A
    # hot-added vCPU's first bring-up under TCG took 12 s beside a CPU hog here, and more than
    # 60 s in CI: up to 180 s (the agent prints the kernel's stacks at 30 s).
    w = lab.call("write", run.budget(180), path="/sys/devices/system/cpu/cpu1/online",
                 value="1")
    check(w["errno"] == 0, f"echo 1 > cpu1/online: {w['error']}")
    st = run.wait_guest(lambda st: cpu_count(st["cpus_online"]) == 2, "bring cpu1 online")
    out.kernel = (f"device_add {slot.driver} {slot.props}; cpu1 present, online "
                  f"{st['cpus_online']} ({w['seconds'] * 1000:.0f} ms)")
    _cpu_step(run, out, "online", 2, before, want_present=2)



@scenario("cpu: offline and online cpu1 inside the guest")
def cpu_offline_online_in_guest(run: LabRun, out: Outcome) -> None:
    lab = run.lab
    path = "/sys/devices/system/cpu/cpu1/online"
    before = run.counts()
    off = lab.call("write", path=path, value="0")
    check(off["errno"] == 0, f"echo 0 > cpu1/online: {off['error']}")
    mid = _cpu_step(run, out, "offline", 1, before)
    on = lab.call("write", path=path, value="1")
    check(on["errno"] == 0, f"echo 1 > cpu1/online: {on['error']}")
    out.kernel = (f"echo 0 > cpu1/online ({off['seconds'] * 1000:.0f} ms), "
                  f"echo 1 ({on['seconds'] * 1000:.0f} ms)")
    _cpu_step(run, out, "online", 2, mid)



@scenario("cpu: hot-remove the vCPU")
def cpu_hot_remove(run: LabRun, out: Outcome) -> None:
    lab = run.lab
    before = run.counts()
    lab.guest.qmp.remove_device(CPU_ID, timeout=run.budget(120))
    st = run.wait_guest(lambda st: cpu_count(st["cpus_present"]) == 1, "remove cpu1")
    out.kernel = (f"DEVICE_DELETED; {cpu_count(st['cpus_online'])} online "
                  f"({st['cpus_online']}), {cpu_count(st['cpus_present'])} present")
    _cpu_step(run, out, "offline", 1, before, want_present=1)



@scenario("cpu: transitions joined into episodes with durations")
def cpu_episodes(run: LabRun, out: Outcome) -> None:
    """The correlator turned the CPU transitions into episodes with kernel durations."""
    # An episode's kernel phase ends when its coalescing window (2 s) closes with nothing new.
    deadline = time.monotonic() + run.budget(30)
    while True:
        eps = [e for e in run.episodes() if e.get("resource") == "cpu"]
        if all(e.get("phase") != "kernel" for e in eps) or time.monotonic() > deadline:
            break
        time.sleep(1)
    out.kernel = "vCPU hot-add, offline/online in the guest, hot-remove"

    def kernel_ms(es: list[dict]) -> list[float]:
        return [round(e["kernel_seconds"] * 1000, 1) for e in es
                if e.get("kernel_seconds") is not None]

    # The four transitions come a second or so apart: opposite changes inside the coalescing
    # window are one flapping episode (README, "Flap storms"), else an episode per change.
    # Either way every transition is on an episode, with the kernel's timing.
    moved = {d: sum(1 for e in eps for t in e.get("transitions", []) if t["direction"] == d)
             for d in ("online", "offline")}
    flapping = sum(1 for e in eps if e.get("online_transitions") and e.get("offline_transitions"))
    out.exporter = (f"{len(eps)} episode(s) ({', '.join(e['change'] for e in eps)}; "
                    f"{flapping} flapping), transitions {moved}, kernel {kernel_ms(eps)} ms")
    check(bool(eps), "no cpu episode in the journal")
    for direction, n in moved.items():
        check(n >= 2, f"cpu episodes hold {n} {direction} transitions, fewer than the 2 made: "
              f"{eps}")
    check(all(e.get("kernel_seconds") is not None and e["kernel_seconds"] >= 0 for e in eps),
          f"a cpu episode has no kernel duration: {eps}")
    check(all(t.get("start") is not None for e in eps for t in e.get("transitions", [])),
          f"a cpu episode holds a transition without its BPF timing: {eps}")



INFRASTRUCTURE: tuple[Scenario, ...] = (hostfwd_http, exporter_up)
SCENARIOS: tuple[Scenario, ...] = (
    memory_hot_add, plan_movable_dimm, memory_refused_offline, memory_hot_remove,
    plan_normal_dimm, cpu_hot_add, cpu_offline_online_in_guest, cpu_hot_remove, cpu_episodes,
)


def run_all(out_dir: Path, config: GuestConfig | None = None,
            report: Callable[[Outcome], None] = lambda o: None,
            only: frozenset[str] = frozenset()) -> list[Outcome]:
    """Boot, check the plumbing, run every scenario (or those whose function is named in
    `only`, in the lab's order), stop QEMU. Never raises for a red step."""
    outcomes: list[Outcome] = []

    def record(o: Outcome) -> None:
        outcomes.append(o)
        report(o)

    started = time.monotonic()
    t0 = time.monotonic()
    try:
        lab = LabGuest.boot(out_dir, config)
    except Exception as e:
        record(Outcome("boot", detail=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0))
        return outcomes
    try:
        st = lab.state()
        record(Outcome("boot: 9p root, chroot python, agent", True,
                       kernel=f"MemTotal {st['mem_total_kb']} kB, {cpu_count(st['cpus_online'])} "
                              f"cpu online, "
                              f"{len(st['memory_blocks'])} memory blocks",
                       exporter="guest agent answering over the 9p scratch share",
                       seconds=time.monotonic() - t0))
        run = LabRun(lab, started=started)
        for step in INFRASTRUCTURE:
            o = step.run(run)
            record(o)
            if not o.passed:
                return outcomes  # nothing below can work without the plumbing
        from lab.scenarios_orchestrator import LAB_ORDER  # every scenario, in one order
        for step in LAB_ORDER:
            if not only or step.fn.__name__ in only:
                record(step.run(run))
        if run.remaining() > 60:
            lab.collect()
    finally:
        lab.shutdown()
    return outcomes
