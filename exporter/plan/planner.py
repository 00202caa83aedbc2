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
from dataclasses import dataclass

from exporter.correlate.kubelet_view import cpu_list, cpu_manager_problem, memory_manager_problem
from exporter.correlate.readmission_forecast import ForecastView, ReadmissionForecast
from exporter.correlate.running_pods_view import Finding, RunningPodsView
from exporter.events import (
    ContainerCgroup,
    CpuManagerCheckpoint,
    KernelSnapshot,
    MemoryManagerCheckpoint,
    RunningContainers,
)
from exporter.plan.model import (
    BlockLike,
    Change,
    HardwareLike,
    Plan,
    Refusal,
    RejectedPod,
    StaleContainer,
)
from exporter.plan.pages import MOVABLE_ZONE, count_pages

REFUSALS_LISTED = 32  # refusals named one by one; the rest counted
STALE_LISTED = 50  # stale containers named one by one
# Kernel zones in the order blocks are taken from them: DMA32 is kept for devices that need
# memory below 4 GiB.
_ZONE_ORDER = {MOVABLE_ZONE: 0, "Normal": 1, "DMA32": 2, "DMA": 3}

PageFlags = Callable[[int], Mapping[int, int] | None]


@dataclass(frozen=True)
class Inputs:
    """What the planner judges. `forecast`: the pods, the Node and the CPU manager's policy
(a ReadmissionForecast fed with them, or the immutable view of one; None: Kubernetes is
    off); the planner asks it what it would say on hypothetical kernels (what_if), which
    changes nothing in it. Kubernetes on but no Node in it: the pods are unjudged, never
    spared. `pods_unjudged`: why the pods it holds are not all this node's (the pod source
    has not listed them, is down, forbidden, cut at its bound): unjudged too. `running`: the
    running-pods view (its scan, pods and checkpoint; None: not scanned), read, never fed."""

    snapshot: KernelSnapshot
    hardware: HardwareLike
    forecast: ReadmissionForecast | ForecastView | None = None
    running: RunningPodsView | None = None
    cpu_checkpoint: CpuManagerCheckpoint | None = None
    memory_checkpoint: MemoryManagerCheckpoint | None = None
    kubelet_root: str = "/var/lib/kubelet"
    # The kubelet resizes its Node without a restart (KEP-3953's NodeResourceHotPlug gate
    # on, as its /metrics says); no released kubelet does.
    kubelet_resizes: bool = False
    pods_unjudged: str = ""


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


def judge_block(block: BlockLike, flags: Mapping[int, int] | None) -> BlockVerdict:
    zones = block.zones
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
    if pages.unmovable:
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
    for block in _read_order(hardware.blocks):
        if enough is not None and ok >= enough and block.zones[:1] != (MOVABLE_ZONE,):
            break  # enough found, every movable block among them (they come first)
        flags = block.page_flags
        single = len(block.zones) == 1 and block.zones[0] != "none"
        if (flags is None and page_flags is not None and single
                and block.zones[0] != MOVABLE_ZONE and reads < budget
                and (enough is None or ok < enough)):
            flags = page_flags(block.number)
            reads += 1
        verdict = judge_block(block, flags)
        ok += verdict.ok
        out.append(verdict)
    return out


def _take_order(verdicts: Iterable[BlockVerdict]) -> list[BlockVerdict]:
    return sorted((v for v in verdicts if v.ok),
                  key=lambda v: (_ZONE_ORDER.get(v.zone, 9), v.in_use, -v.number))


# ---------------------------------------------------------------- CPUs


def _exclusive_cpus(inputs: Inputs) -> frozenset[int]:
    cp = inputs.cpu_checkpoint
    if cp is not None and cp.present and not cp.error and cp.policy == "static":
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


def _forecast_at(forecast: ReadmissionForecast | ForecastView, hypo: KernelSnapshot
                 ) -> tuple[list[RejectedPod], int, dict[str, int], dict[str, float]] | None:
    """The forecast on `hypo` (rejected pods, their count, by reason, and what a restarted
    kubelet would offer); None without a Node. Nothing of it stays in the forecast."""
    result, offered = forecast.what_if(hypo)
    if result is None or offered is None:
        return None
    (milli, memory, _, _), _, _ = offered
    return ([RejectedPod(r.namespace, r.name, r.reason) for r in result.rejected],
            result.rejected_total, dict(result.by_reason),
            {"cpu": milli / 1000, "memory": float(memory)})


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
    """The plan for `change`. Raises TooLarge when the change is more than the machine has.
    `page_flags` reads a block's kpageflags (at most `page_budget` blocks); `verdicts` are
    block verdicts already made (judge_blocks), reused across plans."""
    snap = inputs.snapshot
    notes: list[str] = []
    refusals: list[Refusal] = []
    cpus = _cpus_to_move(change, inputs, notes, refusals)
    memory = _memory_to_move(change, inputs, page_flags, page_budget, verdicts, notes, refusals)

    cpus_off, cpus_on = frozenset(cpus.take), frozenset(cpus.add)
    hypo = after(snap, cpus_off, cpus_on, memory.take, memory.add)
    if memory.not_present:
        hypo = dataclasses.replace(hypo, mem_total_bytes=hypo.mem_total_bytes
                                   + memory.not_present * memory.size)
    capacity = {"cpu": float(len(hypo.cpus_online)), "memory": float(hypo.mem_total_bytes)}

    pods = _pods_after(inputs, hypo, notes)
    stale = stale_after(inputs.running, hypo, cpus_off, _exclusive_cpus(inputs))
    running = inputs.running is not None and inputs.running.scan is not None \
        and inputs.running.scan.cgroup_version > 0
    if not running:
        notes.append("running containers not judged: no kubepods cgroup scanned")
    problem = _restart_problem(change, inputs, hypo, cpus_off | cpus_on, memory.take)

    plan_ = Plan(change, tuple(cpus.take), tuple(cpus.add), cpus.short, tuple(memory.take),
                 tuple(memory.add), memory.needed, memory.short, memory.size, capacity,
                 tuple(pods.rejected), pods.rejected_total, pods.by_reason, pods.rejected_now,
                 tuple(stale[:STALE_LISTED]), tuple(refusals[:REFUSALS_LISTED]), len(refusals),
                 not problem, problem,
                 inputs.kubelet_resizes and change.cpus >= 0 and change.memory >= 0,
                 pods.kubernetes, running, (), tuple(notes), pods.unjudged,
                 allocatable_after=pods.allocatable)
    return dataclasses.replace(plan_, steps=tuple(steps(plan_, inputs)))


@dataclass(frozen=True)
class _CpusMoved:
    take: list[int]  # CPUs to offline
    add: list[int]  # CPU slots to online (present first)
    short: int  # CPUs asked to leave that none can stand for


def _cpus_to_move(change: Change, inputs: Inputs, notes: list[str],
                  refusals: list[Refusal]) -> _CpusMoved:
    """Which CPUs leave or come for `change.cpus`; when too few can leave, why the others
    cannot (into `refusals`). Raises TooLarge past what the machine has."""
    snap = inputs.snapshot
    online = snap.cpus_online
    if change.cpus < 0:
        n = -change.cpus
        if n >= len(online):
            most = len(online) - 1
            raise TooLarge(f"cpu {change.cpus}: the machine has {len(online)} CPU"
                           f"{'s' if len(online) != 1 else ''} online and keeps at least one; "
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
            raise TooLarge(f"cpu +{change.cpus}: the kernel has room for {len(slots)} more "
                           f"CPU(s) (cpus possible {len(snap.cpus_possible)}, online "
                           f"{len(online)}); add at most {len(slots)}")
        present = [c for c in slots if c in snap.cpus_present]
        add = (present + [c for c in slots if c not in snap.cpus_present])[:change.cpus]
        missing = [c for c in add if c not in snap.cpus_present]
        if missing:
            notes.append(f"{cpu_list(frozenset(missing))} not present: the hypervisor must add "
                         "them first (they then appear offline, or online by udev rule)")
        return _CpusMoved([], add, 0)
    return _CpusMoved([], [], 0)


@dataclass(frozen=True)
class _MemoryMoved:
    take: list[int]  # memory blocks to offline
    add: list[int]  # offline blocks to online
    needed: int  # blocks the change is
    short: int  # bytes asked to leave that no block can stand for
    size: int  # bytes per block
    not_present: int  # blocks to add that the hypervisor must plug first


def _memory_to_move(change: Change, inputs: Inputs, page_flags: PageFlags | None,
                    page_budget: int, verdicts: list[BlockVerdict] | None, notes: list[str],
                    refusals: list[Refusal]) -> _MemoryMoved:
    """Which memory blocks leave or come for `change.memory`, in whole blocks; when too few
    can leave, why the others cannot (into `refusals`). Raises TooLarge past what the machine
    has."""
    snap, hw = inputs.snapshot, inputs.hardware
    size = hw.block_size or snap.memory_block_size
    needed = 0
    if change.memory:
        if size <= 0:
            raise TooLarge("memory: this kernel has no memory hotplug (no "
                           "/sys/devices/system/memory/block_size_bytes)")
        needed = math.ceil(abs(change.memory) / size)
        if needed * size != abs(change.memory):
            notes.append(f"memory moves in blocks of {size} bytes: {abs(change.memory)} bytes "
                         f"is {needed} block(s), {needed * size} bytes")
    if change.memory < 0:
        if needed * size >= snap.mem_total_bytes:
            raise TooLarge(f"memory {change.memory}: the machine has {snap.mem_total_bytes} "
                           f"bytes; take less (a multiple of the {size}-byte block)")
        if verdicts is None:
            verdicts = judge_blocks(hw, page_flags, page_budget, enough=needed)
        ordered = _take_order(verdicts)
        take = [v.number for v in ordered[:needed]]
        short = (needed - len(take)) * size
        if short:
            bad = [v for v in verdicts if not v.ok]
            refusals += [Refusal("memory", v.number, v.reason, v.detail) for v in bad]
            counts: dict[str, int] = {}
            for v in bad:
                counts[v.reason] = counts.get(v.reason, 0) + 1
            notes.append(f"only {len(ordered)} of {len(verdicts)} online blocks can be "
                         "expected to go: " + ", ".join(f"{n} {r.replace('_', ' ')}"
                                                          for r, n in sorted(counts.items())))
        return _MemoryMoved(take, [], needed, short, size, 0)
    if change.memory > 0:
        add = sorted(snap.memory_blocks_offline)[:needed]
        if len(add) < needed:
            notes.append(f"{needed - len(add)} block(s) not present: the hypervisor must "
                         "add them first (a DIMM, virtio-mem); they then appear offline, or "
                         f"online as auto_online_blocks says ({hw.auto_online or 'unknown'})")
        zones = {z for b in hw.blocks if b.number in set(add) for z in b.zones[:1]}
        if hw.auto_online in ("online", "online_kernel") or zones - {MOVABLE_ZONE}:
            notes.append("online hot-added memory as online_movable (echo online_movable > "
                         ".../memoryN/state, or auto_online_blocks=online_movable): memory "
                         "onlined into a kernel zone may never leave again")
        return _MemoryMoved([], add, needed, 0, size, needed - len(add))
    return _MemoryMoved([], [], needed, 0, size, 0)


@dataclass(frozen=True)
class _PodsAfter:
    rejected: list[RejectedPod]
    rejected_total: int
    by_reason: dict[str, int]
    allocatable: dict[str, float]  # what a restarted kubelet would offer
    rejected_now: int  # what a restart before the change would reject
    kubernetes: bool  # the pods were judged (a Node status read)
    unjudged: tuple[str, ...] = ()  # why the pods could not be judged: never safe


# Kubernetes on and no Node: the pods cannot be judged (the API server unreachable from the
# start, a wrong --node-name, a Node not registered yet, nodes not readable).
NO_NODE = ("pods: no Node status read for this node (check --node-name and that the exporter "
           "may get nodes and reaches the API server)")


def _pods_after(inputs: Inputs, hypo: KernelSnapshot, notes: list[str]) -> _PodsAfter:
    """What a kubelet restart would reject on the machine after the change (and now)."""
    forecast, snap = inputs.forecast, inputs.snapshot
    if forecast is None:
        notes.append("pods not judged: Kubernetes is off (pass --kubeconfig, or run in the "
                     "cluster)")
        return _PodsAfter([], 0, {}, {}, 0, False)
    now = _forecast_at(forecast, snap)
    later = _forecast_at(forecast, hypo)
    rejected, rejected_total, by_reason, allocatable = later if later is not None \
        else ([], 0, {}, {})
    kubernetes = later is not None
    unjudged: tuple[str, ...] = () if kubernetes else (NO_NODE,)
    if inputs.pods_unjudged:
        unjudged += (inputs.pods_unjudged,)
    return _PodsAfter(rejected, rejected_total, by_reason, allocatable,
                      now[1] if now is not None else 0, kubernetes, unjudged)


def _restart_problem(change: Change, inputs: Inputs, hypo: KernelSnapshot,
                     cpus_moved: frozenset[int], memory_taken: list[int]) -> str:
    """Why a kubelet restart after the change would fail on its checkpoints ("" if not)."""
    problem = ""
    if inputs.cpu_checkpoint is not None and cpus_moved:
        problem = cpu_manager_problem(inputs.cpu_checkpoint, hypo.cpus_online) or ""
    if not problem and inputs.memory_checkpoint is not None and (memory_taken or change.memory):
        problem = memory_manager_problem(inputs.memory_checkpoint, hypo) or ""
    return problem


def steps(p: Plan, inputs: Inputs) -> list[str]:
    """The safe order: what must move first, then the memory (which can be refused: nothing
    has changed yet when it is), then the CPUs, then the kubelet."""
    out: list[str] = []
    cp = inputs.cpu_checkpoint
    static = cp is not None and cp.present and not cp.error and cp.policy == "static"
    removing = bool(p.cpu_take or p.memory_take)
    if p.rejected_pods:
        names = ", ".join(f"{r.namespace}/{r.name}" for r in p.rejected_pods[:8])
        more = p.rejected_total - min(8, len(p.rejected_pods))
        out.append(f"move away the pods the kubelet would reject ({names}"
                   f"{f' and {more} more' if more else ''}): drain them or lower their requests")
    pinned = sorted({f"{c.namespace}/{c.pod}" for c in p.stale_containers
                     if c.kind == "cpuset_exclusive"})
    if pinned:
        out.append(f"move away the pods pinned to the CPUs that go ({', '.join(pinned[:8])})")
    for what in sorted({c.kind for c in p.stale_containers} - {"cpuset_exclusive"}):
        out.append(f"after the change, re-create the pods whose containers would be stale "
                   f"({what})")
    if p.memory_take:
        out.append("offline the memory blocks one at a time, largest number first, before any "
                   "CPU (a refused block changes nothing): echo offline > "
                   "/sys/devices/system/memory/memoryN/state for N in "
                   + " ".join(str(n) for n in sorted(p.memory_take, reverse=True)[:16])
                   + (" ..." if len(p.memory_take) > 16 else "")
                   + "; if one is refused (EBUSY), online the ones already taken and plan "
                   "again; then let the hypervisor unplug them")
    if p.cpu_take and static:
        out.append("stop the kubelet before the CPUs go (its static CPU manager checkpoint "
                   "names them)")
    if p.cpu_take:
        out.append("offline the CPUs, then let the hypervisor unplug them: " + "; ".join(
            f"echo 0 > /sys/devices/system/cpu/cpu{c}/online" for c in p.cpu_take))
    if p.memory_add or p.change.memory > 0:
        out.append("let the hypervisor add the memory, then online the new blocks as "
                   "online_movable")
    if p.cpu_add or p.change.cpus > 0:
        if static:
            out.append("stop the kubelet before the CPUs come (its static CPU manager "
                       "checkpoint lacks them)")
        out.append("online the CPUs: " + "; ".join(
            f"echo 1 > /sys/devices/system/cpu/cpu{c}/online" for c in p.cpu_add))
    if static and (p.cpu_take or p.cpu_add):
        out.append(f"delete {cp.path if cp is not None else inputs.kubelet_root} and start the "
                   "kubelet: it writes a new checkpoint for the CPUs online")
    elif not p.kubelet_restarts:
        out.append(f"the kubelet would not restart ({p.kubelet_problem}): stop it, delete the "
                   "checkpoint it names and start it")
    elif p.kubelet_picks_up_without_restart:
        out.append("nothing more: the kubelet resizes its Node without a restart")
    elif removing or p.cpu_add or p.memory_add or p.change.cpus > 0 or p.change.memory > 0:
        out.append("restart the kubelet so the Node shows the new capacity (it reads the "
                   "machine once, at start), then check that no pod was rejected")
    return out


# ---------------------------------------------------------------- what can leave now


def _harmless(change: Change, inputs: Inputs, verdicts: list[BlockVerdict]) -> bool:
    """No pod rejected, no container left stale, no refusal expected. The kubelet's
    checkpoints are not counted: they block a restart until deleted (a step of the
    procedure), not the capacity."""
    try:
        p = plan(change, inputs, verdicts=verdicts)
    except TooLarge:
        return False
    return not (p.rejected_total > p.rejected_now or p.stale_containers or p.cpu_short
                or p.memory_short_bytes or p.unjudged)


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
    rejected, no running container stale and no kernel refusal expected."""
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
