"""The list/watch source: list-then-watch with the recovery rules of client-go's reflector,
on top of lightkube.

What lightkube does (checked in its source, v1.0): `Client.watch` streams (type, object),
remembers the last object's resourceVersion (BOOKMARK objects included, so bookmarks advance
it), and re-opens the stream by itself when the server ends it cleanly (timeoutSeconds). Every
other failure we ask it to raise (on_error_raise): a watch ERROR event becomes ApiError with
the Status inside, HTTP errors become ApiError/HTTPStatusError, network failures httpx errors.

What we add here:
- 410 Gone/Expired (history compacted): relist and resume from the list's RV; the subclass
  diffs the relist against what it already emitted, so unchanged objects produce no second
  event. The relist waits the backoff like any other failure (client-go's reflector does the
  same through its backoff manager): a server that answers every watch 410 would otherwise
  draw a relist storm (44 lists/s per resource measured), and the log says it once per
  interval with a count, not once per relist;
- objects the request did not ask for: the field selector is the server's to apply, and a
  proxy or an old server may drop it. Every listed or watched object is checked against what
  was asked (`not_asked_for()`); the others are skipped, never taken for this node's, and
  counted once each (one MalformedInput per answer that brought new ones);
- a dropped or dead connection: re-watch from the last RV after a jittered exponential backoff;
- 401/403 and an unreachable server: SourceStatus down with a reason an operator can act on,
  retry with backoff, SourceStatus up when a list or watch succeeds again (no restart needed);
- a silent server: a list not answered within `request_timeout`, or a watch with no
  byte (event or bookmark) for longer than its own timeout (`server_timeout` + `watch_grace`),
  or a watch line stalled mid-event, is down, and the source relists: the Node may have
  changed meanwhile;
- an answer past a bound (exporter/kube/client.py: line, page, pages; LIST_MAX_OBJECTS
  objects): down with the bound named, then a relist after backoff;
- undecodable answers: MalformedInput, then a fresh list. One object the converters cannot
  read is MalformedInput and skipped, the rest flows. The backoff is reset only by a watch
  that delivered an event, never by a list alone, so a list followed by the same failure
  backs off instead of looping.
"""
from __future__ import annotations

import dataclasses
import email.utils
import logging
import random
import time
from typing import Any

import httpx2 as httpx
import msgspec
from lightkube.core.exceptions import ApiError

from exporter.clock import Clock
from exporter.events import DownCause, MalformedInput, SourceStatus
from exporter.kube.bounds import LIST_MAX_OBJECTS
from exporter.kube.client import (
    LIST_CHUNK,
    AnswerTooLarge,
    KubeTransport,
    KubeUnavailable,
    WatchStalled,
    load_config,
    make_client,
)
from exporter.ratelog import RateLimitedLog
from exporter.sources.base import Emit, Source, SourceUnavailable

# Pods on one node are at most a few hundred (kubelet --max-pods, 110 by default); more is a
# hostile or broken answer, not this node: LIST_MAX_OBJECTS (exporter/kube/bounds.py).
# What a quiet watch may go without a byte past its own timeoutSeconds before it is dead.
WATCH_GRACE = 15.0
# A Retry-After (429, 503) is honoured up to this: a server cannot park the source for longer.
MAX_RETRY_AFTER = 60.0
# The converters are total; if one is not, the object is counted and skipped, never fatal.
_OBJECT_ERRORS = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError,
                  RecursionError)
# A repeated failure (410 loops, dropped watches) is logged at most once per this many seconds.
LOG_INTERVAL = 60.0
# Foreign objects remembered so each is counted once (a bound: the set is cleared when full).
FOREIGN_REMEMBERED = 10_000


class Backoff:
    """Exponential backoff with +-20 % jitter, so a fleet of agents does not retry in step."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0):
        self.initial, self.maximum, self.factor = initial, maximum, factor
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.initial


class ListWatchSource(Source):
    """Base for the Node and Pod sources. Subclasses set `resource`, `plural`, implement
    `field_selector()`, `on_list(items, emit)` and `on_event(type, obj, emit)`."""

    resource: Any = None
    plural = ""
    namespace: str | None = None

    def __init__(self, clock: Clock, *, kubeconfig: str | None = None,
                 server_timeout: float = 60, request_timeout: float = 10.0,
                 watch_grace: float = WATCH_GRACE, line_timeout: float | None = None,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0) -> None:
        super().__init__(clock)
        # timeoutSeconds of each watch: the server ends it cleanly this often (lightkube then
        # re-watches from the last RV), so no byte for server_timeout + watch_grace means dead.
        # 60 s: the bound on how late a stalled watch is noticed, for one request a minute.
        self.watch_grace = watch_grace
        self.line_timeout = line_timeout
        self._phase = "list"  # what a timeout interrupted, for the reason it is reported with
        self.kubeconfig = kubeconfig
        self.server_timeout = server_timeout
        self.request_timeout = request_timeout
        self.backoff = Backoff(backoff_initial, backoff_max)
        self._client: Any = None  # lightkube Client, made by open()
        self._transport: KubeTransport | None = None
        self._emit: Emit | None = None
        self._up: bool | None = None
        # Plain counters for logs, `check` and tests; the metrics come from the events.
        self.lists = 0
        self.relists_gone = 0
        self.reconnects = 0
        self.bookmarks = 0
        self.foreign = 0  # objects answered that the request did not ask for
        self.resource_version: str | None = None
        self._notes = RateLimitedLog(self.log, LOG_INTERVAL)
        self._foreign_seen: set[str] = set()

    # ------------------------------------------------------------ subclass API

    def field_selector(self) -> dict[str, str]:
        raise NotImplementedError

    def _fields(self) -> Any:
        # lightkube types fields as a dict of str or selector operators (dict is invariant)
        return self.field_selector()

    def not_asked_for(self, obj: dict[str, Any]) -> bool:
        """True when `obj` is not what field_selector() asked for (the server did not apply
        it). Checked on every listed and watched object, whatever the server claims."""
        return False

    def on_list(self, items: list[dict[str, Any]], emit: Emit) -> None:
        raise NotImplementedError

    def on_event(self, event_type: str, obj: dict[str, Any], emit: Emit) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ Source

    def open(self) -> None:
        try:
            config = load_config(self.kubeconfig)
        except KubeUnavailable as e:
            raise SourceUnavailable(e.reason, e.fix) from e
        # Client-side read bound: the server ends a watch after server_timeout; a little
        # longer without a byte means the connection is dead.
        extra = {} if self.line_timeout is None else {"line_timeout": self.line_timeout}
        self._client, self._transport = make_client(
            config, request_timeout=self.request_timeout,
            watch_read_timeout=self.watch_idle_timeout, **extra)
        self._transport.on_watch_response = self._watch_response

    @property
    def watch_idle_timeout(self) -> float:
        return self.server_timeout + self.watch_grace

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        if self._transport is not None:
            self._transport.abort_watches()
        super().stop(timeout)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def loop(self, emit: Emit) -> None:
        self._emit = emit
        if self._client is None:
            # The caller started us without open(): do it here, and say so if it cannot work.
            try:
                self.open()
            except SourceUnavailable as e:
                self._set_up(emit, False, str(e))
                return
        rv: str | None = None
        while not self.stopping.is_set():
            try:
                if rv is None:
                    self._phase = "list"
                    rv = self._list(emit)
                self._phase = "watch"
                self._watch(rv, emit)
            except Exception as e:  # classified below; nothing escapes the loop
                if self.stopping.is_set():
                    break
                rv = self._recover(e, rv, emit)
            else:
                rv = self.resource_version

    def _list(self, emit: Emit) -> str:
        assert self._client is not None, "open() first"
        listing = self._client.list(self.resource, namespace=self.namespace,
                                    fields=self._fields(), chunk_size=LIST_CHUNK)
        items: list[dict[str, Any]] = []
        for item in listing:
            if len(items) >= LIST_MAX_OBJECTS:
                raise AnswerTooLarge(f"list of {self.plural} has more than {LIST_MAX_OBJECTS} "
                                     "objects")
            items.append(dict(item))
        rv: str = listing.resourceVersion
        self.lists += 1
        items = self._only_asked_for(items, emit)
        # Up only once the listed objects are handed on: what trusts this source's state (the
        # readmission forecast's validity) must not see it up with a part of the list.
        self.on_list(items, emit)
        # No backoff reset here: a list followed by the same failure must back off.
        self._set_up(emit, True, f"listed {self.plural} ({len(items)})")
        self.resource_version = rv
        return rv

    def _watch(self, rv: str, emit: Emit) -> None:
        assert self._client is not None, "open() first"
        stream = self._client.watch(self.resource, namespace=self.namespace,
                                    fields=self._fields(), resource_version=rv,
                                    server_timeout=int(self.server_timeout))
        try:
            for event_type, obj in stream:
                if self.stopping.is_set():
                    return
                raw = dict(obj)
                new_rv = (raw.get("metadata") or {}).get("resourceVersion")
                if event_type == "BOOKMARK":
                    self.bookmarks += 1
                elif self._only_asked_for([raw], emit):  # else counted and skipped
                    self._deliver_event(event_type, raw, emit)
                    self.backoff.reset()
                if isinstance(new_rv, str) and new_rv:
                    self.resource_version = new_rv
        finally:
            stream.close()  # a generator: ends the request

    def _only_asked_for(self, items: list[dict[str, Any]], emit: Emit) -> list[dict[str, Any]]:
        """`items` without the objects the field selector should have excluded; those are
        counted, each once (by uid, else namespace/name), in one MalformedInput per answer."""
        kept: list[dict[str, Any]] = []
        new = 0
        for obj in items:
            try:
                foreign = self.not_asked_for(obj)
            except _OBJECT_ERRORS:
                foreign = True  # cannot tell whose it is: not ours to use
            if not foreign:
                kept.append(obj)
                continue
            self.foreign += 1
            meta = obj.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")[:300]
            if key in self._foreign_seen:
                continue
            if len(self._foreign_seen) >= FOREIGN_REMEMBERED:
                self._foreign_seen.clear()
            self._foreign_seen.add(key)
            new += 1
        if new:
            selector = ",".join(f"{k}={v}" for k, v in self.field_selector().items())
            emit(MalformedInput(self.name, f"{new} {self.plural} not asked for (fieldSelector "
                                           f"{selector} not applied by the server): skipped"
                                           [:300], self.clock.now()))
        return kept

    def _deliver_event(self, event_type: str, raw: dict[str, Any], emit: Emit) -> None:
        try:
            self.on_event(event_type, raw, emit)
        except _OBJECT_ERRORS as e:  # one bad object: counted and skipped, the watch goes on
            name = (raw.get("metadata") or {}).get("name") if isinstance(raw, dict) else None
            emit(MalformedInput(self.name, f"{self.plural} {event_type} {str(name)[:80]!r}: "
                                           f"{e!r}"[:300], self.clock.now()))

    def _watch_response(self, status_code: int) -> None:
        if status_code == 200 and self._up is False and self._emit is not None:
            self._set_up(self._emit, True, f"watching {self.plural} again")

    def _recover(self, e: Exception, rv: str | None, emit: Emit) -> str | None:
        """Decide what a failure means; returns the RV to resume from (None = relist)."""
        rv = self.resource_version if rv is not None else None
        code, message = _http_error(e)
        if code == 410:
            # History compacted past our RV: only a fresh list can say what we missed. After
            # the backoff: a server that expires every watch must not draw a relist storm.
            self.relists_gone += 1
            self._notes.note("gone", "%s: resourceVersion %s expired, relisting (with backoff, up "
                             "to %.0f s)", self.plural, rv, self.backoff.maximum,
                             level=logging.INFO)
            self._sleep()
            return None
        if code in (401, 403):
            what = "RBAC: forbidden" if code == 403 else "unauthorized (401): token rejected"
            self._set_up(emit, False,
                         f"{what} to list/watch {self.plural}: {message}; grant list, "
                         f"watch on {self.plural} to the exporter's service account "
                         f"(deploy/clusterrole.yaml)", DownCause.FORBIDDEN)
            self._sleep()
            return None
        if code is not None:
            self._set_up(emit, False, f"API server answered {code} for {self.plural}: {message}")
            self._sleep(_retry_after(e))  # 429/503 say when to come back: not sooner
            return None
        if isinstance(e, AnswerTooLarge):
            self._set_up(emit, False, f"{e}; refused, relisting", DownCause.TRUNCATED)
            self._sleep()
            return None
        if isinstance(e, WatchStalled) or (isinstance(e, httpx.TimeoutException)
                                           and not isinstance(e, httpx.ConnectTimeout)):
            self._set_up(emit, False, self._silence(e))
            self._sleep()
            return None  # the Node may have changed while nothing came: relist
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            self._set_up(emit, False, f"API server unreachable: {e}")
            self._sleep()
            return rv
        if isinstance(e, httpx.TransportError):
            # Dropped or dead watch connection: not "down" unless re-connecting fails.
            self.reconnects += 1
            self._notes.note("lost", "%s watch connection lost (%s); reconnecting", self.plural,
                             e, level=logging.INFO)
            self._sleep()
            return rv
        if isinstance(e, (msgspec.MsgspecError, ValueError, TypeError, KeyError,
                          AttributeError)):
            emit(MalformedInput(self.name, f"undecodable {self.plural} answer: {e!r}",
                                self.clock.now()))
            self._sleep()
            return None
        self.log.exception("%s: unexpected failure", self.plural)
        self._set_up(emit, False, f"unexpected error: {e!r}")
        self._sleep()
        return None

    def _silence(self, e: Exception) -> str:
        if isinstance(e, WatchStalled):
            return f"{self.plural} watch: {e}; relisting"
        if self._phase == "watch":
            return (f"API server sent no byte on the {self.plural} watch for "
                    f"{self.watch_idle_timeout:.0f} s (no event, no bookmark, past its "
                    f"timeoutSeconds={self.server_timeout:.0f}); relisting")
        return (f"API server did not answer the {self.plural} list within "
                f"{self.request_timeout:.0f} s")

    def _sleep(self, at_least: float | None = None) -> None:
        delay = self.backoff.next()
        if at_least is not None:
            delay = max(delay, min(at_least, MAX_RETRY_AFTER))
        self.stopping.wait(delay)

    def _set_up(self, emit: Emit, up: bool, reason: str, cause: str = "") -> None:
        if self._up is up:
            return
        self._up = up  # the agent logs the change
        emit(SourceStatus(self.name, up, self.clock.now(), reason, cause))


class DiffingListWatchSource(ListWatchSource):
    """A list/watch source that emits an object's typed event only when what it carries
    changed (its time and resourceVersion aside), the deletion on DELETED, and after every list
    the keys it holds (`relisted`): after a relist (410, an error) the receiver learns which
    objects vanished during the gap, and unchanged ones produce no second event. A converter's
    problems are reported once per change of the object, not once per relist. Subclasses give
    `convert(obj, now, deleted)` -> (event or None, problems), `key_of(event)` and
    `relisted(now, keys)`."""

    def __init__(self, clock: Clock, **kwargs: Any) -> None:
        super().__init__(clock, **kwargs)
        self._known: dict[str, Any] = {}  # key -> last emitted event, time/RV zeroed

    def convert(self, obj: dict[str, Any], now: float,
                deleted: bool) -> tuple[Any | None, list[str]]:
        raise NotImplementedError

    def key_of(self, event: Any) -> str:
        raise NotImplementedError

    def relisted(self, now: float, keys: frozenset[str]) -> Any:
        raise NotImplementedError

    def on_list(self, items: list[dict[str, Any]], emit: Emit) -> None:
        now = self.clock.now()
        known: dict[str, Any] = {}
        for obj in items:
            event = self._converted(obj, now, emit, deleted=False)
            if event is None:
                continue
            key, same = self.key_of(event), _unstamped(event)
            if self._known.get(key) != same:
                emit(event)
            known[key] = same
        self._known = known
        emit(self.relisted(now, frozenset(known)))

    def on_event(self, event_type: str, obj: dict[str, Any], emit: Emit) -> None:
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        deleted = event_type == "DELETED"
        event = self._converted(obj, self.clock.now(), emit, deleted=deleted)
        if event is None:
            return
        key = self.key_of(event)
        if deleted:
            self._known.pop(key, None)
            emit(event)
            return
        same = _unstamped(event)
        if self._known.get(key) == same:
            return
        self._known[key] = same
        emit(event)

    def _converted(self, obj: dict[str, Any], now: float, emit: Emit,
                   deleted: bool) -> Any | None:
        event, problems = self.convert(obj, now, deleted)
        if event is None:
            emit(MalformedInput(self.name, "; ".join(problems)[:300], now))
            return None
        if problems and self._known.get(self.key_of(event)) != _unstamped(event):
            for problem in problems:
                emit(MalformedInput(self.name, problem[:300], now))
        return event


def _unstamped(event: Any) -> Any:
    """The event with what changes on every delivery (its time, the object's
    resourceVersion) zeroed: equal when nothing it carries changed."""
    return dataclasses.replace(event, time=0.0, resource_version="")


def _retry_after(e: Exception) -> float | None:
    """Seconds a 429/503 asked us to wait (Retry-After: seconds or an HTTP date), else None."""
    response = getattr(e, "response", None)
    if response is None or response.status_code not in (429, 503):
        return None
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _http_error(e: Exception) -> tuple[int | None, str]:
    """(status code, message) of an API error, or (None, "") for anything else."""
    if isinstance(e, ApiError) and getattr(e, "status", None) is not None:
        status = e.status
        code = status.code or (e.response.status_code if e.response is not None else None)
        return code, status.message or status.reason or ""
    if isinstance(e, httpx.HTTPStatusError) and e.response is not None:
        # A watch's HTTP error arrives unread (lightkube streams it): read the Status body.
        try:
            e.response.read()
            body = e.response.json()
            message = body.get("message", "") if isinstance(body, dict) else ""
        except Exception:  # noqa: BLE001 - the code alone is enough to act on
            message = ""
        finally:
            e.response.close()
        return e.response.status_code, message or e.response.reason_phrase
    return None, ""
