"""The plan proven by unplugging for real: the reference client (examples/orchestrator.py) in
the lab, acting on GET /plan answers from the exporter in the guest.

The client runs on the host as an orchestrator would: it asks the guest's exporter through the
hostfwd, does the node's steps (sysfs writes) through the lab's guest agent (an orchestrator
would use qemu-guest-agent's guest-set-memory-blocks / guest-set-vcpus, or a node agent), and
the hypervisor's steps over QMP: `device_del` of the DIMM in the slot the plan names, or of the
vCPU in the socket/core/thread the plan names. They share the guest the other scenarios booted:

(d) a plan for a movable DIMM, answered before a second DIMM is hot-added (into ZONE_NORMAL,
    with pipe buffers pinned in it: lab/pin_pages.py), is refused as stale after it: nothing
    is written;
(a) asked again, the movable DIMM is offlined block by block in the plan's order, removed by
    `device_del`, MemTotal shrinks, the exporter records the episode;
(b) the pinned DIMM: the plan refuses it (unmovable pages), and the kernel refuses it (EBUSY)
    when the client tries anyway; the client puts back the blocks it had offlined;
(c) a second hot-added vCPU the plan offers, named by its topology, is offlined and its QEMU
    device (found by socket/core/thread in query-hotpluggable-cpus) removed.

QEMU 7.2 under TCG aborts ("double free or corruption") at the first DIMM or vCPU device_add
after a vCPU's device_del, so every DIMM is added before any vCPU leaves, and the guest has two
hot-pluggable vCPU slots: LAB_ORDER puts (d), (a), (b) after the memory scenarios and (c)
between the in-guest CPU offline/online and the vCPU hot-remove.
"""
from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass, field
from typing import Any

from examples.orchestrator import Action, Executor, PlanClient, Stale, StepFailed, carry_out
from lab.control import EPISODES_ARGV, GUEST_PYTHON, LabGuest
from lab.qemu import GiB
from lab.qmp import CpuSlot
from lab.scenarios import (
    SCENARIOS,
    LabRun,
    Outcome,
    Scenario,
    ScenarioFailed,
    block_range,
    check,
    cpu_count,
    cpu_hot_add,
    cpu_hot_remove,
    hot_add_kernel_dimm,
    online_blocks,
    scenario,
)

MOVABLE_DIMM = "orch-dimm0"
KERNEL_DIMM = "orch-dimm1"
CPU_DEVICE = "orch-cpu1"
MEM = "/sys/devices/system/memory"
CPU = "/sys/devices/system/cpu"


@dataclass
class OrchestratorState:
    """What the scenarios hand on to each other (they share one guest, in order)."""

    dimm_blocks: set[str] = field(default_factory=set)  # the movable DIMM's
    pinned_blocks: list[int] = field(default_factory=list)  # the kernel-zone DIMM's
    pinned: dict[str, Any] = field(default_factory=dict)  # what lab/pin_pages.py reported
    pin_pid: int | None = None


_STATE: dict[int, OrchestratorState] = {}


def state(run: LabRun) -> OrchestratorState:
    return _STATE.setdefault(id(run), OrchestratorState())


# ---------------------------------------------------------------- the client's two sides


class AgentNode:
    """The node's side of the client, through the lab's guest agent: one write(2) each."""

    def __init__(self, lab: LabGuest):
        self.lab = lab
        self.writes: list[tuple[str, str, int]] = []

    def write(self, path: str, value: str) -> None:
        r = self.lab.call("write", path=path, value=value)
        self.writes.append((path, value, r["errno"]))
        if r["errno"]:
            raise OSError(r["errno"], r["error"], path)

    def read(self, path: str) -> str:
        return str(self.lab.call("read", path=path)["value"]).strip()


def qemu_dimm_id(memory_devices: list[dict], device: dict) -> str:
    """The QEMU id of the DIMM a plan names: by its slot (the ACPI name's MPxx), and by its
    start address when the plan gives one (query-memory-devices' addr)."""
    slot, start = device.get("slot"), device.get("start")
    found = [d["data"] for d in memory_devices if d.get("type") == "dimm"
             and d["data"].get("slot") == slot
             and (start is None or d["data"].get("addr") == start)]
    if slot is None or len(found) != 1:
        raise LookupError(f"no single QEMU DIMM in slot {slot} at {start}: {memory_devices}")
    return str(found[0]["id"])


def qemu_cpu_id(slots: list[CpuSlot], place: dict) -> str:
    """The QEMU id of the vCPU a plan names by its topology: the occupied slot of
    query-hotpluggable-cpus whose socket-id/die-id/core-id/thread-id are the guest's
    physical_package_id/die_id/core_id and rank among its thread siblings."""
    want = {"socket-id": place.get("socket"), "die-id": place.get("die"),
            "core-id": place.get("core"), "thread-id": place.get("thread")}
    found = [s for s in slots if not s.free
             and all(s.props.get(k, 0) == v for k, v in want.items()
                     if k in s.props or v not in (None, 0))]
    if len(found) != 1 or found[0].qom_path is None:
        raise LookupError(f"no single occupied QEMU CPU slot at {want}: {slots}")
    prefix = "/machine/peripheral/"
    if not found[0].qom_path.startswith(prefix):
        raise LookupError(f"the CPU at {want} is a boot CPU ({found[0].qom_path}): not unpluggable")
    return found[0].qom_path[len(prefix):]


class QMPHypervisor:
    """The hypervisor's side of the client: device_del of what the plan names."""

    def __init__(self, run: LabRun):
        self.run = run
        self.removed: list[str] = []

    def unplug(self, action: Action) -> None:
        """hypervisor_remove: the DIMM in the plan's slot, or the vCPU at its topology."""
        qmp = self.run.lab.guest.qmp
        assert qmp is not None
        target = device_of(action)
        if action.raw.get("resource") == "memory" and target.get("kind") == "virtio-mem":
            self.lower_virtio_mem(action, target)
        elif action.raw.get("resource") == "memory":
            dimm = qemu_dimm_id(qmp.memory_devices(), target)
            qmp.remove_dimm(dimm, timeout=self.run.budget(90))
            self.removed.append(dimm)
        else:
            cpu = qemu_cpu_id(qmp.hotpluggable_cpus(), target)
            qmp.remove_device(cpu, timeout=self.run.budget(90))
            self.removed.append(cpu)


    def lower_virtio_mem(self, action: Action, target: dict) -> None:
        """hypervisor_remove of a virtio-mem device: its requested-size set as the plan says
        (qom-set), then QEMU's plugged size must reach it; else it is set back (the action's
        hypervisor_rollback) and the step fails, so the client undoes its writes."""
        qmp = self.run.lab.guest.qmp
        assert qmp is not None
        found = [d["data"]["id"] for d in qmp.memory_devices() if d.get("type") == "virtio-mem"
                 and d["data"].get("memaddr") == target.get("start")]
        if len(found) != 1:
            raise ScenarioFailed(f"no one QEMU virtio-mem device at {target.get('start')}: "
                                 f"{found}")
        want = int(action.raw["requested_size_bytes"])
        back = int(action.raw["hypervisor_rollback"]["requested_size_bytes"])
        qmp.set_virtio_mem_size(found[0], want)
        deadline = time.monotonic() + self.run.budget(90)
        while qmp.virtio_mem(found[0])["size"] != want:
            if time.monotonic() > deadline:
                qmp.set_virtio_mem_size(found[0], back)
                raise OSError(errno.EBUSY, f"{found[0]} plugged "
                              f"{qmp.virtio_mem(found[0])['size']}, asked {want}: set back")
            time.sleep(0.2)
        self.removed.append(found[0])


# ---------------------------------------------------------------- the contract, read


def device_of(action: Action) -> dict:
    """What a hypervisor_remove names: a memory `device`, or a `cpu` with its topology."""
    for key in ("device", "cpu"):
        if isinstance(action.raw.get(key), dict):
            return dict(action.raw[key])
    raise ScenarioFailed(f"a hypervisor_remove naming neither device nor cpu: {action.raw}")


def offlined_paths(steps: list[Action]) -> list[str]:
    return [a.path for a in steps if a.do == "write" and a.value in ("offline", "0")]


def blocks_of(paths: list[str]) -> set[str]:
    return {p.split("/")[-2] for p in paths if p.startswith(MEM + "/memory")}


def _episodes(run: LabRun) -> list[dict]:
    """The journal's episodes (`exporter episodes list` in the guest: 10-90 s under TCG)."""
    rc, text = run.lab.run_program(EPISODES_ARGV, "episodes-orchestrator.json", run.budget(240))
    check(rc == 0, f"`exporter episodes list` exited {rc}: "
                   f"{run.lab.artifact('episodes-orchestrator.json.err')[-1500:]}")
    return list(json.loads(text))


def client(run: LabRun) -> PlanClient:
    return PlanClient(run.lab.guest.url, timeout=60, tries=30)


def executor(run: LabRun) -> tuple[Executor, AgentNode, QMPHypervisor]:
    node, hv = AgentNode(run.lab), QMPHypervisor(run)
    return Executor(node, {"hypervisor_remove": hv.unplug}), node, hv


# ---------------------------------------------------------------- (d), (a), (b): memory


def _hot_add_movable_dimm(run: LabRun) -> set[str]:
    lab = run.lab
    before = online_blocks(lab.state())
    lab.guest.qmp.add_dimm(MOVABLE_DIMM, GiB)
    st = run.wait_guest(lambda st: len(online_blocks(st) - before) == 8,
                        "online the 8 blocks of a new DIMM (online_movable)")
    mem = st["mem_total_kb"] * 1024
    run.wait_counts(lambda c: c.capacity("memory") == mem, "capacity = MemTotal with the DIMM")
    return online_blocks(st) - before


def _hot_add_kernel_dimm(run: LabRun) -> list[int]:
    """A DIMM left offline at hot-add, then onlined into ZONE_NORMAL by hand."""
    return sorted(int(name[6:]) for name in hot_add_kernel_dimm(run, KERNEL_DIMM))


def _pin(run: LabRun, blocks: list[int], *flags: str) -> tuple[int, dict]:
    """Start lab/pin_pages.py in the guest (with `flags`) and wait until it holds pages in
    `blocks`."""
    lab = run.lab
    ready = lab.guest.scratch / "pinned.json"
    ready.unlink(missing_ok=True)
    pid = lab.spawn([GUEST_PYTHON, "-m", "lab.pin_pages", "/tmp/scratch/pinned.json",
                     *flags, *map(str, blocks)], "pin_pages.log")
    deadline = time.monotonic() + run.budget(180)
    while not ready.exists():
        if lab.call("poll", pid=pid)["returncode"] is not None:
            raise ScenarioFailed(f"pin_pages exited: {lab.artifact('pin_pages.log')[-1500:]}")
        if time.monotonic() > deadline:
            lab.stop_program(pid)
            raise ScenarioFailed("pin_pages did not pin pages in 180 s")
        time.sleep(0.5)
    return pid, json.loads(ready.read_text())


def _release(run: LabRun) -> None:
    o = state(run)
    if o.pin_pid is not None:
        run.lab.stop_program(o.pin_pid)
        o.pin_pid = None


@scenario("orchestrator: a plan answered before a DIMM hot-add is stale after it")
def orchestrator_stale_plan(run: LabRun, out: Outcome) -> None:
    o = state(run)
    o.dimm_blocks = _hot_add_movable_dimm(run)
    c = client(run)
    early = c.ask(memory="-1Gi")
    steps = early.actions()
    check(early.safe, f"the plan for the movable DIMM is not safe: {early.body}")
    check(blocks_of(offlined_paths(steps)) == o.dimm_blocks,
          f"the plan offlines {sorted(blocks_of(offlined_paths(steps)))}, not the DIMM's "
          f"{sorted(o.dimm_blocks)}")
    current_before = c.is_current(early)
    # The change: a second DIMM, in ZONE_NORMAL, with unmovable pages in it ((b) uses it).
    o.pinned_blocks = _hot_add_kernel_dimm(run)
    o.pin_pid, o.pinned = _pin(run, o.pinned_blocks)
    mem = run.lab.mem_total_bytes()
    run.wait_counts(lambda c: c.capacity("memory") == mem, "capacity = MemTotal, both DIMMs")
    ex, node, _ = executor(run)
    try:
        carry_out(c, early, ex)
        stale = False
    except Stale:
        stale = True
    out.kernel = (f"DIMM {block_range(o.dimm_blocks)} online_movable; then DIMM "
                  f"{block_range({f'memory{n}' for n in o.pinned_blocks})} online_kernel, "
                  f"{o.pinned.get('bytes', 0) >> 20} MiB of pipe buffers pinned "
                  f"(in-use non-LRU pages per block {o.pinned.get('pinned')})")
    out.exporter = (f"generation {early.generation}: current before the hot-add "
                    f"{current_before}, stale after it {stale}; client writes {len(node.writes)}")
    check(current_before, "the plan was already stale before anything changed")
    check(stale, "the client acted on a plan answered before the DIMM hot-add")
    check(node.writes == [], f"the client wrote to a node it knew had changed: {node.writes}")
    check(o.dimm_blocks <= online_blocks(run.lab.state()), "a DIMM block went offline")


@scenario("orchestrator: the movable DIMM the plan offers, offlined and device_del'ed")
def orchestrator_movable_dimm(run: LabRun, out: Outcome) -> None:
    lab, o = run.lab, state(run)
    check(bool(o.dimm_blocks), "no movable DIMM (the stale-plan scenario failed)")
    before_state, before = lab.state(), run.counts()
    c = client(run)
    answer = c.ask(memory="-1Gi")
    ex, node, hv = executor(run)
    done = carry_out(c, answer, ex)
    after_state = run.wait_guest(lambda st: not (o.dimm_blocks & set(st["memory_blocks"])),
                                 f"remove {block_range(o.dimm_blocks)}")
    mem = after_state["mem_total_kb"] * 1024
    after = run.wait_counts(
        lambda c: c.tx("memory", "offline") - before.tx("memory", "offline") >= 8
        and c.capacity("memory") == mem, "8 offline transitions and capacity = MemTotal")
    offlined = [p.split("/")[-2] for p, v, e in node.writes if v == "offline" and not e]
    eps = [e for e in _episodes(run) if e.get("resource") == "memory"]
    recorded = {f"memory{t.get('unit')}" for e in eps for t in e.get("transitions", [])
                if t.get("direction") == "offline" and t.get("result") == "success"}
    d_tx = after.tx("memory", "offline") - before.tx("memory", "offline")
    out.kernel = (f"client offlined {', '.join(offlined)} in that order; device_del "
                  f"{hv.removed}; MemTotal {before_state['mem_total_kb']} -> "
                  f"{after_state['mem_total_kb']} kB")
    out.exporter = (f"{len(done.done)} actions done ({', '.join(a.do for a in done.done)}); "
                    f"offline success +{d_tx:.0f}; episodes "
                    f"hold the offline of {block_range(recorded & o.dimm_blocks) or 'none'}")
    check(set(offlined) == o.dimm_blocks, f"offlined {offlined}, not {sorted(o.dimm_blocks)}")
    check(hv.removed == [MOVABLE_DIMM], f"device_del of {hv.removed}, not {MOVABLE_DIMM}")
    check(before_state["mem_total_kb"] - after_state["mem_total_kb"] == GiB // 1024,
          "MemTotal did not shrink by the DIMM's 1 GiB")
    check(o.dimm_blocks <= recorded, f"the journal's episodes miss offlines of "
          f"{sorted(o.dimm_blocks - recorded)}")


@scenario("orchestrator: a DIMM with unmovable pages: the plan refuses it, the kernel too")
def orchestrator_refused_dimm(run: LabRun, out: Outcome) -> None:
    lab, o = run.lab, state(run)
    try:
        check(o.pin_pid is not None and bool(o.pinned.get("ok")),
              f"no DIMM with pinned pages (the stale-plan scenario): {o.pinned}")
        names = {f"memory{n}" for n in o.pinned_blocks}
        mem_before = lab.mem_total_bytes()
        before = run.counts()
        answer = client(run).ask(memory="-1Gi")
        offered = blocks_of(offlined_paths(answer.actions()))
        # The block itself (unmovable_pages), or its DIMM kept whole by it (device_kept).
        refused = {f"memory{r.get('unit')}" for r in answer.body.get("refusals", [])
                   if r.get("resource") == "memory"
                   and r.get("reason") in ("unmovable_pages", "device_kept")}
        busy = {f"memory{n}" for n, count in o.pinned["pinned"].items() if int(count)}
        # Tried anyway, in the plan's words, the highest block first (so that some blocks are
        # offline when the kernel refuses one, and the rollback has work to do).
        tried = [Action(i, "write", f"{MEM}/{b}/state", "offline",
                        (Action(i, "write", f"{MEM}/{b}/state", "online_kernel"),))
                 for i, b in enumerate(sorted(names, key=lambda b: -int(b[6:])), 1)]
        ex, node, _ = executor(run)
        failed: StepFailed | None = None
        try:
            ex.run(tried)
        except StepFailed as e:
            failed = e
        st = lab.state()
        after = run.wait_counts(lambda c: c.tx("memory", "offline", "failed")
                                - before.tx("memory", "offline", "failed") >= 1,
                                "the refused offline counted as failed")
    finally:
        _release(run)
    cause = failed.cause if failed else None
    d_failed = after.tx("memory", "offline", "failed") - before.tx("memory", "offline", "failed")
    out.kernel = (f"{block_range(names)} online_kernel, pinned pages in {sorted(busy)}; tried "
                  "anyway: " + (f"step {failed.action.order} ({failed.action.path.split('/')[-2]})"
                                f" {errno.errorcode.get(getattr(cause, 'errno', 0), cause)}, "
                                f"{len(failed.rolled_back)} offlined block(s) put back"
                                if failed else "all offlined"))
    out.exporter = (f"plan -1Gi offers {block_range(offered) if offered else 'nothing'}, refuses "
                    f"{block_range(refused & names) if refused & names else 'none of the DIMM'} "
                    f"(unmovable_pages or device_kept); offline failed +{d_failed:.0f}")
    check(not (offered & names), f"the plan offers {sorted(offered & names)} of the pinned DIMM")
    check(bool(busy & refused), f"the plan does not refuse the pinned block(s) {sorted(busy)}: "
          f"refusals {answer.body.get('refusals')}")
    check(failed is not None and getattr(cause, "errno", None) == errno.EBUSY,
          f"the kernel did not refuse with EBUSY: {failed}")
    assert failed is not None
    check(bool(failed.rolled_back) and not failed.rollback_errors,
          f"rolled back {failed.rolled_back}, errors {failed.rollback_errors}")
    check(names <= online_blocks(st), f"blocks left offline after the rollback: "
          f"{sorted(names - online_blocks(st))}")
    check(lab.mem_total_bytes() == mem_before, "MemTotal moved")
    check(d_failed >= 1, "the exporter did not count the refused offline")
    # The DIMM stays: a device_del would have the guest offline its blocks in the kernel's
    # ACPI worker, which loops on any page that cannot move while holding the hotplug lock,
    # and every read of memory-block sysfs files (the agent's `state`) then waits (seen once).


# ---------------------------------------------------------------- (c): a vCPU by topology


def _topology(lab: LabGuest, cpu: int) -> dict[str, int]:
    t = f"{CPU}/cpu{cpu}/topology"
    siblings = lab.call("read", path=f"{t}/thread_siblings_list")["value"].strip()
    first = int(siblings.replace("-", ",").split(",")[0])
    return {"socket": int(lab.call("read", path=f"{t}/physical_package_id")["value"]),
            "die": int(lab.call("read", path=f"{t}/die_id")["value"]),
            "core": int(lab.call("read", path=f"{t}/core_id")["value"]),
            "thread": cpu - first}


@scenario("orchestrator: the vCPU the plan offers, by topology, offlined and device_del'ed")
def orchestrator_cpu(run: LabRun, out: Outcome) -> None:
    """A second vCPU beside the hot-added cpu1 (QEMU fills the highest free core first, so
    cpu1 is core 2 and this one, cpu2, core 1: Linux numbers and QEMU slots differ)."""
    lab = run.lab
    present = cpu_count(lab.state()["cpus_present"])
    slot = lab.guest.qmp.add_cpu(CPU_DEVICE)
    st = run.wait_guest(lambda st: cpu_count(st["cpus_present"]) == present + 1,
                        "make the orchestrator's vCPU present")
    cpu = present  # the next number: cpu0 is the boot CPU, cpu1 the first hot-added
    w = lab.call("write", path=f"{CPU}/cpu{cpu}/online", value="1")  # what udev would do
    check(w["errno"] == 0, f"echo 1 > cpu{cpu}/online: {w['error']}")
    run.wait_counts(lambda c: c.cpus("online") == present + 1, f"{present + 1} CPUs online")
    places = {n: _topology(lab, n) for n in range(1, present + 1)}
    before = run.counts()
    c = client(run)
    answer = c.ask(cpu="-1")
    steps = answer.actions()
    unplug = [a for a in steps if a.do == "hypervisor_remove" and a.raw.get("resource") == "cpu"]
    check(len(unplug) == 1, f"the plan for cpu -1 removes {len(unplug)} vCPUs: {steps}")
    place = device_of(unplug[0])
    ex, node, hv = executor(run)
    carry_out(c, answer, ex)
    st = run.wait_guest(lambda st: cpu_count(st["cpus_present"]) == present,
                        "remove the vCPU the plan named")
    after = run.wait_counts(lambda c: c.cpus("online") == present
                            and c.cpus("present") == present
                            and c.tx("cpu", "offline") - before.tx("cpu", "offline") >= 1,
                            f"{present} CPUs online and present, one offline transition")
    taken = place.get("cpu")
    out.kernel = (f"device_add {slot.props} -> cpu{cpu} {places.get(cpu)}; client wrote "
                  f"{[(p, v) for p, v, _ in node.writes]}, device_del {hv.removed}; present "
                  f"{st['cpus_present']}")
    out.exporter = (f"plan cpu -1 names {json.dumps(place, sort_keys=True)}; cpus online "
                    f"{after.cpus('online'):.0f} present {after.cpus('present'):.0f}")
    check(taken in places, f"the plan names cpu {taken}, not a hot-added one {sorted(places)}")
    check(all(place.get(k) == v for k, v in places[taken].items()),
          f"the plan's topology {place} is not the guest's {places[taken]}")
    check(node.writes[:1] == [(f"{CPU}/cpu{taken}/online", "0", 0)],
          f"the client's first write was {node.writes[:1]}")
    check(taken == cpu and hv.removed == [CPU_DEVICE],
          f"the plan took cpu{taken} (device_del {hv.removed}), not the orchestrator's "
          f"cpu{cpu} ({CPU_DEVICE}): the lab's cpu1 is gone before its own hot-remove")


ORCHESTRATOR_MEMORY: tuple[Scenario, ...] = (
    orchestrator_stale_plan, orchestrator_movable_dimm, orchestrator_refused_dimm)
ORCHESTRATOR_CPU: tuple[Scenario, ...] = (orchestrator_cpu,)
ORCHESTRATOR_SCENARIOS = ORCHESTRATOR_MEMORY + ORCHESTRATOR_CPU


def lab_order() -> tuple[Scenario, ...]:
    """Every scenario in the order one guest runs them: the orchestrator's memory scenarios and
    the virtio ones before any vCPU comes, its vCPU one before the lab's vCPU leaves (QEMU 7.2,
    above)."""
    from lab.scenarios_virtio import SCENARIOS as VIRTIO  # imports lab.scenarios
    order = list(SCENARIOS)
    # virtio-mem and the balloon after the orchestrator's DIMMs and, like them, before any vCPU
    # comes or goes (vmem_and_dimm adds a DIMM).
    order[order.index(cpu_hot_add):order.index(cpu_hot_add)] = (*ORCHESTRATOR_MEMORY, *VIRTIO)
    order[order.index(cpu_hot_remove):order.index(cpu_hot_remove)] = ORCHESTRATOR_CPU
    return tuple(order)


LAB_ORDER = lab_order()
