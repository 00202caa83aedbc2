"""The resizes hypervisors do: virtio-mem and virtio-balloon in the lab guest.

The guest has two virtio-mem devices (lab/qemu.py PARAVIRT_MEMORY: vmem0 with 2 MiB device
blocks, so the guest driver runs it in sub-block mode; vmem1 with 256 MiB blocks, big-block
mode) and a virtio-balloon without deflate-on-oom. These scenarios run after lab/scenarios.py's
on the same guest and exporter (one boot for both). Each asks QEMU for a change over QMP, waits
for the guest to make it (its MemTotal, its memory blocks, QEMU's own account of the device),
and then checks what the exporter made of it:

- its kernel capacity equals the guest's MemTotal, and how long after the QMP command it did
  (`latency`: the kprobe on the managed page count pokes the sysfs reconciler; without it a
  sub-block or balloon change would wait for the 30 s re-read, past every wait here);
- the gauges: a virtio-mem device's region and plugged bytes as QEMU says them, the balloon's
  held bytes;
- the journal's episodes: every change no block made is one transition naming its mechanism,
  whose pages add up to the MemTotal it moved (nothing counted twice).

The latencies land in LATENCIES (mechanism -> seconds) for bench/paravirt_latency.py and
bench/README.md.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from lab.qemu import BALLOON, VIRTIO_MEM_BBM, VIRTIO_MEM_REGION_MIB, VIRTIO_MEM_SBM, MiB
from lab.scenarios import (
    BUDGET_SECONDS,
    LabRun,
    Outcome,
    Scenario,
    ScenarioFailed,
    _plan_http,
    check,
    online_blocks,
    scenario,
)
from testkit.exporter_proc import Scrape

PAGE = 4096
AUTO_ONLINE = "/sys/devices/system/memory/auto_online_blocks"
# These scenarios' own share of time, on top of lab/scenarios.py's BUDGET_SECONDS (which its
# scenarios may use up on a busy machine): measured here 3-5 min under a load average of 20-60,
# the journal read at the end the slowest part.
VIRTIO_BUDGET_SECONDS = 360.0
QUIET_SECONDS = 2.5  # past the correlator's 2 s coalescing window: the next change is its own
FOLLOW_SECONDS = 10.0  # the exporter must show a change this soon (the timer re-read is 30 s)
MEMORY = "/sys/devices/system/memory"
MEMORY_BLOCK = 128 * MiB  # the guest's memory block size
KERNEL_ZONE_MIB = 256  # vmem1's big block
# A partial big-block unplug: the driver migrates a big block's pages before removing it (seconds
# under TCG, with no plugged-size move meanwhile); settled once nothing moved for this long
PARTIAL_STABLE_SECONDS = 20.0
LATENCIES: dict[str, list[float]] = defaultdict(list)
DIMM_ID = "dimm-virtio"


def _scrape(run: LabRun) -> Scrape:
    return run.lab.scrape()


def capacity(s: Scrape) -> float | None:
    return s.value("node_resize_kernel_capacity", None, resource="memory", unit="byte")


def follow(run: LabRun, t0: float, mem_kb: int, mechanism: str,
           extra: Callable[[Scrape], bool] = lambda s: True) -> tuple[Scrape, float]:
    """Scrape every 0.1 s until the exporter's capacity is the guest's MemTotal (and `extra`
    holds); the seconds since t0 (the QMP command) are the mechanism's latency."""
    want = mem_kb * 1024
    deadline = time.monotonic() + run.budget(FOLLOW_SECONDS)
    while True:
        s = _scrape(run)
        if capacity(s) == want and extra(s):
            took = time.monotonic() - t0
            LATENCIES[mechanism].append(took)
            return s, took
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"{mechanism}: the exporter's memory capacity {capacity(s)} "
                                 f"never reached the guest's MemTotal {want} in "
                                 f"{FOLLOW_SECONDS:.0f} s")
        time.sleep(0.1)


def vmem_settled(run: LabRun, device: str, want: int, timeout: float = 60.0,
                 exact: bool = True, stable: float = 3.0) -> dict:
    """Wait until QEMU says the device has `want` bytes plugged (or, with exact=False, until
    its plugged size stopped moving for `stable` s: the guest honoured what it could)."""
    qmp = run.lab.guest.qmp
    assert qmp is not None
    deadline = time.monotonic() + run.budget(timeout)
    last, since = None, time.monotonic()
    while True:
        info = qmp.virtio_mem(device)
        if exact and info["size"] == want:
            return info
        if info["size"] != last:
            last, since = info["size"], time.monotonic()
        elif not exact and time.monotonic() - since >= stable:
            return info
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"{device}: QEMU says {info['size']} bytes plugged, asked "
                                 f"{want}, after {timeout:.0f} s")
        time.sleep(0.2)


def mem_settled(run: LabRun, what: str, before_kb: int | None = None) -> dict:
    """The guest's state once MemTotal stood still for 1 s (and moved from before_kb)."""
    last: int | None = None
    deadline = time.monotonic() + run.budget(60)
    while True:
        st = run.lab.state()
        if st["mem_total_kb"] == last and (before_kb is None or last != before_kb):
            return st
        last = st["mem_total_kb"]
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"the guest's MemTotal did not settle: {what}")
        time.sleep(1.0)


def plugged_gauge(s: Scrape, device: str) -> float | None:
    """The exporter's plugged bytes of the virtio-mem device QEMU calls `device`: the guest
    names it virtioN, so it is found by its region size and matched on the plugged value."""
    return s.value("node_resize_virtio_mem_plugged_bytes", None, device=device)


def guest_device(run: LabRun, qemu_id: str) -> str:
    """The guest's name (virtioN) of a virtio-mem device: its region in /proc/iomem starts at
    the address QEMU placed it."""
    qmp = run.lab.guest.qmp
    assert qmp is not None
    addr = qmp.virtio_mem(qemu_id)["memaddr"]
    iomem = run.lab.call("read", path="/proc/iomem")["value"]
    for line in iomem.splitlines():
        if not line.startswith(" ") and " : virtio" in line:
            span, _, name = line.partition(" : ")
            if int(span.split("-")[0], 16) == addr:
                return name.strip()
    raise ScenarioFailed(f"no /proc/iomem region of {qemu_id} at {addr:#x}:\n{iomem[-800:]}")


@dataclass
class Expectation:
    """What one scenario's episodes must show, judged once at the end (the journal is read by
    a program started in the guest: one read, not one per scenario). `window`: the guest's
    clock from just before the change to just after it; `judge` gets the episodes opened in it
    and returns what is wrong ("" when nothing is)."""

    scenario: str
    window: tuple[float, float]
    judge: Callable[[list[dict]], str]


EXPECTATIONS: list[Expectation] = []


def guest_time(run: LabRun) -> float:
    return float(run.lab.state()["time"])


def expect(scenario: str, since: float, run: LabRun,
           judge: Callable[[list[dict]], str]) -> None:
    quiet()  # the change's episode has closed
    EXPECTATIONS.append(Expectation(scenario, (since, guest_time(run)), judge))


def managed_pages(episodes: list[dict], mechanism: str) -> int:
    """The signed pages of the changes no block made, by `mechanism`, in these episodes."""
    return sum(-t["nr_pages"] if t["direction"] == "offline" else t["nr_pages"]
               for e in episodes for t in e.get("transitions", [])
               if t.get("mechanism") == mechanism)


def own_budget(run: LabRun) -> None:
    """Give the virtio scenarios VIRTIO_BUDGET_SECONDS from the first of them on, whatever the
    scenarios before them left of the lab's budget (once per run)."""
    if getattr(run, "virtio_budget", False):
        return
    run.virtio_budget = True  # type: ignore[attr-defined]
    if run.remaining() < VIRTIO_BUDGET_SECONDS:
        run.started = time.monotonic() - (BUDGET_SECONDS - VIRTIO_BUDGET_SECONDS)


def quiet() -> None:
    """Let the last scenario's episode close: a change inside its coalescing window would
    join it (README, "Flap storms")."""
    time.sleep(QUIET_SECONDS)


def _vmem_step(run: LabRun, out: Outcome, device: str, request_mib: int, mechanism: str,
               exact: bool = True, stable: float = 3.0) -> tuple[int, int]:
    """Set the device's requested size, wait for the guest and the exporter; returns
    (MemTotal kB before, after)."""
    qmp = run.lab.guest.qmp
    assert qmp is not None
    before = run.lab.state()
    t0 = time.monotonic()
    qmp.set_virtio_mem_size(device, request_mib * MiB)
    info = vmem_settled(run, device, request_mib * MiB, exact=exact, stable=stable)
    st = mem_settled(run, f"{device} to {request_mib} MiB")
    name = guest_device(run, device)
    s, took = follow(run, t0, st["mem_total_kb"], mechanism,
                     lambda s: plugged_gauge(s, name) == info["size"]
                     and s.value("node_resize_virtio_mem_requested_bytes", None, device=name)
                     == request_mib * MiB)
    region = s.value("node_resize_virtio_mem_region_bytes", None, device=name)
    check(region == VIRTIO_MEM_REGION_MIB * MiB,
          f"{name} region gauge {region}, want {VIRTIO_MEM_REGION_MIB} MiB")
    out.kernel += (f"{'; ' if out.kernel else ''}{device} -> {request_mib} MiB: plugged "
                   f"{info['size'] // MiB} MiB, MemTotal {before['mem_total_kb']} -> "
                   f"{st['mem_total_kb']} kB, {len(online_blocks(st))} blocks online")
    out.exporter += (f"{'; ' if out.exporter else ''}capacity = MemTotal and plugged "
                     f"{info['size'] // MiB} MiB after {took * 1000:.0f} ms")
    return before["mem_total_kb"], st["mem_total_kb"]


# ---------------------------------------------------------------- virtio-mem


@scenario("virtio-mem sub-block: plug 192 MiB, unplug in 32 MiB steps, plug 64 MiB back")
def vmem_sub_block(run: LabRun, out: Outcome) -> None:
    """1.5 memory blocks plugged (the half block is a block partly plugged), then sub-blocks
    unplugged from and plugged into online blocks: MemTotal moves, no block does."""
    own_budget(run)
    quiet()
    _vmem_step(run, out, VIRTIO_MEM_SBM, 192, "virtio-mem sub-block (plug)")
    for mib in (160, 224):
        blocks = online_blocks(run.lab.state())
        before, after = _vmem_step(run, out, VIRTIO_MEM_SBM, mib, "virtio-mem sub-block")
        check(online_blocks(run.lab.state()) == blocks,
              f"a memory block changed state on a sub-block change to {mib} MiB")
        check(abs(after - before) * 1024 in (32 * MiB, 64 * MiB),
              f"MemTotal moved {after - before} kB for a sub-block change to {mib} MiB")


@scenario("virtio-mem big-block: plug 256 MiB (two blocks), unplug it")
def vmem_big_block(run: LabRun, out: Outcome) -> None:
    """Whole blocks in and out. Unplugging, the driver first takes the blocks' pages out of
    the managed count (a managed change), then offlines and removes the blocks (which then
    moves MemTotal by nothing): the episode holds both, and its pages are MemTotal's, once."""
    quiet()
    boot_blocks = online_blocks(run.lab.state())
    _vmem_step(run, out, VIRTIO_MEM_BBM, 256, "virtio-mem big-block")
    bbm_blocks = online_blocks(run.lab.state()) - boot_blocks
    check(len(bbm_blocks) == 2, "a 256 MiB big block did not add two memory blocks")
    quiet()
    since = guest_time(run)
    before, after = _vmem_step(run, out, VIRTIO_MEM_BBM, 0, "virtio-mem big-block")
    check(online_blocks(run.lab.state()) == boot_blocks, "the big block's memory blocks stayed")
    units = {int(b[6:]) for b in bbm_blocks}

    def judge(episodes: list[dict]) -> str:
        # The driver may take the two blocks' pages in two goes (one block's migration failed
        # and was retried): every episode of the unplug, together, is the change.
        pages = managed_pages(episodes, "virtio-mem")
        offlined = {t["unit"] for e in episodes for t in e.get("transitions", [])
                    if t.get("mechanism") is None and t["direction"] == "offline"
                    and t["result"] == "success"}
        if not units <= offlined:
            return f"block transitions offline {sorted(offlined)}, want {sorted(units)}"
        if pages * PAGE != (after - before) * 1024:
            return (f"the unplug's virtio-mem pages are {pages * PAGE} bytes, MemTotal moved "
                    f"{(after - before) * 1024}: counted twice or missed")
        return ""

    expect("big-block unplug", since, run, judge)


@scenario("virtio-mem sub-block and a DIMM in one episode")
def vmem_and_dimm(run: LabRun, out: Outcome) -> None:
    """A DIMM hot-added and virtio-mem sub-blocks plugged within the coalescing window: one
    increase episode holds the DIMM's block transitions and the sub-block change, its detail
    names virtio-mem, and its pages are the sub-blocks' exactly."""
    qmp = run.lab.guest.qmp
    assert qmp is not None
    quiet()
    before = run.lab.state()
    since = float(before["time"])
    t0 = time.monotonic()
    qmp.add_dimm(DIMM_ID, 512 * MiB)
    qmp.set_virtio_mem_size(VIRTIO_MEM_SBM, 256 * MiB)  # 224 -> 256: sub-blocks, online
    vmem_settled(run, VIRTIO_MEM_SBM, 256 * MiB)
    st = run.wait_guest(lambda st: len(online_blocks(st)) == len(online_blocks(before)) + 4,
                        "online the DIMM's 4 blocks")
    st = mem_settled(run, "DIMM and virtio-mem")
    dimm = {int(b[6:]) for b in online_blocks(st) - online_blocks(before)}
    follow(run, t0, st["mem_total_kb"], "ACPI DIMM + virtio-mem")
    out.kernel = (f"DIMM 512 MiB + {VIRTIO_MEM_SBM} 224 -> 256 MiB: MemTotal "
                  f"{before['mem_total_kb']} -> {st['mem_total_kb']} kB")
    out.exporter = "capacity = MemTotal"

    def judge(episodes: list[dict]) -> str:
        joined = [e for e in episodes if e.get("change") == "increase" and dimm <= {
            t.get("unit") for t in e.get("transitions", []) if t.get("mechanism") is None}]
        if len(joined) != 1:
            return f"{len(joined)} increase episodes hold the DIMM's blocks {sorted(dimm)}"
        [ep] = joined
        pages = managed_pages([ep], "virtio-mem")
        if pages * PAGE != 32 * MiB:
            return (f"the DIMM's episode has {pages * PAGE} bytes of virtio-mem pages, want "
                    f"32 MiB (224 -> 256): {ep.get('detail')!r}")
        if "virtio-mem: +32 MiB" not in ep.get("detail", ""):
            return f"the episode's detail does not name virtio-mem: {ep.get('detail')!r}"
        return ""

    expect("DIMM and virtio-mem", since, run, judge)
    qmp.remove_dimm(DIMM_ID, timeout=run.budget(120))


@scenario("orchestrator: a virtio-mem device shrunk as the plan says (requested-size, QMP)")
def vmem_orchestrator(run: LabRun, out: Outcome) -> None:
    """examples/orchestrator.py on a plan for 128 MiB with only virtio-mem to give (vmem0's
    movable blocks after the DIMM went): it offlines the block the plan names, then sets the
    device's requested-size to what the action says (lab/scenarios_orchestrator.py
    QMPHypervisor); the driver unplugs the offline block. The guest shrinks by exactly that,
    QEMU's plugged size is the action's, the exporter follows."""
    from lab.scenarios_orchestrator import carry_out, client, executor
    lab, qmp = run.lab, run.lab.guest.qmp
    assert qmp is not None
    quiet()
    name = guest_device(run, VIRTIO_MEM_SBM)
    plugged = qmp.virtio_mem(VIRTIO_MEM_SBM)["size"]
    before = lab.state()
    s = lab.wait_scrape(lambda s: plugged_gauge(s, name) == plugged, run.budget(30),
                        f"{name} plugged {plugged}")
    lowerable = s.value("node_resize_virtio_mem_lowerable_bytes", None, device=name)
    c = client(run)
    answer = c.ask(memory="-128Mi")
    check(answer.safe, f"the plan for -128Mi is {answer.body.get('verdict')}: "
          f"{answer.body.get('harm')} {answer.body.get('unknown')}")
    [act] = [a for a in answer.actions() if a.do == "hypervisor_remove"]
    device = act.raw["device"]
    ex, node, hv = executor(run)
    t0 = time.monotonic()
    done = carry_out(c, answer, ex)
    want = int(act.raw["requested_size_bytes"])
    st = mem_settled(run, f"{VIRTIO_MEM_SBM} to {want // MiB} MiB")
    _, took = follow(run, t0, st["mem_total_kb"], "virtio-mem sub-block (orchestrator)")
    # The driver removes the offline block after MemTotal moved (at the offline): the plugged
    # gauge follows at that removal's event, or at the paravirt source's 30 s re-read.
    lab.wait_scrape(lambda s: plugged_gauge(s, name) == want, run.budget(45),
                    f"{name} plugged {want}")
    offlined = [p.split("/")[-2] for p, v, e in node.writes if v == "offline" and not e]
    out.kernel = (f"client: {', '.join(a.do for a in done.done)}; offlined "
                  f"{', '.join(offlined)}, {VIRTIO_MEM_SBM} requested-size {plugged // MiB} -> "
                  f"{want // MiB} MiB; MemTotal {before['mem_total_kb']} -> "
                  f"{st['mem_total_kb']} kB")
    out.exporter = (f"plan -128Mi safe: {device['id']} ({device['virtio_mem']}); capacity = "
                    f"MemTotal and plugged {want // MiB} MiB after {took * 1000:.0f} ms")
    check(device["id"] == name and hv.removed == [VIRTIO_MEM_SBM],
          f"the plan named {device['id']}, QEMU's {hv.removed}; want {name}, {VIRTIO_MEM_SBM}")
    check(want == plugged - 128 * MiB and act.raw["hypervisor_rollback"] ==
          {"requested_size_bytes": plugged}, f"requested-size {want}, rollback "
          f"{act.raw['hypervisor_rollback']}, plugged was {plugged}")
    check((before["mem_total_kb"] - st["mem_total_kb"]) * 1024 == 128 * MiB,
          f"MemTotal moved {before['mem_total_kb'] - st['mem_total_kb']} kB, not 128 MiB")
    check(device["virtio_mem"]["lowerable_bytes"] == lowerable,
          f"the plan's lowerable_bytes {device['virtio_mem']} is not the gauge's {lowerable}")


@scenario("virtio-mem in a kernel zone: an unplug the guest honours in part, as the plan said")
def vmem_kernel_zone(run: LabRun, out: Outcome) -> None:
    """vmem1 (big blocks of 256 MiB) plugged to 512 MiB with auto_online_blocks=online_kernel:
    its four memory blocks in ZONE_NORMAL. Unmovable pages must land in them, and newly
    onlined pages sit at the free lists' tail: lab/pin_pages.py first fills the rest of the
    kernel's free memory with huge pages (the filler), then fills pipes (pipe buffers:
    GFP_HIGHUSER, never migrated) until /proc/kpageflags shows them in one of the device's
    blocks, then frees the filler. The plan, asked before (GET /plan?memory=-512Mi), names
    what the device can give back; then requested-size 0 over QMP: the driver removes each
    big block it can empty and keeps one holding a pinned page. Plugged settles above the
    requested size, the exporter's capacity is the guest's MemTotal, the episode's virtio-mem
    pages are what MemTotal moved, and neither the plan nor the lowerable gauge promised more
    than the guest gave back."""
    from lab.scenarios_orchestrator import _pin  # imports this module (LAB_ORDER)
    lab = run.lab
    qmp = lab.guest.qmp
    assert qmp is not None
    quiet()
    pin: int | None = None
    policy = lab.call("read", path=AUTO_ONLINE)["value"].strip()
    check(lab.call("write", path=AUTO_ONLINE, value="online_kernel")["errno"] == 0,
          "cannot set auto_online_blocks")
    try:
        _vmem_step(run, out, VIRTIO_MEM_BBM, 2 * KERNEL_ZONE_MIB,
                   "virtio-mem big-block (plug)")
        info = qmp.virtio_mem(VIRTIO_MEM_BBM)
        first = info["memaddr"] // MEMORY_BLOCK
        blocks = list(range(first, first + info["size"] // MEMORY_BLOCK))
        zones = {n: lab.call("read", path=f"{MEMORY}/memory{n}/valid_zones")["value"].strip()
                 for n in blocks}
        check(set(zones.values()) == {"Normal"}, f"{VIRTIO_MEM_BBM}'s blocks: {zones}")
        # vmem0's movable blocks serve huge pages first: --movable-too fills them as well
        pin, pinned = _pin(run, blocks, "--movable-too")
        check(bool(pinned.get("ok")), f"no pipe buffer landed in {VIRTIO_MEM_BBM}'s blocks "
              f"{blocks}: {pinned}")
        name = guest_device(run, VIRTIO_MEM_BBM)
        plugged = info["size"]
        s = lab.wait_scrape(lambda s: plugged_gauge(s, name) == plugged, run.budget(30),
                            f"{name} plugged {plugged}")
        lowerable = s.value("node_resize_virtio_mem_lowerable_bytes", None, device=name)
        plan = _plan_http(run, f"memory=-{plugged // MiB}Mi")
        mine = [d for d in plan["memory"]["devices"] if d["id"] == name]
        offered = sum(d["bytes"] for d in mine)
        acts = [a for a in plan["actions"] if a["do"] == "hypervisor_remove"
                and a.get("device", {}).get("id") == name]
        since = guest_time(run)
        before, after = _vmem_step(run, out, VIRTIO_MEM_BBM, 0,
                                   "virtio-mem big-block (kernel zone)", exact=False,
                                   stable=PARTIAL_STABLE_SECONDS)
        left = qmp.virtio_mem(VIRTIO_MEM_BBM)["size"]
    finally:
        lab.call("write", path=AUTO_ONLINE, value=policy)
        if pin is not None:
            lab.stop_program(pin)
    # What the guest kept stays (the driver would retry once the pins are gone, later)
    qmp.set_virtio_mem_size(VIRTIO_MEM_BBM, left)
    busy = sorted(int(n) for n, c in pinned["pinned"].items() if int(c))
    out.kernel += (f"; pipe buffers pinned in memory{busy} ({pinned['bytes'] // MiB} MiB "
                   f"of pipes, {pinned['seconds']} s); asked 0, the guest kept "
                   f"{left // MiB} MiB plugged")
    out.exporter += (f"; before: lowerable gauge {(lowerable or 0) / MiB:.0f} MiB, plan "
                     f"-{plugged // MiB}Mi {plan['verdict']} offering {offered // MiB} MiB "
                     + (f"(requested-size -> {acts[0].get('requested_size_bytes', 0) // MiB} "
                        "MiB)" if acts else "(no hypervisor action)"))
    check(left > 0, f"the guest gave all {plugged // MiB} MiB back: the pins in {busy} did "
          "not keep a big block")
    check(lowerable is not None and lowerable < plugged and lowerable <= plugged - left,
          f"the lowerable gauge said {lowerable}, the guest gave back {plugged - left}")
    check(plan["verdict"] != "safe" and offered <= plugged - left,
          f"the plan ({plan['verdict']}) offered {offered} bytes of {name}, the guest gave "
          f"back {plugged - left}: a false safe")
    check(not mine or mine[0].get("virtio_mem", {}).get("lowerable_bytes") == lowerable,
          f"the plan's lowerable_bytes {mine and mine[0].get('virtio_mem')} is not the "
          f"gauge's {lowerable}")

    def judge(episodes: list[dict]) -> str:
        pages = managed_pages(episodes, "virtio-mem")
        if pages * PAGE != (after - before) * 1024:
            return (f"the partial unplug's virtio-mem pages are {pages * PAGE} bytes, MemTotal "
                    f"moved {(after - before) * 1024}")
        return ""

    expect("kernel-zone partial unplug", since, run, judge)


# ---------------------------------------------------------------- virtio-balloon


def held(s: Scrape, oom: str) -> float | None:
    return s.value("node_resize_virtio_balloon_held_bytes", None, deflate_on_oom=oom)


@scenario("virtio-balloon (no deflate-on-oom): inflate 256 MiB, deflate")
def balloon_inflate_deflate(run: LabRun, out: Outcome) -> None:
    lab, qmp = run.lab, run.lab.guest.qmp
    assert qmp is not None
    ram = qmp.query_balloon()
    since = guest_time(run)
    for target, want_held in ((ram - 256 * MiB, 256 * MiB), (ram, 0)):
        quiet()  # the deflate is an episode of its own, not a flap of the inflate
        before = lab.state()
        t0 = time.monotonic()
        qmp.balloon(target)
        poll = time.monotonic() + run.budget(60)
        while qmp.query_balloon() != target and time.monotonic() < poll:
            time.sleep(0.2)
        st = mem_settled(run, f"balloon to {target // MiB} MiB", before["mem_total_kb"])
        s, took = follow(run, t0, st["mem_total_kb"], "virtio-balloon",
                         lambda s, w=want_held: held(s, "false") == w)
        moved = (st["mem_total_kb"] - before["mem_total_kb"]) * 1024
        out.kernel += (f"{'; ' if out.kernel else ''}balloon target {target // MiB} MiB: "
                       f"MemTotal {moved // MiB:+d} MiB")
        out.exporter += (f"{'; ' if out.exporter else ''}capacity = MemTotal, held "
                         f"{want_held // MiB} MiB after {took * 1000:.0f} ms")
        check(abs(moved) == 256 * MiB, f"MemTotal moved {moved} bytes, want 256 MiB")

    def judge(episodes: list[dict]) -> str:
        pages = [managed_pages([e], "virtio-balloon") for e in episodes]
        taken, given = sum(p for p in pages if p < 0), sum(p for p in pages if p > 0)
        if (taken, given) != (-65536, 65536):
            return (f"the balloon's episodes moved {pages} pages, want 65536 (256 MiB) each "
                    "way: counted twice or missed")
        if not all("virtio-balloon" in e.get("detail", "") for e in episodes):
            return f"an episode's detail does not name the balloon: " \
                   f"{[e.get('detail') for e in episodes]}"
        return ""

    expect("balloon inflate and deflate", since, run, judge)


@scenario("virtio-balloon with deflate-on-oom: inflate holds memory, MemTotal stays")
def balloon_deflate_on_oom(run: LabRun, out: Outcome) -> None:
    """One balloon per VM: the first is unplugged and one with deflate-on-oom plugged. Its
    pages stay in MemTotal (the guest takes them back under pressure): held moves, capacity
    does not, and no transition is counted."""
    lab, qmp = run.lab, run.lab.guest.qmp
    assert qmp is not None
    qmp.remove_device(BALLOON, timeout=run.budget(60))
    qmp.execute("device_add", driver="virtio-balloon-pci", id="balloon1",
                **{"deflate-on-oom": True})
    # Nothing pokes the paravirt source when a balloon device arrives: its 30 s re-read
    # finds it (then it reads the balloon every second).
    run.lab.wait_scrape(lambda s: held(s, "true") is not None, run.budget(45),
                        "a balloon with deflate_on_oom=true")
    ram = qmp.query_balloon()
    before, scrape0 = lab.state(), _scrape(run)
    tx0 = scrape0.total("node_resize_kernel_transitions_total", resource="memory")
    t0 = time.monotonic()
    qmp.balloon(ram - 128 * MiB)
    s, took = follow(run, t0, before["mem_total_kb"], "virtio-balloon (deflate-on-oom)",
                     lambda s: held(s, "true") == 128 * MiB)
    st = lab.state()
    tx = s.total("node_resize_kernel_transitions_total", resource="memory")
    out.kernel = (f"balloon1 (deflate-on-oom) inflated 128 MiB: MemTotal "
                  f"{before['mem_total_kb']} -> {st['mem_total_kb']} kB")
    out.exporter = f"held 128 MiB after {took * 1000:.0f} ms, memory transitions +{tx - tx0:.0f}"
    check(st["mem_total_kb"] == before["mem_total_kb"], "MemTotal moved")
    check(tx == tx0, f"{tx - tx0} memory transitions counted for a deflate-on-oom inflate")
    qmp.balloon(ram)


@scenario("virtio episodes: every change seen once, named by its mechanism")
def virtio_episodes(run: LabRun, out: Outcome) -> None:
    """The journal, read once: each scenario's expectations on the episodes it made."""
    check(bool(EXPECTATIONS), "no scenario left an expectation (they failed before)")
    episodes = run.episodes()
    wrong = []
    for e in EXPECTATIONS:
        lo, hi = e.window
        mine = [ep for ep in episodes if lo <= ep["opened"] <= hi]
        why = e.judge(mine)
        out.exporter += f"{'; ' if out.exporter else ''}{e.scenario}: " + (
            why or " / ".join(repr(ep.get("detail", "")) for ep in mine))
        if why:
            wrong.append(f"{e.scenario}: {why}")
    out.kernel = f"{len(episodes)} episodes in the journal, {len(EXPECTATIONS)} checked"
    check(not wrong, "; ".join(wrong))


SCENARIOS: tuple[Scenario, ...] = (
    vmem_sub_block, vmem_big_block, vmem_and_dimm, vmem_orchestrator, balloon_inflate_deflate,
    balloon_deflate_on_oom, vmem_kernel_zone, virtio_episodes,
)
