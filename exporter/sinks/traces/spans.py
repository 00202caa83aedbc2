"""The span tree of one episode: a root span, one span per kernel transition, the resync and the
readmission, each at the episode's own times.

Spans carry the times the episode recorded (kernel CLOCK_MONOTONIC already converted to wall
time once, at the source), never the time this code runs: a trace built minutes after the fact,
or after a restart that resumed the episode, still shows when the kernel and the kubelet acted.
"""
from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode

from exporter.correlate.model import Episode, Outcome
from exporter.events import Resource, Transition

# Outcomes that are not a problem: the root span's status stays unset for them.
GOOD_OUTCOMES = {Outcome.CONVERGED, Outcome.KERNEL_ONLY}


def _ns(t: float) -> int:
    return int(round(t * 1e9))



def episode_end(ep: Episode) -> float:
    """The root span's end: `ended`, else the latest time the episode knows."""
    if ep.ended is not None:
        return ep.ended
    times = [ep.opened, ep.kernel_done, ep.resynced, ep.readmission_settled,
             *(t.end for t in ep.transitions), *(p.time for p in ep.pods)]
    return max(t for t in times if t is not None)


def _set_error(span: trace.Span, description: str) -> None:
    span.set_status(Status(StatusCode.ERROR, description))


def _capacity_attrs(prefix: str, before: float | None, after: float | None) -> dict[str, Any]:
    out = {}
    if before is not None:
        out[f"{prefix}.before"] = before
    if after is not None:
        out[f"{prefix}.after"] = after
    return out


def transition_attributes(t: Transition) -> dict[str, Any]:
    attrs: dict[str, Any] = {"hotplug.source": t.source, "hotplug.resource": t.resource.value,
                   "hotplug.direction": t.direction.value, "hotplug.result": t.result.value}
    if t.resource is Resource.CPU:
        attrs["hotplug.cpu.id"] = t.unit
    else:
        attrs["hotplug.memory.block"] = t.unit
    optional = {"hotplug.duration_s": t.duration, "hotplug.steps": t.steps,
                "hotplug.cpuhp.failed_state": t.failed_state, "hotplug.error": t.error,
                "hotplug.memory.pfn": t.pfn, "hotplug.memory.nr_pages": t.nr_pages}
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def build_trace(tracer: trace.Tracer, ep: Episode) -> None:
    """Emit the episode's spans (root, kernel transitions, resync, readmission)."""
    end = episode_end(ep)
    root = tracer.start_span(f"episode {ep.resource.value} {ep.change.value}",
                             attributes=_root_attributes(ep), start_time=_ns(ep.opened))
    if ep.outcome is not None and ep.outcome not in GOOD_OUTCOMES:
        _set_error(root, ep.detail or ep.outcome.value)
    ctx = trace.set_span_in_context(root)
    for t in ep.transitions:
        _transition_span(tracer, ctx, t)
    judged = ep.outcome not in (Outcome.KERNEL_ONLY, Outcome.KERNEL_FAILED)
    if ep.kernel_done is not None and (ep.resynced is not None or judged):
        _resync_span(tracer, ctx, ep, ep.kernel_done, end)
    if ep.readmission_settled is not None or ep.pods:
        _readmission_span(tracer, ctx, ep, end)
    root.end(end_time=_ns(max(end, ep.opened)))


def _root_attributes(ep: Episode) -> dict[str, Any]:
    """The episode as a whole: what changed, how it ended, how long each phase took, and the
    forecast said before the resync."""
    attrs: dict[str, Any] = {
        "node_resize.episode.id": ep.id, "node_resize.resource": ep.resource.value,
        "node_resize.change": ep.change.value,
        "node_resize.outcome": ep.outcome.value if ep.outcome else "open",
        # Every transition, though only a sample has spans (index.TRANSITIONS_KEPT); a flap
        # storm is one trace with its counts (README, "Flap storms").
        "node_resize.transitions": ep.transitions_seen,
        "node_resize.transitions.offline": ep.offline_transitions,
        "node_resize.transitions.online": ep.online_transitions,
        "node_resize.flapping": ep.flapping,
        **_capacity_attrs("node_resize.kernel.capacity", ep.kernel_before, ep.kernel_after),
        **_capacity_attrs("node_resize.kubelet.capacity", ep.kubelet_before, ep.kubelet_after),
    }
    for key, value in (("node_resize.detail", ep.detail or None),
                       ("node_resize.kernel.seconds", ep.kernel_seconds),
                       ("node_resize.resync.seconds", ep.resync_seconds),
                       ("node_resize.readmission.seconds", ep.readmission_seconds)):
        if value is not None:
            attrs[key] = value
    if ep.forecast is not None:  # what a kubelet restart would reject, said before the resync
        attrs["node_resize.forecast.pods"] = ep.forecast.pods
        attrs["node_resize.forecast.rejected"] = ep.forecast.rejected_total
        attrs["node_resize.forecast.rejected_pods"] = [
            f"{r.namespace}/{r.name}:{r.reason}" for r in ep.forecast.rejected]
    return attrs


def _transition_span(tracer: trace.Tracer, ctx: Context, t: Transition) -> None:
    start = t.start if t.start is not None else t.end  # uevent/sysfs: only the end is known
    span = tracer.start_span("kernel.transition", context=ctx,
                             attributes=transition_attributes(t), start_time=_ns(start))
    if t.result.value == "failed":
        what = t.error or (f"cpuhp state {t.failed_state}" if t.failed_state else "failed")
        _set_error(span, what)
    span.end(end_time=_ns(t.end))


def _resync_span(tracer: trace.Tracer, ctx: Context, ep: Episode, kernel_done: float,
                 end: float) -> None:
    """From the kernel done to the Node updated (or the episode's end, when it never was)."""
    resync_end = ep.resynced if ep.resynced is not None else end
    attrs = {"node_resize.resynced": ep.resynced is not None,
             **({"node_resize.resynced_by": ep.resynced_by} if ep.resynced_by else {}),
             **_capacity_attrs("kubelet.capacity", ep.kubelet_before, ep.kubelet_after)}
    if ep.kernel_after is not None:
        attrs["kernel.capacity"] = ep.kernel_after
    span = tracer.start_span("kubelet.resync", context=ctx, attributes=attrs,
                             start_time=_ns(kernel_done))
    if ep.outcome in (Outcome.RESYNC_TIMEOUT, Outcome.MISMATCH):
        _set_error(span, ep.outcome.value)
    span.end(end_time=_ns(max(resync_end, kernel_done)))


def _readmission_span(tracer: trace.Tracer, ctx: Context, ep: Episode, end: float) -> None:
    """The pods the kubelet kept or rejected after the resync, one span event per pod."""
    start = ep.resynced if ep.resynced is not None else (ep.kernel_done or ep.opened)
    settled = ep.readmission_settled if ep.readmission_settled is not None else end
    rejected = sum(1 for p in ep.pods if p.outcome.value == "rejected")
    span = tracer.start_span("kubelet.readmission", context=ctx, start_time=_ns(start),
                             attributes={"node_resize.pods.rejected": rejected,
                                         "node_resize.pods.kept": len(ep.pods) - rejected})
    for p in ep.pods:
        span.add_event(f"pod.{p.outcome.value}", timestamp=_ns(p.time), attributes={
            "k8s.pod.name": p.name, "k8s.namespace.name": p.namespace, "k8s.pod.uid": p.uid,
            "node_resize.pod.outcome": p.outcome.value, "node_resize.pod.reason": p.reason})
    if rejected:
        _set_error(span, f"{rejected} pod(s) rejected at readmission")
    span.end(end_time=_ns(max(settled, start)))
