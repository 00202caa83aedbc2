"""One answer, whoever asks: `node-resize-exporter plan` and `GET /plan` both frame the planner's
Plan here (node, time, generation), so the same question on the same node gets the same
answer from either (tests/e2e/test_plan_one_answer.py asks both).

The generation is a digest of what the answer was computed from and what makes it change:
the CPUs and memory blocks online, the removable devices, the kubelet's checkpoints and the
pods the forecast holds. An orchestrator echoes it (`?generation=`, `--generation`) and learns
from `stale` whether the node changed since it asked. Pure: no I/O, no clock (the caller
hands the time in).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from exporter.plan.model import Change, Plan
from exporter.plan.planner import BlockVerdict, Inputs, PageFlags, plan

GENERATION_CHARS = 16  # hex digits of the digest: 64 bits, no collision between two asks


def generation(inputs: Inputs) -> str:
    snap, hw = inputs.snapshot, inputs.hardware
    state: dict[str, Any] = {
        "cpus": sorted(snap.cpus_online), "cpus_present": sorted(snap.cpus_present),
        "blocks": sorted(snap.memory_blocks_online),
        "blocks_offline": sorted(snap.memory_blocks_offline),
        # a virtio-mem device's plugged size too: its sub-blocks move with no block
        "devices": [] if hw.devices is None else [[d.id, list(d.blocks)]
                                                  + ([d.plugged] if d.partial else [])
                                                  for d in hw.devices.devices],
    }
    cp, mp = inputs.cpu_checkpoint, inputs.memory_checkpoint
    if cp is not None:
        state["cpu_checkpoint"] = [cp.present, cp.policy, sorted(cp.assigned_cpus),
                                   sorted(cp.default_cpus), cp.error]
    if mp is not None:
        state["memory_checkpoint"] = [mp.present, mp.policy, sorted(mp.total_bytes.items()),
                                      mp.error]
    if inputs.forecast is not None:
        result = inputs.forecast.result()
        state["pods"] = None if result is None else [result.pods, result.rejected_total,
                                                     result.skipped]
    if inputs.running is not None and inputs.running.scan is not None:
        state["containers"] = sorted(c.container_id for c in inputs.running.scan.containers)
    body = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(body).hexdigest()[:GENERATION_CHARS]


def answer(change: Change, inputs: Inputs, *, node: str, now: float,
           page_flags: PageFlags | None = None, page_budget: int = 0,
           verdicts: list[BlockVerdict] | None = None, asked_generation: str = "") -> Plan:
    """The plan for `change`, framed for the contract (docs/plan.schema.json)."""
    p = plan(change, inputs, page_flags, page_budget, verdicts)
    return dataclasses.replace(p, node=node, time=now, generation=generation(inputs),
                               asked_generation=asked_generation)
