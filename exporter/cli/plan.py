"""`node-resize-exporter plan`: before you unplug (or plug), what the change would do.

Reads what `run` reads, once (the kernel's CPUs and memory blocks, the removable memory
devices and CPU topology, the page flags of the blocks it considers, the kubelet's
checkpoints and configuration, the running containers' cgroups, this node's Node and pods
from the API server), hands them to the pure planner and frames its answer as GET /plan does
(exporter/plan/answer.py: one answer, whoever asks). It changes nothing.

Every input the answer depends on is read or named as not read: beside a kubelet, pods not
listed (Kubernetes off, the API unreachable), a kubelet root without the kubelet's files or a
scan that missed containers make the answer "cannot tell", never "safe".
Exit 0: safe; 1: it would hurt or cannot be done; 2: bad input or configuration; 3: cannot
tell (something it depends on was not read; the answer says what).
"""
from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import click

from exporter.config.options import (
    KUBECONFIG,
    KUBERNETES,
    NODE_NAME,
    PROCFS_ROOT,
    SYSFS_ROOT,
    Options,
)
from exporter.plan.model import BadChange, Plan, parse_change, plural, size
from exporter.sources.kubelet.kubelet_checkpoint import KUBELET_ROOT_DIR
from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
from exporter.sources.kubelet.running_pods import RUNNING_PODS_MAX_CONTAINERS

# What plan reads, and nothing of run's serving, journal or episode options.
PLAN_OPTIONS = (SYSFS_ROOT, PROCFS_ROOT, KUBERNETES, KUBECONFIG, NODE_NAME, KUBELET_ROOT_DIR,
                CGROUP_ROOT, RUNNING_PODS_MAX_CONTAINERS)
EXIT = {"safe": 0, "harmful": 1, "unknown": 3}  # 2: bad input or configuration (click's)

EPILOG = """\b
Examples:
  node-resize-exporter plan --cpu -1                   # which CPU to take, and who it hurts
  node-resize-exporter plan --cpu -1core               # a whole core (its thread siblings)
  node-resize-exporter plan --memory -4Gi --output json
  node-resize-exporter plan --cpu +2 --memory +8Gi     # what a hot-add would give
\b
Exit status: 0 safe, 1 harmful (or more than the machine has), 2 bad input or
configuration, 3 cannot tell (what was not read is named).
"""


def _flags(message: str) -> str:
    """The planner's words for the change ("cpu -2", "memory -4Gi") as this command's flags."""
    return re.sub(r"\b(cpu|memory) (?=[-+'0-9])", r"--\1 ", message)


class BadConfig(Exception):
    """The configuration cannot work (a kubeconfig that does not load): exit 2 with the fix."""


def gather(opts: Options, *, page_budget: int) -> tuple[Any, Any, str]:
    """(Inputs, page-flags reader or None, node name), read once. Raises BadConfig."""
    from exporter.config.decide import kubernetes_enabled, resolve_node_name
    from exporter.correlate.running_pods_view import RunningPodsView
    from exporter.kube.client import KubeUnavailable, load_config
    from exporter.plan.eviction import Budgets
    from exporter.plan.planner import Inputs
    from exporter.readnow import Reads, Unlisted
    from exporter.sinks.forecast_collector import list_forecast
    from exporter.sources.kernel.memory_blocks import PageFlagsReader, read_hardware
    from exporter.sources.kernel.sysfs import SysfsReader
    from exporter.sources.kubelet.kubelet_checkpoint import (
        ROOT_EMPTY,
        not_mounted,
        read_cpu_manager_state,
        read_memory_manager_state,
        read_reserved_cpus,
    )
    from exporter.sources.kubelet.running_pods import scan
    sysfs, procfs = SYSFS_ROOT.of(opts), PROCFS_ROOT.of(opts)
    snap = SysfsReader(sysfs, procfs).read(0.0)
    hardware = read_hardware(sysfs, procfs)
    not_read: dict[str, str] = {}  # the hardware's own: the planner reads them there
    cpu_cp = mem_cp = reserved = None
    root = KUBELET_ROOT_DIR.of(opts)
    kubelet_here = False
    if not root:
        why = ROOT_EMPTY
    else:
        why = not_mounted(root)
        kubelet_here = not why
    if not why:
        try:
            cpu_cp = read_cpu_manager_state(root, 0.0)
            mem_cp = read_memory_manager_state(root, 0.0)
        except (OSError, ValueError) as e:
            cpu_cp = mem_cp = None
            why = f"could not be read ({e})"
        reserved, config_why = read_reserved_cpus(root)
        if reserved is None:
            not_read["kubelet_config"] = config_why
    if why:
        not_read["cpu_manager_checkpoint"] = not_read["memory_manager_checkpoint"] = why
        not_read["kubelet_config"] = why
    running = None
    if not CGROUP_ROOT.of(opts) or RUNNING_PODS_MAX_CONTAINERS.of(opts) <= 0:
        not_read["running_containers"] = "not read (--cgroup-root empty or " \
            "--running-pods.max-containers 0)"
    else:
        found = scan(CGROUP_ROOT.of(opts), procfs, 0.0,
                     max_containers=RUNNING_PODS_MAX_CONTAINERS.of(opts))
        if found.cgroup_version:
            kubelet_here = True
            running = RunningPodsView()
            running.handle(snap)
            running.handle(found)
        else:
            not_read["running_containers"] = (f"no kubepods cgroup found under "
                                              f"{CGROUP_ROOT.of(opts)} (not mounted, or "
                                              "--cgroup-root is not the host's)")
    forecast = None
    node = resolve_node_name(opts)
    owners: dict[str, str] = {}
    pods: dict[str, Any] = {}
    budgets = None
    kubernetes = kubernetes_enabled(opts)
    if kubernetes:
        try:
            load_config(KUBECONFIG.of(opts))
        except KubeUnavailable as e:
            raise BadConfig(f"{e.reason}" + (f" (fix: {e.fix})" if e.fix else "")) from None
        reads = Reads(opts)
        listed = list_forecast(reads, node, snap, cpu_cp)
        if isinstance(listed, Unlisted):
            not_read["pods"] = listed.message + (f" ({listed.fix})" if listed.fix else "")
        else:
            forecast = listed.forecast
            owners = {p.uid: p.owner_kind for p in listed.pods if p.owner_kind}
            pods = {p.uid: p for p in listed.pods}
            if running is not None:
                for p in listed.pods:
                    running.handle(p)
            listed_budgets = reads.budgets()
            if isinstance(listed_budgets, str):
                not_read["pod_disruption_budgets"] = listed_budgets
            else:
                budgets = Budgets.of(listed_budgets)
    else:
        not_read["pods"] = ("Kubernetes is off (no --kubeconfig, not in a cluster): the node's "
                            "pods were not read; pass --kubeconfig")
        not_read["pod_disruption_budgets"] = "Kubernetes is off"
    if running is not None and cpu_cp is not None:
        running.handle(cpu_cp)
    # Nothing of a kubelet here: no pods or containers to hurt, rather than unread ones.
    no_kubelet = not kubernetes and not kubelet_here
    reader = None
    if page_budget > 0 and hardware.block_size:
        reader = PageFlagsReader(hardware.block_size, procfs)
    inputs = Inputs(snap, hardware, forecast, running, cpu_cp, mem_cp,
                    kubelet_root=root or "/var/lib/kubelet", not_read=not_read,
                    kubelet_reserved_cpus=reserved, pod_owners=owners,
                    no_kubelet=no_kubelet, budgets=budgets, pods=pods)
    return inputs, reader, node


VERDICT_WORDS = {"safe": "SAFE: hurts nothing", "harmful": "WOULD HURT: ",
                 "unknown": "CANNOT TELL: not read: "}


def text(p: Plan) -> str:
    """The plan for people."""
    lines = []
    verdict = VERDICT_WORDS[p.verdict] + (_flags("; ".join(p.harm)) if p.verdict == "harmful" else
                                          "; ".join(p.json()["unknown"]) if p.verdict ==
                                          "unknown" else "")
    lines.append(f"plan for {p.change.words()}: {verdict}")
    if p.cpu_take:
        lines.append("take CPUs: " + " ".join(f"cpu{c}" for c in p.cpu_take))
    if p.cpu_add:
        lines.append("add CPUs: " + " ".join(f"cpu{c}" for c in p.cpu_add))
    for d in p.memory_devices:
        lines.append(f"take {d.kind} {d.id} ({size(d.bytes)}): "
                     + " ".join(f"memory{n}" for n in sorted(d.blocks, reverse=True)))
    if p.memory_add:
        lines.append(f"online memory blocks ({size(p.memory_bytes)}): "
                     + " ".join(f"memory{n}" for n in p.memory_add))
    cap = p.capacity_after
    if cap:
        lines.append(f"capacity after: {plural(int(cap.get('cpu', 0)), 'CPU')}, "
                     f"{size(int(cap.get('memory', 0)))} of memory (what the Node shows once "
                     "the kubelet has restarted)")
    alloc = p.allocatable_after
    if alloc:
        lines.append(f"allocatable after: {alloc.get('cpu', 0)}m CPU, "
                     f"{size(int(alloc.get('memory', 0)))} (less the kubelet's reservations)")
    if p.refusals:
        lines.append(f"not offered, or expected to be refused ({p.refusals_total}):")
        lines += [f"  {r.resource} {r.unit}: {r.detail}" for r in p.refusals]
        if p.refusals_total > len(p.refusals):
            lines.append(f"  ... and {p.refusals_total - len(p.refusals)} more")
    if p.rejected_total:
        lines.append(f"pods the kubelet would reject at its next restart ({p.rejected_total}):")
        lines += [f"  {r.namespace}/{r.name}: {r.reason}" + _pdb_words(p, r.namespace, r.name)
                  for r in p.rejected_pods]
        if p.rejected_total > len(p.rejected_pods):
            lines.append(f"  ... and {p.rejected_total - len(p.rejected_pods)} more")
    if p.stale_containers:
        lines.append("running containers left stale:")
        lines += [f"  {c.namespace}/{c.pod} {c.container}: {c.kind}: {c.detail}"
                  for c in p.stale_containers]
    if not p.impossible:
        lines.append("kubelet: " + {True: "restarts", False: "would NOT restart: ",
                                    None: "cannot tell whether it restarts: "}[
            p.kubelet_restarts] + p.kubelet_problem)
    if p.steps:
        lines.append("steps, in this order:")
        lines += [f"  {i}. {s}" for i, s in enumerate(p.steps, 1)]
    for note in p.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _pdb_words(p: Plan, namespace: str, name: str) -> str:
    v = p.pdb.get(f"{namespace}/{name}")
    if v is None:
        return ""
    words: dict[bool | None, str] = {True: " (eviction refused: ", False: " (evictable: ",
                                     None: " (eviction: cannot tell: "}
    return words[v.blocked] + str(v.detail) + ")"


def register(main: click.Group) -> None:
    def with_options(f: Any) -> Any:
        for opt in reversed(PLAN_OPTIONS):
            f = opt(f)
        return f

    @main.command(epilog=EPILOG)
    @with_options
    @click.option("--cpu", "cpu_change", default=None, metavar="-N|+N",
                  help="CPUs to take away (-N) or add (+N); whole cores or sockets with "
                  "-Ncore, -Nsocket.")
    @click.option("--memory", "memory_change", default=None, metavar="-SIZE|+SIZE",
                  help="Memory to take away or add: bytes or a quantity (-4Gi, +512Mi).")
    @click.option("--output", "output", type=click.Choice(["text", "json"]), default="text",
                  show_default=True, help="text for people, json for programs "
                  "(docs/plan.schema.json).")
    @click.option("--generation", "asked", default="", metavar="HEX",
                  help="The generation of an earlier answer: this one says whether the node "
                  "changed since (stale).")
    def plan(cpu_change: str | None, memory_change: str | None, output: str, asked: str,
             **values: Any) -> None:
        """Before you unplug: which CPUs and memory devices to take, what the kernel would
        refuse, which pods the kubelet would reject and which containers would be stale.

        Changes nothing. Exit 0 when the change is safe, 1 when it would hurt, 2 on bad
        input or configuration, 3 when it cannot tell (what was not read is named)."""
        from exporter.plan.answer import answer
        from exporter.plan.planner import PAGE_BUDGET
        try:
            change = parse_change(cpu_change, memory_change)
        except BadChange as e:
            raise click.UsageError(_flags(str(e))) from None
        if asked and not re.fullmatch(r"[0-9a-f]{16}", asked):
            raise click.UsageError(f"--generation {asked[:40]!r}: the 16 hex digits of an "
                                   "answer's generation")
        opts = Options.from_cli(values)
        try:
            inputs, reader, node = gather(opts, page_budget=PAGE_BUDGET)
        except BadConfig as e:
            click.echo(f"node-resize-exporter: error: {e}", err=True)
            sys.exit(2)
        except (OSError, ValueError) as e:
            click.echo(f"node-resize-exporter: error: cannot read the kernel's state ({e}); "
                       "run plan as root on the node, or point --path.sysfs/--path.procfs at "
                       "the host's", err=True)
            sys.exit(2)
        try:
            result = answer(change, inputs, node=node, now=time.time(),
                            page_flags=reader.read if reader is not None else None,
                            page_budget=PAGE_BUDGET, asked_generation=asked)
        finally:
            if reader is not None:
                reader.close()
        if output == "json":
            click.echo(json.dumps(result.json(), indent=2))
        else:
            click.echo(text(result))
        sys.exit(EXIT[result.verdict])
