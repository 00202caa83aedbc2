"""Kubernetes Events on the Node for each episode (opt-in: `--kube-events`), as
node-problem-detector reports, so `kubectl describe node` tells the story:

    Normal   CPUHotUnplug      cpu hot-unplug: kernel has 1 core, kubelet still reports 2
    Warning  ResizeNotResynced cpu hot-unplug: kubelet still reports 2 cores, kernel has 1 (600 s)

The agent thread only formats and enqueues; one worker thread talks to the API (core/v1 Events
in the "default" namespace, involvedObject the Node, as the kubelet's own node events are). It
treats them as client-go's EventRecorder does (tools/record/events_cache.go), so a storm
cannot flood the API or etcd:
- spam filter: a token bucket per involved object and source (burst 25, one more every 5
  minutes); an Event beyond it is dropped;
- aggregation: more than 10 distinct messages with the same (source, object, type, reason)
  within 10 minutes become one Event, "(combined from similar events): <latest message>";
- the same Event again (same source, object, type, reason, message) raises `count` and
  `lastTimestamp` of the existing object by a strategic-merge PATCH instead of creating a new
  one (created anew if it is gone: a PATCH answered 404).
The queue is bounded and a failing API is left alone for a while (a backoff): what cannot be
sent is dropped, counted in `errors` (node_resize_exporter_sink_errors_total{sink="kubeevents"})
and logged at most once a minute with the count, never allowed to hold up the agent.
"""
from __future__ import annotations

import logging
import math
import queue
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Protocol

from exporter.correlate.model import EpisodeUpdate, Outcome, UpdateKind
from exporter.events import Change, Resource
from exporter.ratelog import RateLimitedLog
from exporter.words import count

log = logging.getLogger(__name__)

NAMESPACE = "default"
COMPONENT = "node-resize-exporter"
QUEUE_SIZE = 64
# client-go tools/record's defaults (events_cache.go).
CACHE_ENTRIES = 4096  # LRU bound of each cache below
SPAM_BURST = 25  # Events per object and source at once...
SPAM_QPS = 1 / 300  # ...then one more every 5 minutes
AGGREGATE_MAX = 10  # distinct messages of one reason before they are combined...
AGGREGATE_SECONDS = 600  # ...within 10 minutes
DROP_LOG_SECONDS = 60.0  # drops are logged at most this often, with the count
BACKOFF_MIN, BACKOFF_MAX = 10.0, 300.0  # an API failure stops sending for this long (doubling)


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
    if update.kind is UpdateKind.KERNEL_DONE and ep.flapping:
        # A flap storm, told once (README, "Flap storms"): its counts and where it left things.
        reason = ("CPU" if ep.resource is Resource.CPU else "Memory") + "Flapping"
        message = f"{ep.resource.value} flapping: {ep.offline_transitions} offline and " \
                  f"{ep.online_transitions} online transitions; kernel has " \
                  f"{_amount(ep.resource, ep.kernel_after)}"
        if ep.kubelet_before is not None:
            message += f", kubelet reports {_amount(ep.resource, ep.kubelet_before)}"
        return "Warning", reason, message
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
            tail = f"; {count(len(rejected), 'pod')} rejected" if rejected else ""
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


class EventsApi(Protocol):
    """What the sink needs of the API: create an Event, patch one by name (both return the
    object as the API server answered; errors raise, NotFound as EventGone)."""

    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...


class EventGone(Exception):
    """A PATCH answered 404: the Event expired (the API server keeps them an hour)."""


class TokenBucket:
    """client-go's flowcontrol token bucket: `burst` tokens, refilled at `qps`."""

    def __init__(self, qps: float, burst: int, now: float) -> None:
        self.qps, self.burst = qps, burst
        self.tokens, self.last = float(burst), now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.last) * self.qps)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def _lru_put(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)


class EventCorrelator:
    """client-go's EventCorrelator for one source: the spam filter, the aggregator and the
    logger of what was sent. Pure (the time is passed in); the worker thread alone uses it."""

    def __init__(self) -> None:
        self._spam: OrderedDict[tuple[str, ...], TokenBucket] = OrderedDict()
        # aggregate key -> (messages seen, when the first of them came)
        self._similar: OrderedDict[tuple[str, ...], tuple[set[str], float]] = OrderedDict()
        # event key -> (name, count, firstTimestamp) of the Event the API holds
        self._sent: OrderedDict[tuple[str, ...], tuple[str, int, str]] = OrderedDict()

    @staticmethod
    def _object_key(obj: dict[str, Any]) -> tuple[str, ...]:
        source, inv = obj["source"], obj["involvedObject"]
        return (source.get("component", ""), source.get("host", ""), inv.get("kind", ""),
                inv.get("namespace", ""), inv.get("name", ""), inv.get("uid", ""),
                inv.get("apiVersion", ""))

    def allow(self, obj: dict[str, Any], now: float) -> bool:
        """The spam filter: False when the object's bucket is empty (the Event is dropped)."""
        key = self._object_key(obj)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = TokenBucket(SPAM_QPS, SPAM_BURST, now)
        _lru_put(self._spam, key, bucket)
        return bucket.take(now)

    def aggregate(self, obj: dict[str, Any], now: float) -> tuple[str, ...]:
        """The key the Event is sent under; past AGGREGATE_MAX distinct messages of one
        (source, object, type, reason) in AGGREGATE_SECONDS, one combined Event."""
        agg = (*self._object_key(obj), obj["type"], obj["reason"],
               obj.get("reportingComponent", ""), obj.get("reportingInstance", ""))
        messages, since = self._similar.get(agg, (set(), now))
        if now - since > AGGREGATE_SECONDS:
            messages, since = set(), now
        messages.add(obj["message"])
        _lru_put(self._similar, agg, (messages, since))
        if len(messages) < AGGREGATE_MAX:
            return (*agg, obj["message"])
        obj["message"] = f"(combined from similar events): {obj['message']}"[:1024]
        while len(messages) > AGGREGATE_MAX:  # bounded: only the count matters from here on
            messages.pop()
        return agg

    def sent_before(self, key: tuple[str, ...]) -> tuple[str, int, str] | None:
        return self._sent.get(key)

    def sent(self, key: tuple[str, ...], name: str, count: int, first: str) -> None:
        _lru_put(self._sent, key, (name, count, first))

    def forget(self, key: tuple[str, ...]) -> None:
        self._sent.pop(key, None)


class KubeEventsSink:
    """A sink (on_event/on_update/close) that creates and patches Events through `api`."""

    name = "kubeevents"  # the `sink` label of its errors (exporter/sinks/metrics.py)

    def __init__(self, node: str, api: EventsApi,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self._api = api
        self._clock = clock
        self.posted = 0  # Events created
        self.patched = 0  # Events whose count was raised
        self.errors = 0  # not sent: API failures and every drop
        self.dropped = 0  # of which dropped (queue full, spam filter, API backing off)
        self._queue: queue.Queue[tuple[dict[str, Any], float] | None] = queue.Queue(QUEUE_SIZE)
        self._correlator = EventCorrelator()
        self._lock = threading.Lock()  # the drop counts: the agent thread adds to them too
        # One line per reason a minute, then how many were held back.
        self._drop_log = RateLimitedLog(log, DROP_LOG_SECONDS, clock)
        self._failing = False
        self._backoff = 0.0
        self._quiet_until = -math.inf  # API failing: send nothing until then
        self._thread = threading.Thread(target=self._run, name="kube-events", daemon=True)
        self._thread.start()

    def on_event(self, event: object) -> None:
        pass

    def on_update(self, update: EpisodeUpdate) -> None:
        described = describe(update)
        if described is None:
            return
        try:
            self._queue.put_nowait((event_object(self.node, *described, now=update.time),
                                    update.time))
        except queue.Full:
            self._drop("queue full")

    # ------------------------------------------------------------ the worker

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=DROP_LOG_SECONDS / 4)
            except queue.Empty:
                self._log_drops()
                continue
            if item is None:
                self._log_drops(force=True)
                return
            self._send(*item)
            self._log_drops()

    def _send(self, obj: dict[str, Any], when: float) -> None:
        now = self._clock()
        if now < self._quiet_until:
            self._drop("the API server is failing")
            return
        corr = self._correlator
        if not corr.allow(obj, now):
            self._drop("spam filter: more than 25 for the Node in 5 minutes")
            return
        key = corr.aggregate(obj, now)
        before = corr.sent_before(key)
        try:
            if before is not None:
                name, count, first = before
                patch = {"count": count + 1, "lastTimestamp": obj["lastTimestamp"],
                         "message": obj["message"]}
                try:
                    self._api.patch(name, patch)
                    corr.sent(key, name, count + 1, first)
                    self.patched += 1
                    self._succeeded()
                    return
                except EventGone:
                    corr.forget(key)  # expired: create it anew, count from 1
            created = self._api.create(obj)
            meta = created.get("metadata") if isinstance(created, dict) else None
            made = meta.get("name") if isinstance(meta, dict) else None
            if isinstance(made, str) and made:
                corr.sent(key, made, 1, obj["firstTimestamp"])
            self.posted += 1
            self._succeeded()
        except Exception as e:  # noqa: BLE001 - any API failure: count, back off, log once
            self.errors += 1
            self._backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self._backoff * 2))
            self._quiet_until = now + self._backoff
            if not self._failing:
                self._failing = True
                log.warning("cannot send a Kubernetes Event (counted; logged once until one "
                            "succeeds; Events are dropped for %.0f s after each failure, up "
                            "to %.0f s): %s", self._backoff, BACKOFF_MAX, e)

    def _succeeded(self) -> None:
        self._failing = False
        self._backoff = 0.0

    def _drop(self, why: str) -> None:
        with self._lock:
            self.errors += 1
            self.dropped += 1
        self._drop_log.note(why, "dropped a Kubernetes Event (%s); counted in "
                            "node_resize_exporter_sink_errors_total{sink=\"kubeevents\"}, "
                            "logged at most once a minute", why, level=logging.WARNING)

    def _log_drops(self, force: bool = False) -> None:
        """From the worker's idle tick (and at the end): the drops held back since the last
        line, so a burst that stopped is told within a minute."""
        self._drop_log.flush(force)

    def close(self) -> None:
        try:
            self._queue.put(None, timeout=1)
        except queue.Full:
            return
        self._thread.join(5)


def lightkube_events_api(kubeconfig: str | None) -> EventsApi:
    """Events through a lightkube client (RBAC: create and patch on events, deploy/)."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Event
    from lightkube.types import PatchType

    from exporter.kube.client import load_config, make_client
    client, _transport = make_client(load_config(kubeconfig))

    class _Api:
        def create(self, obj: dict[str, Any]) -> dict[str, Any]:
            made = client.create(  # type: ignore[call-overload]
                Event.from_dict(obj), namespace=NAMESPACE)
            return made.to_dict()  # type: ignore[no-any-return]

        def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            try:
                made = client.patch(Event, name, patch, namespace=NAMESPACE,
                                    patch_type=PatchType.STRATEGIC)
            except ApiError as e:
                if e.status.code == 404:
                    raise EventGone(name) from None
                raise
            return made.to_dict()

    return _Api()
