"""`node-resize-exporter plan`: before you unplug (or plug), what the change would do.

Reads what `run` reads, once (the kernel's CPUs and memory blocks, the page flags of the blocks
it considers, the kubelet's checkpoints, the running containers' cgroups, this node's Node and
pods from the API server), hands them to the pure planner (exporter/plan/planner.py) and prints
the plan. It changes nothing. Exit 0: the change hurts nothing; 1: it would; 2: bad input.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from exporter.config import options
from exporter.config.options import PROCFS_ROOT, SYSFS_ROOT, Options
from exporter.plan.model import BadChange, Plan, parse_change
from exporter.sources.kubelet.kubelet_checkpoint import KUBELET_ROOT_DIR
from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
from exporter.sources.kubelet.running_pods import RUNNING_PODS_MAX_CONTAINERS

EPILOG = """\b
Examples:
  node-resize-exporter plan --cpu -1                   # which CPU to take, and who it hurts
  node-resize-exporter plan --memory -4Gi --output json
  node-resize-exporter plan --cpu +2 --memory +8Gi     # what a hot-add would give
"""


def _flags(message: str) -> str:
    """The planner's words for the change ("cpu -2", "memory -4Gi") as this command's flags."""
    return re.sub(r"\b(cpu|memory) (?=[-+'0-9])", r"--\1 ", message)


def gather(opts: Options, *, page_budget: int) -> tuple[Any, Any, list[str]]:
    """(Inputs, page-flags reader or None, what could not be read), read once."""
    from exporter.config.decide import kubernetes_enabled, resolve_node_name
    from exporter.correlate.readmission_forecast import ReadmissionForecast
    from exporter.correlate.running_pods_view import RunningPodsView
    from exporter.plan.planner import Inputs
    from exporter.readnow import Unlisted
    from exporter.sinks.forecast_collector import list_forecast
    from exporter.sources.kernel.memory_blocks import PageFlagsReader, read_hardware
    from exporter.sources.kernel.sysfs import SysfsReader
    snap = SysfsReader(SYSFS_ROOT.of(opts), PROCFS_ROOT.of(opts)).read(0.0)
    hardware = read_hardware(SYSFS_ROOT.of(opts))
    unjudged: list[str] = []
    cpu_cp = mem_cp = None
    root = KUBELET_ROOT_DIR.of(opts)
    if root:
        from exporter.sources.kubelet.kubelet_checkpoint import (
            read_cpu_manager_state,
            read_memory_manager_state,
        )
        try:
            cpu_cp = read_cpu_manager_state(root, 0.0)
            mem_cp = read_memory_manager_state(root, 0.0)
        except (OSError, ValueError) as e:
            unjudged.append(f"the kubelet's checkpoints in {root} could not be read ({e})")
    forecast = None
    pods: list[Any] = []
    if kubernetes_enabled(opts):
        listed = list_forecast(opts, resolve_node_name(opts), snap, cpu_cp)
        if isinstance(listed, Unlisted):
            # Judged as if Kubernetes were on but nothing read: the plan says why, not safe.
            forecast = ReadmissionForecast()
            forecast.on_snapshot(snap)
            unjudged.append(f"pods: {listed.message}"
                            + (f" ({listed.fix})" if listed.fix else ""))
        else:
            forecast, pods = listed.forecast, listed.pods
    running = None
    if CGROUP_ROOT.of(opts) and RUNNING_PODS_MAX_CONTAINERS.of(opts) > 0:
        from exporter.sources.kubelet.running_pods import scan
        found = scan(CGROUP_ROOT.of(opts), PROCFS_ROOT.of(opts), 0.0,
                     max_containers=RUNNING_PODS_MAX_CONTAINERS.of(opts))
        if found.cgroup_version:
            running = RunningPodsView()
            for event in (snap, found, *pods) + ((cpu_cp,) if cpu_cp is not None else ()):
                running.handle(event)
    reader = None
    if page_budget > 0 and hardware.block_size:
        reader = PageFlagsReader(hardware.block_size, PROCFS_ROOT.of(opts))
    inputs = Inputs(snap, hardware, forecast, running, cpu_cp, mem_cp,
                    kubelet_root=root or "/var/lib/kubelet")
    return inputs, reader, unjudged


def text(p: Plan) -> str:
    """The plan for people."""
    lines = []
    change = []
    if p.change.cpus:
        change.append(f"cpu {p.change.cpus:+d}")
    if p.change.memory:
        change.append(f"memory {p.change.memory:+d} bytes")
    verdict = "SAFE: hurts nothing" if p.safe else "WOULD HURT: " + "; ".join(p.harm)
    lines.append(f"plan for {', '.join(change)}: {verdict}")
    if p.cpu_take:
        lines.append("take CPUs: " + " ".join(f"cpu{c}" for c in p.cpu_take))
    if p.cpu_add:
        lines.append("add CPUs: " + " ".join(f"cpu{c}" for c in p.cpu_add))
    if p.memory_take:
        lines.append(f"take memory blocks ({p.memory_bytes} bytes): "
                     + " ".join(f"memory{n}" for n in p.memory_take))
    if p.memory_add:
        lines.append(f"online memory blocks ({p.memory_bytes} bytes): "
                     + " ".join(f"memory{n}" for n in p.memory_add))
    cap = p.capacity_after
    lines.append(f"capacity after: {cap.get('cpu', 0):g} CPUs, {int(cap.get('memory', 0))} "
                 "bytes of memory (what the Node shows once the kubelet has restarted)")
    alloc = p.allocatable_after
    if alloc:
        lines.append(f"allocatable after: {alloc.get('cpu', 0):g} CPUs, "
                     f"{int(alloc.get('memory', 0))} bytes (less the kubelet's reservations)")
    if p.refusals:
        lines.append(f"the kernel is expected to refuse ({p.refusals_total}):")
        lines += [f"  {r.resource} {r.unit}: {r.detail}" for r in p.refusals]
        if p.refusals_total > len(p.refusals):
            lines.append(f"  ... and {p.refusals_total - len(p.refusals)} more")
    if p.rejected_total:
        lines.append(f"pods the kubelet would reject at its next restart ({p.rejected_total}):")
        lines += [f"  {r.namespace}/{r.name}: {r.reason}" for r in p.rejected_pods]
        if p.rejected_total > len(p.rejected_pods):
            lines.append(f"  ... and {p.rejected_total - len(p.rejected_pods)} more")
    if p.stale_containers:
        lines.append("running containers left stale:")
        lines += [f"  {c.namespace}/{c.pod} {c.container}: {c.kind}: {c.detail}"
                  for c in p.stale_containers]
    lines.append("kubelet: " + ("restarts" if p.kubelet_restarts
                                else f"would NOT restart: {p.kubelet_problem}"))
    if p.steps:
        lines.append("steps, in this order:")
        lines += [f"  {i}. {s}" for i, s in enumerate(p.steps, 1)]
    for note in p.notes + p.unjudged:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def register(main: click.Group) -> None:
    @main.command(epilog=EPILOG)
    @options.apply(options.RUN)
    @click.option("--cpu", "cpu_change", default=None, metavar="-N|+N",
                  help="CPUs to take away (-N) or add (+N).")
    @click.option("--memory", "memory_change", default=None, metavar="-SIZE|+SIZE",
                  help="Memory to take away or add: bytes or a quantity (-4Gi, +512Mi).")
    @click.option("--output", "output", type=click.Choice(["text", "json"]), default="text",
                  show_default=True, help="text for people, json for programs.")
    @click.option("--page-flags-blocks", "page_budget", type=click.IntRange(0, 1 << 20),
                  default=4096, show_default=True,
                  help="Memory blocks whose /proc/kpageflags are read at most (about 8 ms "
                  "each); 0: judge kernel-zone blocks unread (never taken).")
    def plan(cpu_change: str | None, memory_change: str | None, output: str,
             page_budget: int, **values: Any) -> None:
        """Before you unplug: which CPUs and memory blocks to take, what the kernel would
        refuse, which pods the kubelet would reject and which containers would be stale.

        Takes the options `run` takes. Changes nothing. Exit 0 when the change hurts
        nothing, 1 when it would, 2 on bad input."""
        from exporter.plan.planner import TooLarge, plan
        try:
            change = parse_change(cpu_change, memory_change)
        except BadChange as e:
            raise click.UsageError(_flags(str(e))) from None
        opts = Options.from_cli(values)
        try:
            inputs, reader, unjudged = gather(opts, page_budget=page_budget)
        except (OSError, ValueError) as e:
            click.echo(f"node-resize-exporter: error: cannot read the kernel's state ({e}); "
                       "run plan as root on the node, or point --path.sysfs/--path.procfs at "
                       "the host's", err=True)
            sys.exit(2)
        try:
            result = plan(change, inputs, reader.read if reader is not None else None,
                          page_budget)
        except TooLarge as e:
            raise click.UsageError(_flags(str(e))) from None
        finally:
            if reader is not None:
                reader.close()
        if unjudged:
            import dataclasses
            result = dataclasses.replace(result, unjudged=tuple(unjudged))
        if output == "json":
            click.echo(json.dumps(result.json(), indent=2))
        else:
            click.echo(text(result))
        sys.exit(0 if result.safe else 1)
