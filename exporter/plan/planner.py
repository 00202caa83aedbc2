"""Before you unplug: which CPUs and memory blocks to take, what the kernel would refuse, which
pods the kubelet would reject at its next restart, which running containers would be left
stale, and whether the kubelet restarts at all afterwards. Pure: inputs in, a Plan out; the
only I/O is the page-flags reader the caller may hand in (bounded by its budget).

The verdicts are the exporter's own, run on a hypothetical kernel snapshot (the one the change
would leave), not copies:
- pods: the readmission forecast (exporter/correlate/readmission_forecast.py);
- running containers: the running-pods judge (exporter/correlate/running_pods_view.py), with the
  cpusets the kernel would leave (an offlined CPU leaves every cpuset), plus containers pinned
  exclusively to a CPU that goes;
- the kubelet's restart: its CPU and memory manager checkpoints against what is left
  (exporter/correlate/kubelet_view.py);
- memory blocks: their zone and, for a block in a kernel zone, its pages (plan/pages.py).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.correlate.kubelet_view import cpu_list, cpu_manager_problem, memory_manager_problem
from exporter.correlate.readmission_forecast import ForecastView, ReadmissionForecast
from exporter.correlate.running_pods_view import Finding, RunningPodsView
from exporter.events import (
    ContainerCgroup,
    CpuManagerCheckpoint,
    KernelSnapshot,
    MemoryManagerCheckpoint,
    PodStatus,
    RunningContainers,
)
from exporter.plan.eviction import Budgets, Verdict, judge
from exporter.plan.model import (
    Action,
    BlockLike,
    Change,
    DeviceTake,
    HardwareLike,
    Plan,
    Refusal,
    RejectedPod,
    StaleContainer,
    VirtioMemTake,
    plural,
    size,
)
from exporter.plan.pages import MOVABLE_ZONE, PAGE_SIZE, count_pages

REFUSALS_LISTED = 32  # refusals named one by one; the rest counted
# Memory blocks whose /proc/kpageflags one plan reads at most, `plan` and GET /plan alike (one
# answer): about 8 ms a block, so 4 s at worst; only blocks of removable devices are read
# (boot memory never goes), and blocks still cached from an earlier plan are not charged. A
# block left unread makes the answer "cannot tell" for what it could have given, never
# "cannot".
PAGE_BUDGET = 512
STALE_LISTED = 50  # stale containers named one by one
# Kernel zones in the order blocks are taken from them: DMA32 is kept for devices that need
# memory below 4 GiB.
_ZONE_ORDER = {MOVABLE_ZONE: 0, "Normal": 1, "DMA32": 2, "DMA": 3}

PageFlags = Callable[[int], Mapping[int, int] | None]


@dataclass(frozen=True)
class Inputs:
    """What the planner judges. `forecast`: the pods, the Node and the CPU manager's policy
    (a ReadmissionForecast fed with them, or the immutable view of one; None: not read); the
    planner asks it what it would say on hypothetical kernels (what_if), which changes
    nothing in it. Kubernetes on but no Node in it: the pods are unjudged, never spared.
    `pods_unjudged`: why the pods it holds are not all this node's (the pod source has not
    listed them, is down, forbidden, cut at its bound): unjudged too. `running`: the
    running-pods view (its scan, pods and checkpoint; None: not scanned), read, never fed."""

    snapshot: KernelSnapshot
    hardware: HardwareLike
    forecast: ReadmissionForecast | ForecastView | None = None
    running: RunningPodsView | None = None
    cpu_checkpoint: CpuManagerCheckpoint | None = None
    memory_checkpoint: MemoryManagerCheckpoint | None = None
    kubelet_root: str = "/var/lib/kubelet"
    # The kubelet resizes its Node without a restart (KEP-3953's gate on, under either of
    # its names, as its /metrics says); no released kubelet does.
    kubelet_resizes: bool = False
    # What was not read, by input name (INPUTS), with why ("not mounted: ..."); the planner
    # names those the answer depends on as unjudged.
    not_read: Mapping[str, str] = field(default_factory=dict)
    # The kubelet's reservedSystemCPUs (its configuration); None: not read.
    kubelet_reserved_cpus: frozenset[int] | None = None
    # pod uid -> its controller's kind (ReplicaSet, DaemonSet, ...), for the rejected pods
    pod_owners: Mapping[str, str] = field(default_factory=dict)
    gates: Mapping[str, bool] = field(default_factory=dict)  # the kubelet's, as reported
    # No kubelet was found on this host (no kubelet root, no kubepods cgroup, Kubernetes
    # off): the pods and containers are none, not unread.
    no_kubelet: bool = False
    pods_unjudged: str = ""
    # The cluster's PodDisruptionBudgets (None: not read; not_read["pod_disruption_budgets"]
    # says why) and this node's pods by uid as last seen (their labels, phase, readiness):
    # whether the evictions the actions ask for would be refused (plan/eviction.py).
    budgets: Budgets | None = None
    pods: Mapping[str, PodStatus] = field(default_factory=dict)


DMA32_LIMIT = 1 << 32  # physical addresses below 4 GiB: ZONE_DMA and ZONE_DMA32 on x86-64

# The inputs an answer can depend on (docs/plan.schema.json `inputs`)
INPUTS = ("kernel", "memory_devices", "cpu_topology", "mem_available", "page_flags", "pods",
          "running_containers", "cpu_manager_checkpoint", "memory_manager_checkpoint",
          "kubelet_config", "pod_disruption_budgets")
PDB_INPUT = "pod_disruption_budgets"  # needed only when the actions evict a pod
# Memory that must stay available after an offline, beyond what the pages moved take: the
# larger of this and MARGIN_FRACTION of what stays (migration needs free pages, the kernel's
# watermarks and the pods' working sets more).
MARGIN_BYTES = 64 << 20
MARGIN_FRACTION = 0.05


class TooLarge(ValueError):
    """The change is more than the machine has (or can have); the message says the most."""


# ---------------------------------------------------------------- memory blocks


@dataclass(frozen=True)
class BlockVerdict:
    number: int
    ok: bool
    zone: str
    reason: str = ""  # a Refusal reason when not ok
    detail: str = ""
    in_use: int = 0  # pages to migrate (LRU), the fewer the better


UNREAD = ("pages_not_read", "zones_not_read")  # verdicts that say "not read", not "cannot"


def judge_block(block: BlockLike, flags: Mapping[int, int] | None,
                block_size: int = 0, virtio_mem: bool = False) -> BlockVerdict:
    """`virtio_mem`: the block is a virtio-mem device's, whose PageOffline pages are its
    unplugged sub-blocks (elsewhere they are a balloon driver's: counted as staying)."""
    zones = block.zones
    if not zones:
        return BlockVerdict(block.number, False, "", "zones_not_read",
                            "its valid_zones could not be read: its zone is not known")
    if {"DMA", "DMA32"} & set(zones) or (block_size and block.number * block_size
                                         < DMA32_LIMIT):
        return BlockVerdict(block.number, False, zones[0], "dma",
                            "below 4 GiB (ZONE_DMA/DMA32): kept for devices that address "
                            "32 bits, never taken")
    if len(zones) != 1 or zones[0] == "none":
        return BlockVerdict(block.number, False, "none", "spans_zones",
                            "spans more than one zone (valid_zones none): the kernel refuses "
                            "to offline it (EINVAL)")
    zone = zones[0]
    if zone == MOVABLE_ZONE and flags is None:
        return BlockVerdict(block.number, True, zone)
    if flags is None:
        return BlockVerdict(block.number, False, zone, "pages_not_read",
                            f"in ZONE_{zone.upper()}, whose pages may be unmovable; its page "
                            "flags were not read (root reads /proc/kpageflags)")
    pages = count_pages(flags)
    if pages.holes:
        return BlockVerdict(block.number, False, zone, "holes",
                            f"{pages.holes} pages missing (a hole): the kernel refuses (EINVAL)")
    if pages.unmovable or (pages.offline and not virtio_mem):
        return BlockVerdict(block.number, False, zone, "unmovable_pages",
                            f"{pages.describe()} cannot be migrated: the kernel refuses "
                            "(EBUSY)", pages.lru)
    return BlockVerdict(block.number, True, zone, in_use=pages.lru)


def _read_order(blocks: Iterable[BlockLike]) -> list[BlockLike]:
    """Online blocks in the order their page flags are worth reading: the zones taken first,
    then from the top of memory down (hot-added memory sits at the top)."""
    online = [b for b in blocks if b.online]
    return sorted(online, key=lambda b: (_ZONE_ORDER.get(b.zones[0] if b.zones else "", 9),
                                         -b.number))


def judge_blocks(hardware: HardwareLike, page_flags: PageFlags | None, budget: int,
                 enough: int | None = None) -> list[BlockVerdict]:
    """A verdict for every online block (with `enough`: until that many can go, the movable
    ones all judged), reading the page flags of kernel-zone blocks not read yet, at most
    `budget` of them."""
    out: list[BlockVerdict] = []
    ok = 0
    reads = 0
    removable = _removable_blocks(hardware)
    virtio = frozenset() if hardware.devices is None else frozenset(
        n for d in hardware.devices.devices if d.partial for n in d.blocks)
    if hardware.devices is not None and any(
            d.removable and (not d.partial or (d.device_block_size or 0) > hardware.block_size)
            for d in hardware.devices.devices):
        # A DIMM (a virtio-mem big block) goes whole: one block found to go says nothing of
        # the rest, so every block of a removable device is judged (boot memory without its
        # flags: it never goes).
        enough = None
    for block in _read_order(hardware.blocks):
        if enough is not None and ok >= enough and block.zones[:1] != (MOVABLE_ZONE,):
            break  # enough found, every movable block among them (they come first)
        flags = block.page_flags
        single = len(block.zones) == 1 and block.zones[0] != "none" \
            and (removable is None or block.number in removable) \
            and block.number * hardware.block_size >= DMA32_LIMIT
        if (flags is None and page_flags is not None and single
                and block.zones[0] != MOVABLE_ZONE and reads < budget
                and (enough is None or ok < enough)):
            flags = page_flags(block.number)
            reads += 1
        verdict = judge_block(block, flags, hardware.block_size, block.number in virtio)
        ok += verdict.ok
        out.append(verdict)
    return out


def _removable_blocks(hardware: HardwareLike) -> frozenset[int] | None:
    """Blocks of a device a hypervisor can remove (None: the devices were not read). Page
    flags are read for these only: boot memory is never taken."""
    devices = hardware.devices
    if devices is None:
        return None
    return frozenset(n for d in devices.devices if d.removable for n in d.blocks)


def _take_order(verdicts: Iterable[BlockVerdict]) -> list[BlockVerdict]:
    return sorted((v for v in verdicts if v.ok),
                  key=lambda v: (_ZONE_ORDER.get(v.zone, 9), v.in_use, -v.number))


# ---------------------------------------------------------------- CPUs


def _exclusive_cpus(inputs: Inputs) -> frozenset[int]:
    cp = inputs.cpu_checkpoint
    if cp is not None and cp.static:
        return cp.assigned_cpus
    if inputs.running is not None:
        return inputs.running.assigned_cpus
    return frozenset()


def _pinned_cpus(running: RunningPodsView | None, exclusive: frozenset[int],
                 online: frozenset[int]) -> frozenset[int]:
    """CPUs a running container's cpuset names without naming every online CPU: pinned."""
    out: set[int] = set(exclusive)
    if running is not None and running.scan is not None:
        for cg in running.scan.containers:
            if cg.cpus and cg.cpus != online and not (online - exclusive) <= cg.cpus:
                out.update(cg.cpus)
    return frozenset(out)


def cpu_candidates(inputs: Inputs) -> tuple[list[int], list[Refusal]]:
    """Online CPUs in the order to take them (unpinned first, highest number first), and the
    online CPUs the kernel cannot offline."""
    snap = inputs.snapshot
    online = snap.cpus_online
    pinned = _pinned_cpus(inputs.running, _exclusive_cpus(inputs), online)
    refusals = [Refusal("cpu", c, "no_online_file", f"cpu{c} has no online file: the kernel "
                        "cannot offline it" + (" (the boot CPU)" if c == 0 else ""))
                for c in sorted(online - inputs.hardware.cpus_hotpluggable)]
    ok = sorted(online & inputs.hardware.cpus_hotpluggable, key=lambda c: (c in pinned, -c))
    return ok, refusals


# ---------------------------------------------------------------- the hypothetical kernel


def after(snap: KernelSnapshot, cpus_off: Iterable[int] = (), cpus_on: Iterable[int] = (),
          blocks_off: Iterable[int] = (), blocks_on: Iterable[int] = ()) -> KernelSnapshot:
    """The snapshot the change would leave: MemTotal moves by a block per block (measured:
    exactly block_size_bytes)."""
    off, on = frozenset(cpus_off), frozenset(cpus_on)
    b_off, b_on = frozenset(blocks_off), frozenset(blocks_on)
    size = snap.memory_block_size
    return dataclasses.replace(
        snap, cpus_online=(snap.cpus_online - off) | on,
        cpus_offline=(snap.cpus_offline | off) - on,
        memory_blocks_online=(snap.memory_blocks_online - b_off) | b_on,
        memory_blocks_offline=(snap.memory_blocks_offline | b_off) - b_on,
        mem_total_bytes=max(0, snap.mem_total_bytes + size * (len(b_on) - len(b_off))))


def _key(f: Finding) -> tuple[str, str, str, str]:
    return (f.kind, f.namespace, f.pod, f.container)


def stale_after(running: RunningPodsView | None, hypo: KernelSnapshot,
                cpus_off: frozenset[int], exclusive: frozenset[int]) -> list[StaleContainer]:
    """Containers the change would leave in a state the kubelet would not create: the
    running-pods judge on the hypothetical kernel (findings it does not make today), and
    containers whose exclusive cpuset loses a CPU."""
    if running is None or running.scan is None or running.snapshot is None:
        return []
    scan = running.scan
    out: list[StaleContainer] = []
    changed: list[ContainerCgroup] = []
    for cg in scan.containers:
        if cg.cpus and cg.cpus & cpus_off:
            lost = cg.cpus & cpus_off
            pod = running.pods.get(cg.pod_uid)
            ns, name = (pod.namespace, pod.name) if pod is not None else ("?", cg.pod_uid[:36])
            container = next((c.name for c in (pod.containers if pod is not None else ())
                              if c.container_id == cg.container_id), cg.container_id[:12])
            online = running.snapshot.cpus_online
            if cg.cpus <= exclusive or (cg.cpus != online and cg.qos == "guaranteed"):
                out.append(StaleContainer(ns, name, container, "cpuset_exclusive",
                                          f"pinned to {cpu_list(cg.cpus)}; "
                                          f"{cpu_list(lost)} would go"))
            # The kernel drops an offlined CPU from every cpuset (v1 and v2 alike).
            changed.append(dataclasses.replace(cg, cpus=cg.cpus - cpus_off))
        else:
            changed.append(cg)
    if not changed and not scan.containers:
        return out
    now = {_key(f) for f in running.findings()}
    view = running.what_if(hypo, RunningContainers(scan.time, scan.cgroup_version,
                                                   tuple(changed), scan.truncated,
                                                   scan.skipped) if cpus_off else None)
    for f in view.findings():
        if _key(f) not in now:
            out.append(StaleContainer(f.namespace, f.pod, f.container, f.kind, f.detail))
    return out


# ---------------------------------------------------------------- the plan


def plan(change: Change, inputs: Inputs, page_flags: PageFlags | None = None,
         page_budget: int = 0, verdicts: list[BlockVerdict] | None = None) -> Plan:
    """The plan for `change`; a change past what the machine has (or can have) is a Plan that
    says so (`impossible`). `page_flags` reads a block's kpageflags (at most `page_budget`
    blocks); `verdicts` are block verdicts already made (judge_blocks), reused across plans."""
    try:
        return _plan(change, inputs, page_flags, page_budget, verdicts)
    except TooLarge as e:
        hw = inputs.hardware
        return Plan(change, block_size=hw.block_size, impossible=str(e),
                    inputs=_inputs_read(change, inputs),
                    unjudged=tuple(_unjudged(change, inputs)))


def _plan(change: Change, inputs: Inputs, page_flags: PageFlags | None, page_budget: int,
          verdicts: list[BlockVerdict] | None) -> Plan:
    snap = inputs.snapshot
    notes: list[str] = []
    refusals: list[Refusal] = []
    unjudged = _unjudged(change, inputs)
    cpus = _cpus_to_move(change, inputs, notes, refusals, unjudged)
    memory = _memory_to_move(change, inputs, page_flags, page_budget, verdicts, notes,
                             refusals, unjudged)

    cpus_off, cpus_on = frozenset(cpus.take), frozenset(cpus.add)
    hypo = after(snap, cpus_off, cpus_on, memory.take, memory.add)
    if memory.not_present:
        hypo = dataclasses.replace(hypo, mem_total_bytes=hypo.mem_total_bytes
                                   + memory.not_present * memory.size)
    unplugged = len(memory.take) * memory.size - sum(d.bytes for d in memory.devices)
    if memory.take and unplugged > 0:  # virtio-mem sub-blocks unplugged already: not in MemTotal
        hypo = dataclasses.replace(hypo, mem_total_bytes=hypo.mem_total_bytes + unplugged)
    capacity = {"cpu": len(hypo.cpus_online), "memory": hypo.mem_total_bytes}

    pods = _pods_after(inputs, hypo, notes)
    stale = stale_after(inputs.running, hypo, cpus_off, _exclusive_cpus(inputs))
    running = inputs.running is not None and inputs.running.scan is not None \
        and inputs.running.scan.cgroup_version > 0
    restarts, problem = _restart(change, inputs, hypo, cpus_off | cpus_on, memory.take)
    places = inputs.hardware.cpu_places
    plan_ = Plan(change, tuple(cpus.take), tuple(cpus.add), cpus.short, tuple(memory.take),
                 tuple(memory.add), memory.needed, memory.short, memory.size, capacity,
                 tuple(pods.rejected), pods.rejected_total, pods.by_reason, pods.rejected_now,
                 tuple(stale[:STALE_LISTED]), tuple(refusals[:REFUSALS_LISTED]), len(refusals),
                 restarts, problem,
                 inputs.kubelet_resizes and change.cpus >= 0 and change.memory >= 0,
                 pods.kubernetes, running, (), tuple(notes),
                 tuple(dict.fromkeys((*unjudged, *pods.unjudged))),
                 allocatable_after=pods.allocatable,
                 memory_devices=tuple(memory.devices),
                 cpu_places={c: places[c].json() for c in (*cpus.take, *cpus.add)
                             if c in places},
                 inputs=_inputs_read(change, inputs, unjudged),
                 gates=dict(inputs.gates), memory_move_bytes=memory.move_bytes,
                 memory_available_after=memory.available_after,
                 other_harm=tuple(memory.harm))
    plan_ = _with_budgets(plan_, inputs)
    done = tuple(actions(plan_, inputs))
    return dataclasses.replace(plan_, steps=tuple(a.says for a in done), actions=done)


def evicted(p: Plan) -> list[tuple[str, str, str]]:
    """(namespace, name, uid) of each pod the actions evict, in their order: the pods the
    kubelet would reject, then those pinned to CPUs that go."""
    out = [(r.namespace, r.name, r.uid) for r in p.rejected_pods]
    seen = {(ns, n) for ns, n, _ in out}
    for ns, n in sorted({(c.namespace, c.pod) for c in p.stale_containers
                         if c.kind == "cpuset_exclusive"}):
        if (ns, n) not in seen:
            out.append((ns, n, ""))
    return out


def _with_budgets(p: Plan, inputs: Inputs) -> Plan:
    """The plan with each eviction judged against the PodDisruptionBudgets. They matter only
    when the actions evict a pod; unread then, each pod's pdb_blocked is null and the answer
    names them in `inputs` and `unknown`. Neither changes the verdict: a plan that evicts is
    already "harmful" (pods rejected or left stale), and a refused eviction is not harm to a
    running pod; but an action list the orchestrator cannot carry out says so in `harm`."""
    pods = evicted(p)
    if not pods:
        return p
    inputs_read = dict(p.inputs)
    why = missing(inputs).get(PDB_INPUT) or ("" if inputs.budgets is not None else "not read")
    if why:
        inputs_read[PDB_INPUT] = why
        line = f"pod disruption budgets: {why}"
        return dataclasses.replace(p, inputs=inputs_read, unjudged=tuple(dict.fromkeys(
            (*p.unjudged, line))))
    assert inputs.budgets is not None
    by_uid = inputs.pods
    by_name = {(pod.namespace, pod.name): pod for pod in by_uid.values()}

    def seen(namespace: str, name: str, uid: str) -> PodStatus | None:
        return (by_uid.get(uid) if uid else None) or by_name.get((namespace, name))
    verdicts = judge([(ns, n, seen(ns, n, uid)) for ns, n, uid in pods], inputs.budgets)
    found: dict[str, Verdict] = {f"{ns}/{n}": v for (ns, n, _), v in zip(pods, verdicts)}
    rejected = tuple(dataclasses.replace(r, pdb_blocked=found[f"{r.namespace}/{r.name}"].blocked)
                     for r in p.rejected_pods)
    blocked = [k for k, v in found.items() if v.blocked]
    unknown = [k for k, v in found.items() if v.blocked is None]
    harm = p.other_harm
    if blocked:
        harm += (f"{plural(len(blocked), 'eviction')} the API server would refuse (a "
                 f"PodDisruptionBudget: {', '.join(blocked[:4])}"
                 f"{' ...' if len(blocked) > 4 else ''}): the actions cannot be carried out "
                 "as given",)
    unjudged = p.unjudged
    if unknown:
        unjudged = tuple(dict.fromkeys((*unjudged, "pod disruption budgets: not judged for "
                                        + ", ".join(unknown[:4]) + " ("
                                        + found[unknown[0]].detail + ")")))
    inputs_read[PDB_INPUT] = "read"
    return dataclasses.replace(p, rejected_pods=rejected, pdb=found, other_harm=harm,
                               inputs=inputs_read, unjudged=unjudged)


def _depends_on(change: Change, inputs: Inputs) -> dict[str, bool]:
    """Which inputs the answer to `change` depends on."""
    removing = change.cpus < 0 or change.memory < 0
    cp = inputs.cpu_checkpoint
    static = cp is not None and cp.static
    return {"kernel": True, "memory_devices": change.memory != 0,
            "cpu_topology": change.cpu_unit != "cpu",
            "mem_available": change.memory < 0, "page_flags": change.memory < 0,
            "pods": removing and not inputs.no_kubelet,
            "running_containers": removing and not inputs.no_kubelet,
            "cpu_manager_checkpoint": change.cpus != 0 and not inputs.no_kubelet,
            "memory_manager_checkpoint": change.memory != 0 and not inputs.no_kubelet,
            "kubelet_config": change.cpus < 0 and static,
            PDB_INPUT: False}  # only when the actions evict a pod: _with_budgets


def missing(inputs: Inputs) -> dict[str, str]:
    """Every input not read, with why: what the caller said, and what it handed in as None
    beside a kubelet (never taken as "nothing there")."""
    out = {**inputs.hardware.not_read, **inputs.not_read}
    if not inputs.no_kubelet:
        for name, value in (("pods", inputs.forecast), ("running_containers", inputs.running),
                            ("cpu_manager_checkpoint", inputs.cpu_checkpoint),
                            ("memory_manager_checkpoint", inputs.memory_checkpoint)):
            if value is None:
                out.setdefault(name, "not read")
    if inputs.hardware.devices is None:
        out.setdefault("memory_devices", "not read")
    if inputs.hardware.mem_available is None:
        out.setdefault("mem_available", "/proc/meminfo MemAvailable not read")
    return out


def _unjudged(change: Change, inputs: Inputs) -> list[str]:
    """What the answer depends on and was not read, each with why."""
    needs = _depends_on(change, inputs)
    out = [f"{name.replace('_', ' ')}: {why}" for name, why in missing(inputs).items()
           if needs.get(name, True)]
    scan = inputs.running.scan if inputs.running is not None else None
    if needs["running_containers"] and scan is not None and (scan.truncated or scan.skipped):
        out.append("running containers: a partial scan ("
                   + ", ".join(w for w in (
                       "stopped at its budget" if scan.truncated else "",
                       f"{plural(scan.skipped, 'container')} unreadable" if scan.skipped
                       else "") if w)
                   + f", {plural(len(scan.containers), 'container')} read): the others were "
                   "not judged")
    if needs["kubelet_config"] and inputs.kubelet_reserved_cpus is None \
            and "kubelet_config" not in inputs.not_read:
        out.append("kubelet config: its reservedSystemCPUs were not read (the static CPU "
                   "manager refuses to start when one is offline)")
    return out


def _inputs_read(change: Change, inputs: Inputs,
                 unjudged: Iterable[str] = ()) -> dict[str, str]:
    """Each input: "read", "not needed", or why not (what the planner found unread itself,
    such as page flags past the budget, included)."""
    needs, gone = _depends_on(change, inputs), missing(inputs)
    for line in unjudged:
        name, _, why = line.partition(": ")
        key = name.replace(" ", "_")
        if key in INPUTS and key not in gone:
            gone[key] = why
    return {name: gone.get(name, "read") if needs.get(name) else
            "not needed" for name in INPUTS}


@dataclass(frozen=True)
class _CpusMoved:
    take: list[int]  # CPUs to offline
    add: list[int]  # CPU slots to online (present first)
    short: int  # CPUs (or cores, sockets) asked to leave that none can stand for


def whole(places: Mapping[int, Any], unit: str) -> list[tuple[int, ...]]:
    """The CPUs grouped by `unit` ("core": thread siblings; "socket": package), each group
    sorted; CPUs whose place is unknown form no group."""
    groups: dict[object, list[int]] = {}
    for c, p in places.items():
        if unit == "core" and p.core is not None and p.package is not None:
            groups.setdefault((p.package, p.die, p.core), []).append(c)
        elif unit == "socket" and p.package is not None:
            groups.setdefault(p.package, []).append(c)
    return [tuple(sorted(g)) for g in groups.values()]


def _cpus_to_move(change: Change, inputs: Inputs, notes: list[str],
                  refusals: list[Refusal], unjudged: list[str]) -> _CpusMoved:
    """Which CPUs leave or come for `change.cpus`; when too few can leave, why the others
    cannot (into `refusals`). Raises TooLarge past what the machine has."""
    snap = inputs.snapshot
    online = snap.cpus_online
    unit = change.cpu_unit
    if change.cpus < 0 and unit != "cpu":
        return _whole_cpus_to_take(-change.cpus, unit, inputs, refusals, unjudged)
    if change.cpus > 0 and unit != "cpu":
        raise TooLarge(f"cpu {change.cpus:+d}{unit}: the kernel shows no topology for CPUs "
                       "that are not online; add CPUs by number (cpu +N)")
    if change.cpus < 0:
        n = -change.cpus
        if n >= len(online):
            most = len(online) - 1
            raise TooLarge(f"cpu {change.cpus}: the machine has {plural(len(online), 'CPU')} "
                           "online and keeps at least one; "
                           + (f"take at most {most} (cpu -{most})" if most else
                              "no CPU can be taken now"))
        candidates, cpu_refusals = cpu_candidates(inputs)
        take = candidates[:n]
        if n - len(take):
            refusals += cpu_refusals
        return _CpusMoved(take, [], n - len(take))
    if change.cpus > 0:
        slots = sorted(snap.cpus_possible - online)
        if change.cpus > len(slots):
            raise TooLarge(f"cpu +{change.cpus}: the kernel has room for "
                           f"{plural(len(slots), 'more CPU', 'more CPUs')} (cpus possible "
                           f"{len(snap.cpus_possible)}, online {len(online)}); add at most "
                           f"{len(slots)}")
        present = [c for c in slots if c in snap.cpus_present]
        add = (present + [c for c in slots if c not in snap.cpus_present])[:change.cpus]
        missing = [c for c in add if c not in snap.cpus_present]
        if missing:
            notes.append(f"{cpu_list(frozenset(missing))} not present: the hypervisor must add "
                         "them first (they then appear offline, or online by udev rule)")
        return _CpusMoved([], add, 0)
    return _CpusMoved([], [], 0)


def _whole_cpus_to_take(n: int, unit: str, inputs: Inputs, refusals: list[Refusal],
                        unjudged: list[str]) -> _CpusMoved:
    """`n` whole cores or sockets: groups whose every CPU is online and can be offlined,
    unpinned first, the highest numbers first."""
    online = inputs.snapshot.cpus_online
    places = {c: p for c, p in inputs.hardware.cpu_places.items() if c in online}
    if not places:
        unjudged.append("cpu topology: not read (/sys/devices/system/cpu/cpuN/topology)")
        return _CpusMoved([], [], n)
    groups = whole(places, unit)
    if n >= len(groups):
        raise TooLarge(f"cpu -{n}{unit}: the machine has {plural(len(groups), unit)} online "
                       f"and keeps at least one; take at most {len(groups) - 1}")
    pinned = _pinned_cpus(inputs.running, _exclusive_cpus(inputs), online)
    hot = inputs.hardware.cpus_hotpluggable
    good = [g for g in groups if set(g) <= hot]
    for g in groups:
        if not set(g) <= hot:
            for c in sorted(set(g) - hot):
                refusals.append(Refusal("cpu", c, "no_online_file",
                                        f"cpu{c} has no online file: its {unit} "
                                        f"({cpu_list(frozenset(g))}) cannot go whole"))
    good.sort(key=lambda g: (len(set(g) & pinned), -max(g)))
    take = good[:n]
    return _CpusMoved([c for g in take for c in sorted(g, reverse=True)], [], n - len(take))


@dataclass(frozen=True)
class _MemoryMoved:
    take: list[int]  # memory blocks to offline
    add: list[int]  # offline blocks to online
    needed: int  # blocks the change is
    short: int  # bytes asked to leave that no device can stand for
    size: int  # bytes per block
    not_present: int  # blocks to add that the hypervisor must plug first
    devices: list[DeviceTake] = field(default_factory=list)
    move_bytes: int = 0
    available_after: int | None = None
    harm: list[str] = field(default_factory=list)


def _memory_to_move(change: Change, inputs: Inputs, page_flags: PageFlags | None,
                    page_budget: int, verdicts: list[BlockVerdict] | None, notes: list[str],
                    refusals: list[Refusal], unjudged: list[str]) -> _MemoryMoved:
    """Which memory leaves or comes for `change.memory`, in whole blocks of removable devices;
    when too little can leave, why (into `refusals`). Raises TooLarge past what the machine
    has."""
    snap, hw = inputs.snapshot, inputs.hardware
    size_ = hw.block_size
    needed = 0
    if change.memory:
        if size_ <= 0:
            raise TooLarge("memory: this kernel shows no memory hotplug (no valid "
                           "/sys/devices/system/memory/block_size_bytes)")
        needed = math.ceil(abs(change.memory) / size_)
        if needed * size_ != abs(change.memory):
            notes.append(f"memory moves in blocks of {size(size_)}: {size(abs(change.memory))}"
                         f" is {plural(needed, 'block')}, {size(needed * size_)}")
    if change.memory < 0:
        if needed * size_ >= snap.mem_total_bytes:
            raise TooLarge(f"memory -{size(abs(change.memory))}: the machine has "
                           f"{size(snap.mem_total_bytes)} bytes; take less (a multiple of "
                           f"the {size(size_)} block)")
        if verdicts is None:
            verdicts = judge_blocks(hw, page_flags, page_budget, enough=needed)
        return _memory_to_take(needed, size_, inputs, verdicts, notes, refusals, unjudged)
    if change.memory > 0:
        return _memory_to_add(needed, size_, inputs, notes, unjudged)
    return _MemoryMoved([], [], needed, 0, size_, 0)


def _memory_to_take(needed: int, size_: int, inputs: Inputs, verdicts: list[BlockVerdict],
                    notes: list[str], refusals: list[Refusal],
                    unjudged: list[str]) -> _MemoryMoved:
    """Whole DIMMs (every online block of one can go) and blocks of virtio-mem devices, the
    fewest pages to move first; boot memory and DMA never."""
    hw = inputs.hardware
    devices = hw.devices
    if devices is None:  # named by missing()
        return _MemoryMoved([], [], needed, 0, size_, 0)
    online = inputs.snapshot.memory_blocks_online
    by_block = {v.number: v for v in verdicts}
    # (pages to move, -start, device, blocks, bytes the hypervisor gets back)
    units: list[tuple[int, int, Any, list[int], int]] = []
    why: list[Refusal] = []  # named when the change cannot be met
    maybe = 0  # blocks that could go if what was not read allowed it
    for d in devices.devices:
        mine = [b for b in d.blocks if b in online]
        if not d.removable:
            if mine:
                why.append(Refusal(
                    "memory", mine[0], "boot_memory",
                    f"{plural(len(mine), 'block')} ({size(len(mine) * size_)}) of boot memory "
                    f"(memory{mine[0]}-memory{mine[-1]}): offlining it shrinks the node but "
                    "no hypervisor can unplug it"))
            continue
        judged = [by_block.get(b) for b in mine]
        bad = [v if v is not None else BlockVerdict(b, False, "", "pages_not_read",
                                                    "not judged: enough found before it")
               for b, v in zip(mine, judged) if v is None or not v.ok]
        if d.partial:
            # A virtio-mem block gives what is plugged in it (sub-blocks unplugged again are
            # the device's already); its plugged size per block where its flags were read.
            # In big-block mode a big block (several memory blocks) goes whole or not at all.
            plugged = dict(d.block_plugged)
            if d.device_block_size is None and mine:
                unjudged.append(
                    f"memory devices: virtio-mem device {d.id}'s block size was not read "
                    "(its driver logs it at probe, in /dev/kmsg): whether it gives back a "
                    "memory block at a time or only whole big blocks is not known")
            granule = max(1, (d.device_block_size or 0) // size_) if size_ else 1
            groups: dict[int, list[BlockVerdict | None]] = {}
            for b, v in zip(mine, judged):
                groups.setdefault((b * size_ - d.start) // (granule * size_), []).append(v)
            for group in groups.values():
                if len(group) != granule and granule > 1:
                    continue  # part of the big block offline or unread: not offered
                oks = [v for v in group if v is not None and v.ok]
                given = sum(min(size_, plugged.get(v.number, size_)) for v in oks)
                if len(oks) == len(group) and given > 0:
                    units.append((sum(v.in_use for v in oks), -oks[0].number, d,
                                  [v.number for v in oks], given))
            maybe += sum(1 for v in bad if v.reason in UNREAD)
            why += [Refusal("memory", v.number, v.reason, v.detail) for v in bad
                    if v.reason not in UNREAD]
        elif not bad and mine:
            units.append((sum(v.in_use for v in judged if v is not None), -d.start, d, mine,
                          len(mine) * size_))
        elif mine:
            if all(v.reason in UNREAD for v in bad):
                maybe += len(mine)
            why.append(Refusal(
                "memory", bad[0].number, "device_kept",
                f"{d.id} (a DIMM, {size(len(d.blocks) * size_)}) is kept by "
                + ", ".join(f"memory{v.number} ({v.detail})" for v in bad[:4])
                + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")))
    want = needed * size_
    chosen: list[tuple[int, int, Any, list[int], int]] = []
    units.sort(key=lambda u: (u[0], u[1]))
    while want > 0 and units:
        # The cheapest unit that covers what is left, else the largest, then again.
        fits = [u for u in units if u[4] >= want]
        u = fits[0] if fits else max(units, key=lambda u: (u[4], -u[0]))
        units.remove(u)
        chosen.append(u)
        want -= u[4]
    take = sorted((b for u in chosen for b in u[3]), reverse=True)
    given = sum(u[4] for u in chosen)
    takes: dict[str, DeviceTake] = {}
    for _, _, d, blocks, bytes_ in chosen:
        old = takes.get(d.id)
        blocks_ = tuple(sorted((*(old.blocks if old else ()), *blocks)))
        takes[d.id] = DeviceTake(d.id, d.kind, blocks_, (old.bytes if old else 0) + bytes_,
                                 True, (), d.slot, d.start, d.acpi_path, _virtio(d))
    if given > needed * size_:
        notes.append(f"the devices that cover {size(needed * size_)} give "
                     f"{size(given)}: a DIMM goes whole")
    short = max(0, needed * size_ - given)
    if short and maybe:
        unjudged.append(f"page flags: {plural(maybe, 'block')} of removable devices not read "
                        "(the page-flag budget, or their zone unreadable): whether "
                        f"{size(short)} more can go is not known")
        short = 0
    out = _MemoryMoved(take, [], needed, short, size_, 0, list(takes.values()))
    if short:
        refusals += why
        notes.append((f"only {size(given)} of removable memory" if take else
                      "no removable memory") + f" can be expected to go; {size(short)}"
                     " cannot")
    return _room(out, inputs, by_block, unjudged)


def _virtio(d: Any) -> VirtioMemTake | None:
    """A virtio-mem device's own account (memory_devices.MemoryDevice), for its action."""
    if not d.partial:
        return None
    return VirtioMemTake(d.size, d.plugged, d.requested, d.lowerable, d.pci_address,
                         d.device_block_size)


def _room(moved: _MemoryMoved, inputs: Inputs, by_block: Mapping[int, BlockVerdict],
          unjudged: list[str]) -> _MemoryMoved:
    """The pages in the blocks taken move elsewhere: what stays must hold them and keep a
    margin (MemAvailable less what is taken)."""
    if not moved.take:
        return moved
    taken = len(moved.take) * moved.size
    move = sum(by_block[b].in_use for b in moved.take if b in by_block) * PAGE_SIZE
    available = inputs.hardware.mem_available
    if available is None:  # named by missing()
        return dataclasses.replace(moved, move_bytes=move)
    after_ = available - taken
    stays = inputs.snapshot.mem_total_bytes - taken
    margin = max(MARGIN_BYTES, int(stays * MARGIN_FRACTION))
    harm = []
    if after_ < margin:
        harm.append(f"the memory that stays cannot hold what moves: MemAvailable "
                    f"{size(available)} less the {size(taken)} taken leaves "
                    f"{size(max(after_, 0))}, under the {size(margin)} margin (offlining "
                    "would stall or wake the OOM killer)")
    return dataclasses.replace(moved, move_bytes=move, available_after=after_, harm=harm)


def _memory_to_add(needed: int, size_: int, inputs: Inputs, notes: list[str],
                   unjudged: list[str]) -> _MemoryMoved:
    """Offline blocks first, then virtio-mem devices' unplugged region; past that only the
    hypervisor knows (DIMM slots, maxmem)."""
    snap, hw = inputs.snapshot, inputs.hardware
    add = sorted(snap.memory_blocks_offline)[:needed]
    missing = needed - len(add)
    if missing:
        room = 0
        if hw.devices is not None:
            room = sum(max(0, d.size - d.plugged) for d in hw.devices.devices if d.partial)
        if missing * size_ > room:
            unjudged.append(
                f"memory to add: {size(missing * size_)} is not present"
                + (f" ({size(room)} fits in virtio-mem devices)" if room else "")
                + ": the kernel cannot see how much the hypervisor can add (free DIMM "
                "slots, maxmem); ask it")
        notes.append(f"{plural(missing, 'block')} not present: the hypervisor must add them "
                     "first (a DIMM, or a virtio-mem device's requested size); they then "
                     f"appear offline, or online as auto_online_blocks says "
                     f"({hw.auto_online or 'unknown'})")
    zones = {z for b in hw.blocks if b.number in set(add) for z in b.zones[:1]}
    if hw.auto_online in ("online", "online_kernel") or zones - {MOVABLE_ZONE}:
        notes.append("online hot-added memory as online_movable (echo online_movable > "
                     ".../memoryN/state, or auto_online_blocks=online_movable): memory "
                     "onlined into a kernel zone may never leave again")
    return _MemoryMoved([], add, needed, 0, size_, missing)


@dataclass(frozen=True)
class _PodsAfter:
    rejected: list[RejectedPod]
    rejected_total: int
    by_reason: dict[str, int]
    allocatable: dict[str, int]  # what a restarted kubelet would offer (milli-CPU, bytes)
    rejected_now: int  # what a restart before the change would reject
    kubernetes: bool  # the pods were judged (a Node status read)
    unjudged: tuple[str, ...] = ()  # why the pods could not be judged: never safe


# Kubernetes on and no Node: the pods cannot be judged (the API server unreachable from the
# start, a wrong --node-name, a Node not registered yet, nodes not readable).
NO_NODE = ("pods: no Node status read for this node (check --node-name and that the exporter "
           "may get nodes and reaches the API server)")


def _forecast_at(forecast: ReadmissionForecast | ForecastView, hypo: KernelSnapshot,
                 owner: Callable[[str], str]
                 ) -> tuple[list[RejectedPod], int, dict[str, int], dict[str, int]] | None:
    """The forecast on `hypo` (rejected pods, their count, by reason, and what a restarted
    kubelet would offer); None without a Node. Nothing of it stays in the forecast."""
    result, offered = forecast.what_if(hypo)
    if result is None or offered is None:
        return None
    (milli, memory, _, _), _, _ = offered
    return ([RejectedPod(r.namespace, r.name, r.reason, r.uid, owner(r.uid))
             for r in result.rejected],
            result.rejected_total, dict(result.by_reason),
            {"cpu": int(milli), "memory": int(memory)})


def _pods_after(inputs: Inputs, hypo: KernelSnapshot, notes: list[str]) -> _PodsAfter:
    """What a kubelet restart would reject on the machine after the change (and now)."""
    forecast, snap = inputs.forecast, inputs.snapshot
    if forecast is None:
        return _PodsAfter([], 0, {}, {}, 0, False)
    running = inputs.running

    def owner(uid: str) -> str:
        """The pod's controller kind: as the caller listed it, else as the running-pods view
        (fed by the pod watch) has the pod."""
        kind = inputs.pod_owners.get(uid, "")
        if not kind and running is not None:
            pod = running.pods.get(uid)
            kind = pod.owner_kind if pod is not None else ""
        return kind

    now = _forecast_at(forecast, snap, owner)
    later = _forecast_at(forecast, hypo, owner)
    rejected, rejected_total, by_reason, allocatable = later if later is not None \
        else ([], 0, {}, {})
    kubernetes = later is not None
    unjudged: tuple[str, ...] = () if kubernetes else (NO_NODE,)
    if inputs.pods_unjudged:
        unjudged += (inputs.pods_unjudged,)
    return _PodsAfter(rejected, rejected_total, by_reason, allocatable,
                      now[1] if now is not None else 0, kubernetes, unjudged)


def _restart(change: Change, inputs: Inputs, hypo: KernelSnapshot,
             cpus_moved: frozenset[int], memory_taken: list[int]) -> tuple[bool | None, str]:
    """Would a kubelet restart after the change start (True), fail on its checkpoints or
    configuration (False, why), or can nobody say (None, why)?"""
    cp, gone = inputs.cpu_checkpoint, missing(inputs)
    if cpus_moved and gone.get("cpu_manager_checkpoint") and not inputs.no_kubelet:
        return None, ("its CPU manager checkpoint was not read ("
                      + gone["cpu_manager_checkpoint"] + ")")
    if cp is not None and cpus_moved:
        problem = cpu_manager_problem(cp, hypo.cpus_online)
        if problem:
            return False, problem
        static = cp.static
        reserved = inputs.kubelet_reserved_cpus
        if static and reserved is not None and reserved - hypo.cpus_online:
            return False, (f"its reservedSystemCPUs name {cpu_list(reserved - hypo.cpus_online)}"
                           ", which would be offline")
    if (memory_taken or change.memory) and gone.get("memory_manager_checkpoint") \
            and not inputs.no_kubelet:
        return None, ("its memory manager checkpoint was not read ("
                      + gone["memory_manager_checkpoint"] + ")")
    if inputs.memory_checkpoint is not None and (memory_taken or change.memory):
        problem = memory_manager_problem(inputs.memory_checkpoint, hypo)
        if problem:
            return False, problem
    return True, ""


def steps(p: Plan, inputs: Inputs) -> list[str]:
    """The actions in words, in their order (one source: actions())."""
    return [a.says for a in actions(p, inputs)]


CAPACITY_WAIT = 300  # seconds an orchestrator waits for the Node's capacity at most


def actions(p: Plan, inputs: Inputs) -> list[Action]:
    """The safe order, machine-readable: cordon; move what must move first; then the memory
    (which can be refused: nothing has changed yet when it is), then the CPUs, each write
    with the write that undoes it; the hypervisor; the kubelet; wait until the Node shows the
    capacity; uncordon. Undo: the rollbacks of the writes done, newest first, then uncordon."""
    out: list[Action] = []
    cp = inputs.cpu_checkpoint
    static = cp is not None and cp.static
    removing = bool(p.cpu_take or p.memory_take)
    kube = p.kubernetes
    if removing and kube:
        out.append(Action("cordon", says="cordon the Node so nothing new is scheduled on it "
                          "while it shrinks"))
    if p.rejected_pods:
        names = ", ".join(f"{r.namespace}/{r.name}" for r in p.rejected_pods[:8])
        more = p.rejected_total - min(8, len(p.rejected_pods))
        # The answer lists the first rejected pods (readmission order); pods_total says how
        # many the evict action really has to move (an orchestrator overriding a harmful
        # verdict must not take the list for the whole).
        out.append(Action("evict", detail={"pods": [
            _evictee(p, r.namespace, r.name, r.uid) for r in p.rejected_pods],
            "pods_total": max(p.rejected_total, len(p.rejected_pods))},
            says=f"move away the pods the kubelet would reject ({names}"
                 f"{f' and {more} more' if more else ''}): drain them or lower their requests"
                 + _refused(p, [(r.namespace, r.name) for r in p.rejected_pods])))
    rejected = {(r.namespace, r.name) for r in p.rejected_pods}
    pinned = sorted({(c.namespace, c.pod) for c in p.stale_containers
                     if c.kind == "cpuset_exclusive"} - rejected)
    if pinned:
        out.append(Action("evict", detail={"pods": [_evictee(p, ns, n, "") for ns, n in pinned],
                                           "pods_total": len(pinned)},
                          says="move away the pods pinned to the CPUs that go ("
                          + ", ".join(f"{ns}/{n}" for ns, n in pinned[:8]) + ")"
                          + _refused(p, pinned)))
    mem = "/sys/devices/system/memory"
    for n in p.memory_take:  # largest number first, as memory.take lists them
        zone = "online_movable"
        out.append(Action("write", f"{mem}/memory{n}/state", "offline",
                          ((f"{mem}/memory{n}/state", zone),),
                          says=f"offline memory{n} (echo offline > {mem}/memory{n}/state); "
                          "if the kernel refuses (EBUSY, EINVAL) or it takes longer than "
                          "the deadline, roll back: online the blocks already taken"))
    for d in p.memory_devices:
        detail: dict[str, Any] = {"resource": "memory", "device": d.json()}
        if d.kind == "virtio-mem":
            detail["requested_size_less_bytes"] = d.bytes
            vm = d.virtio_mem
            if vm is not None:
                to = max(0, vm.base - d.bytes)
                detail["requested_size_bytes"] = to
                detail["hypervisor_rollback"] = {"requested_size_bytes": vm.base}
                where = f" at PCI {vm.pci_address}" if vm.pci_address else ""
                says = (f"set virtio-mem device {d.id}{where}'s requested-size to {size(to)} "
                        f"(from {size(vm.base)}; QEMU: qom-set its virtio-mem-pci device's "
                        "requested-size): its driver unplugs the offline blocks first; roll "
                        f"back: set it to {size(vm.base)} again")
            else:
                says = (f"lower virtio-mem device {d.id}'s requested size by {size(d.bytes)} "
                        "(its driver unplugs the offline blocks)")
        else:
            says = (f"remove the DIMM {d.id}" + (f" (slot {d.slot})" if d.slot is not None
                                                 else "") + f", {size(d.bytes)}, from the "
                    "hypervisor (QEMU: device_del of the pc-dimm in that slot)")
        out.append(Action("hypervisor_remove", detail=detail, says=says))
    if p.cpu_take and static:
        out.append(Action("stop_kubelet", says="stop the kubelet before the CPUs go (its "
                          "static CPU manager checkpoint names them)"))
    for c in p.cpu_take:
        out.append(Action("write", f"/sys/devices/system/cpu/cpu{c}/online", "0",
                          ((f"/sys/devices/system/cpu/cpu{c}/online", "1"),),
                          says=f"offline cpu{c} (echo 0 > /sys/devices/system/cpu/cpu{c}/"
                          "online)"))
    for c in p.cpu_take:
        place = p.cpu_places.get(c, {})
        out.append(Action("hypervisor_remove", detail={"resource": "cpu", "cpu": {
            "cpu": c, **{k: place.get(k) for k in ("socket", "die", "core", "thread",
                                                  "apic_id")}}},
            says=f"remove cpu{c} from the hypervisor" + (
                f" (QEMU: device_del of the CPU device with socket-id {place['socket']}, "
                f"core-id {place['core']}, thread-id {place['thread']})"
                if place.get("socket") is not None else " (its topology was not read)")))
    if p.change.memory > 0:
        if p.memory_blocks_needed > len(p.memory_add):
            out.append(Action("hypervisor_add", detail={
                "resource": "memory",
                "bytes": (p.memory_blocks_needed - len(p.memory_add)) * p.block_size},
                says="let the hypervisor add the memory (a DIMM, or a virtio-mem device's "
                     "requested size)"))
        for n in p.memory_add:
            out.append(Action("write", f"{mem}/memory{n}/state", "online_movable",
                              ((f"{mem}/memory{n}/state", "offline"),),
                              says=f"online memory{n} as online_movable, so it can leave "
                              "again"))
    if p.change.cpus > 0:
        if static:
            out.append(Action("stop_kubelet", says="stop the kubelet before the CPUs come "
                              "(its static CPU manager checkpoint lacks them)"))
        missing = [c for c in p.cpu_add if c not in inputs.snapshot.cpus_present]
        if missing:
            out.append(Action("hypervisor_add", detail={"resource": "cpu",
                                                        "cpus": len(missing)},
                              says=f"let the hypervisor add {plural(len(missing), 'CPU')}"))
        for c in p.cpu_add:
            out.append(Action("write", f"/sys/devices/system/cpu/cpu{c}/online", "1",
                              ((f"/sys/devices/system/cpu/cpu{c}/online", "0"),),
                              says=f"online cpu{c} (echo 1 > /sys/devices/system/cpu/cpu{c}/"
                              "online)"))
    changed = removing or p.cpu_add or p.memory_add or p.change.cpus > 0 \
        or p.change.memory > 0
    if static and (p.cpu_take or p.cpu_add):
        path = cp.path if cp is not None else inputs.kubelet_root
        out.append(Action("delete", path, says=f"delete {path}: the kubelet writes a new "
                          "checkpoint for the CPUs online"))
        out.append(Action("start_kubelet", says="start the kubelet"))
    elif p.kubelet_restarts is False:
        out.append(Action("restart_kubelet", detail={"problem": p.kubelet_problem},
                          says=f"the kubelet would not restart ({p.kubelet_problem}): stop "
                          "it, delete the checkpoint it names and start it"))
    elif p.kubelet_picks_up_without_restart:
        pass
    elif changed and not inputs.no_kubelet:
        out.append(Action("restart_kubelet", says="restart the kubelet so the Node shows the "
                          "new capacity (it reads the machine once, at start)"))
    if changed and kube:
        cap = p.capacity_after
        out.append(Action("wait_for_capacity", detail={
            "cpu": int(cap.get("cpu", 0)), "memory_bytes": int(cap.get("memory", 0)),
            "timeout_seconds": CAPACITY_WAIT},
            says=f"wait until the Node's status.capacity shows {cap.get('cpu', 0)} CPU and "
                 f"{size(int(cap.get('memory', 0)))} of memory (at most {CAPACITY_WAIT} s), "
                 "then check that no pod was rejected"))
    if removing and kube:
        out.append(Action("uncordon", says="uncordon the Node"))
    return out


def _evictee(p: Plan, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """One pod of an evict action, with whether a PodDisruptionBudget refuses its eviction
    (pdb_blocked null: the budgets were not read, or not for this pod)."""
    v = p.pdb.get(f"{namespace}/{name}")
    return {"namespace": namespace, "name": name, "uid": uid,
            "pdb_blocked": v.blocked if v is not None else None,
            "pdb": (v.budget or None) if v is not None else None,
            "pdb_detail": v.detail if v is not None else "PodDisruptionBudgets not read"}


def _refused(p: Plan, pods: Iterable[tuple[str, str]]) -> str:
    keys = [f"{ns}/{n}" for ns, n in pods]
    refused = [k for k in keys if (v := p.pdb.get(k)) is not None and v.blocked]
    if not refused:
        return ""
    return (f"; the API server would refuse to evict {', '.join(refused[:8])} (a "
            "PodDisruptionBudget, see each pod's pdb_detail): wait until the budget allows it "
            "(more of its pods healthy elsewhere: scale the workload out first)")


# ---------------------------------------------------------------- what can leave now


def _harmless(change: Change, inputs: Inputs, verdicts: list[BlockVerdict]) -> bool:
    """The plan's own verdict, safe, but for pods a restart would reject already (not the
    change's doing): no pod rejected, no container left stale, no refusal expected, the
    kubelet restarts on its checkpoints, and everything it depends on was read."""
    p = plan(change, inputs, verdicts=verdicts)
    if p.rejected_total and p.rejected_total <= p.rejected_now:
        p = dataclasses.replace(p, rejected_total=0)
    return p.safe


def _most(limit: int, ok: Callable[[int], bool]) -> int:
    """The largest n in 0..limit with ok(n), by bisection (harm only grows with n)."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def unpluggable(inputs: Inputs, verdicts: list[BlockVerdict]) -> tuple[int, int]:
    """(CPUs, bytes of memory) that can be removed now, each on its own, with no pod
    rejected, no running container stale and no kernel refusal expected. PodDisruptionBudgets
    are not asked: they decide whether an eviction can be done, never whether a pod is hurt."""
    inputs = dataclasses.replace(inputs, budgets=Budgets(), not_read={
        k: v for k, v in inputs.not_read.items() if k != PDB_INPUT})
    candidates, _ = cpu_candidates(inputs)
    cpus = _most(min(len(candidates), len(inputs.snapshot.cpus_online) - 1),
                 lambda n: _harmless(Change(-n, 0), inputs, verdicts))
    size = inputs.hardware.block_size or inputs.snapshot.memory_block_size
    if size <= 0:
        return cpus, 0
    can = sum(1 for v in verdicts if v.ok)
    can = min(can, max(0, (inputs.snapshot.mem_total_bytes - 1) // size))
    blocks = _most(can, lambda n: _harmless(Change(0, -n * size), inputs, verdicts))
    return cpus, blocks * size
