"""Kubernetes Events on the Node for each episode (opt-in: `--kube-events`), as
node-problem-detector reports, so `kubectl describe node` tells the story:

    Normal   CPUHotUnplug      cpu hot-unplug: kernel has 1 core, kubelet still reports 2
    Warning  ResizeNotResynced cpu hot-unplug: kubelet still reports 2 cores, kernel has 1 (600 s)

The agent thread only formats and enqueues; one worker thread posts (core/v1 Events in the
"default" namespace, involvedObject the Node, as the kubelet's own node events are). The queue
is bounded: when the API is slow or down, events are dropped and counted in `errors`, never
allowed to hold up the agent.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any

from exporter.correlate.model import EpisodeUpdate, Outcome, UpdateKind
from exporter.events import Change, Resource

log = logging.getLogger("exporter.sinks.kube_events")

NAMESPACE = "default"
COMPONENT = "node-resize-exporter"
QUEUE_SIZE = 64


def _amount(resource: Resource, value: float | None) -> str:
    if value is None:
        return "?"
    if resource is Resource.CPU:
        n = int(round(value))
        return f"{n} core{'s' if n != 1 else ''}"
    return f"{value / 2**30:.1f} GiB"


def _what(update: EpisodeUpdate) -> str:
    ep = update.episode
    kind = "hot-plug" if ep.change is Change.INCREASE else "hot-unplug"
    return f"{ep.resource.value} {kind}"


def describe(update: EpisodeUpdate) -> tuple[str, str, str] | None:
    """(type, reason, message) for the updates that become Events; None for the rest."""
    ep = update.episode
    what = _what(update)
    if update.kind is UpdateKind.KERNEL_DONE:
        reason = ("CPU" if ep.resource is Resource.CPU else "Memory") + \
            ("HotPlug" if ep.change is Change.INCREASE else "HotUnplug")
        kubelet = ep.kubelet_before
        message = f"{what}: kernel has {_amount(ep.resource, ep.kernel_after)}"
        if kubelet is not None:
            message += f", kubelet still reports {_amount(ep.resource, kubelet)}"
        return "Normal", reason, message
    if update.kind is UpdateKind.ENDED and ep.outcome is not None:
        took = f" ({(ep.ended or update.time) - ep.opened:.0f} s)"
        if ep.outcome is Outcome.CONVERGED:
            rejected = [p for p in ep.pods if p.outcome.value == "rejected"]
            tail = f"; {len(rejected)} pods rejected" if rejected else ""
            return ("Warning" if rejected else "Normal", "ResizeResynced",
                    f"{what}: Node capacity now {_amount(ep.resource, ep.kubelet_after)}"
                    f"{tail}{took}")
        if ep.outcome is Outcome.RESYNC_TIMEOUT:
            return ("Warning", "ResizeNotResynced",
                    f"{what}: kubelet still reports {_amount(ep.resource, ep.kubelet_before)}, "
                    f"kernel has {_amount(ep.resource, ep.kernel_after)}{took}")
        if ep.outcome is Outcome.KERNEL_ONLY:
            return None
        return ("Warning", f"Resize{ep.outcome.value.title().replace('_', '')}",
                f"{what}: {ep.outcome.value}{': ' + ep.detail if ep.detail else ''}{took}")
    return None


def event_object(node: str, etype: str, reason: str, message: str, now: float) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": NAMESPACE},
        # A Node's events carry its name as uid, as the kubelet's own do.
        "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
        "type": etype, "reason": reason, "message": message[:1024],
        "source": {"component": COMPONENT, "host": node},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "reportingComponent": COMPONENT, "reportingInstance": socket.gethostname()[:128],
    }


class KubeEventsSink:
    """A sink (on_event/on_update/close) that posts Events through `post(obj)`."""

    def __init__(self, node: str, post: Any) -> None:
        self.node = node
        self._post = post
        self.posted = 0
        self.errors = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_SIZE)
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="kube-events", daemon=True)
        self._thread.start()

    def on_event(self, event: object) -> None:
        pass

    def on_update(self, update: EpisodeUpdate) -> None:
        described = describe(update)
        if described is None:
            return
        try:
            self._queue.put_nowait(event_object(self.node, *described, now=update.time))
        except queue.Full:
            self.errors += 1

    def _run(self) -> None:
        while True:
            obj = self._queue.get()
            if obj is None:
                return
            try:
                self._post(obj)
                self.posted += 1
                self._failing = False
            except Exception as e:  # noqa: BLE001 - any API failure: count, log once
                self.errors += 1
                if not self._failing:
                    self._failing = True
                    log.warning("cannot post a Kubernetes Event (counted; logged once until "
                                "one succeeds): %s", e)

    def close(self) -> None:
        try:
            self._queue.put(None, timeout=1)
        except queue.Full:
            return
        self._thread.join(5)


def lightkube_poster(kubeconfig: str | None) -> Any:
    """post(obj) through a lightkube client (RBAC: create on events, deploy/events/)."""
    from lightkube.resources.core_v1 import Event

    from exporter.kube.client import load_config, make_client
    client, _transport = make_client(load_config(kubeconfig))

    def post(obj: dict[str, Any]) -> None:
        client.create(Event.from_dict(obj), namespace=NAMESPACE)  # type: ignore[call-overload]

    return post
