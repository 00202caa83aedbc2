"""A small, real HTTP Kubernetes API server for tests: Nodes and Pods (and Leases, Events,
PodDisruptionBudgets), list and watch.

It speaks the wire protocol a client library sees from kube-apiserver, for the two collections
the exporter uses (/api/v1/nodes, /api/v1/pods):
- GET list -> a NodeList/PodList with metadata.resourceVersion;
- GET ?watch=true&resourceVersion=RV -> a chunked stream of {"type", "object"} lines: the
  events after RV (or synthetic ADDED for everything when RV is absent or "0"), then live ones;
  BOOKMARK events when the client sent allowWatchBookmarks=true and the test calls bookmark();
  timeoutSeconds closes the stream cleanly;
- fieldSelector metadata.name / spec.nodeName (=, ==, !=), comma-joined;
- after compact(), an RV older than the compaction point is "too old": a watch gets HTTP 200
  then an ERROR event carrying a 410 Expired Status (what kube-apiserver sends), or a plain
  HTTP 410 when `gone_as_http` is set; open watches are expired with the same ERROR event;
- drop_watches() cuts every watch connection abruptly (a network failure, not a clean end);
- set_delay(s) delays every response, set_forbidden(True) answers 403 with an RBAC Status;
- hostile or broken servers: set_silent(True) accepts connections and reads
  requests but answers none until set_silent(False); hang_watches() makes open watches send no
  byte more (no event, no bookmark) while keeping the connection open; send_raw(bytes) writes
  bytes as they are into open watches (half an event line, a line of 10 MiB without a newline);
  set_endless_continue(True) answers every list page with a `continue` token;
  set_watch_error(500) answers every watch with that HTTP status and a Status body (lists
  still work: a list followed by the same failure, again and again);
  throttle(429, retry_after=2, count=3) answers the next 3 requests with that status and a
  Retry-After header (request_times holds when each request came, for the tests).
- delegated authentication and authorization, as kube-apiserver answers a node agent that
  checks scrapers' tokens (--web.auth=kubernetes): POST tokenreviews (authentication.k8s.io/v1)
  authenticates the tokens add_token() made (expire_token() makes one expired; a token for
  other audiences is refused as the real server refuses it), POST subjectaccessreviews
  (authorization.k8s.io/v1) allows what allow_path() granted to a user or group; both 201 with
  the review and its status; token_reviews / access_reviews count them; set_review_delay(s)
  holds every review answer for s seconds, set_review_error(code) answers them with a Status;
  ("create", "tokenreviews") in `denied` refuses our own account (403, as RBAC would).
- recordings: replay(path, step) publishes a raw watch stream recorded from a real
  kube-apiserver (tests/fixtures/kubelet-v1.36/) event by event, BOOKMARKs included;
  publish_recorded(event) publishes one.

Objects are shaped as the real API returns them (apiVersion, kind, metadata.uid and
resourceVersion, quantity strings, conditions). Usage:

    with FakeApiServer() as api:
        api.set_node("n1", cpu="2", memory="8Gi")
        api.put_pod("web", node="n1", requests={"cpu": "500m"})
        ... Client(kubeconfig=api.kubeconfig_path) ...
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import queue
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

_DROP = object()  # queue sentinel: cut the connection
_CLOSE = object()  # queue sentinel: end the stream cleanly
_HANG = object()  # queue sentinel: send nothing more, keep the connection open until stop()
_RAW = object()  # queue item (_RAW, bytes): written into the stream as they are

KINDS = {"nodes": "Node", "pods": "Pod", "leases": "Lease", "events": "Event",
         "poddisruptionbudgets": "PodDisruptionBudget"}
# The group/version each collection is served under (its objects' and lists' apiVersion).
API_VERSIONS = {"poddisruptionbudgets": "policy/v1"}
# policy/v1 PodDisruptionBudgets of every namespace, as the plan's budget watch reads them.
_PDB_PATHS = ("apis/policy/v1/poddisruptionbudgets",)
# coordination.k8s.io/v1 Leases (The node's, in kube-node-lease), served as a third
# collection next to /api/v1's two.
_LEASE_PATHS = ("apis/coordination.k8s.io/v1/leases",
                "apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
# Events, also read in "default" alone (where the kubelet records its Node's), as the node
# events source does.
_EVENT_PATHS = ("api/v1/namespaces/default/events",)


def status_object(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details or {}, "code": code}


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (for an Event's scalar fields a strategic-merge patch is the same)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge_patch(target.get(key), value)
    return target


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _field_value(obj: dict, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur if isinstance(cur, str) else ""


def parse_field_selector(text: str) -> Callable[[dict], bool]:
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key, False, value))
        else:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append((key, True, value))
        if terms[-1][0] not in ("metadata.name", "metadata.namespace", "spec.nodeName",
                                "involvedObject.kind", "involvedObject.name", "reason"):
            raise ValueError(f'field label not supported: "{terms[-1][0]}"')

    def matches(obj: dict) -> bool:
        return all((_field_value(obj, key) == value) == equal for key, equal, value in terms)

    return matches


class _Watch:
    def __init__(self, collection: str, matches: Callable[[dict], bool], bookmarks: bool):
        self.collection = collection
        self.matches = matches
        self.bookmarks = bookmarks
        self.queue: queue.Queue = queue.Queue()


class _Server(ThreadingHTTPServer):
    """A client that hangs up before its answer is written is what the flood and timeout tests
    do on purpose, as clients of a kube-apiserver do: not a traceback in the test's output."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset
            return
        super().handle_error(request, client_address)


class FakeApiServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str], dict] = {}
        self._rv = 100
        self._history: list[tuple[int, str, str, dict]] = []  # (rv, collection, type, object)
        self._compacted = 0  # RVs below this are "too old"
        self._watches: list[_Watch] = []
        self._delay = 0.0
        self._forbidden = False
        self._forbidden_collections: set[str] = set()
        self._stopping = threading.Event()
        self._admit_watches = threading.Event()
        self._admit_watches.set()
        self.gone_as_http = False
        self._silent = threading.Event()  # set: requests are read and never answered
        self.endless_continue = False
        self.watch_error: int | None = None
        # A proxy (or an old aggregated API server) that drops fieldSelector: every object of
        # the collection is answered, whatever was asked.
        self.ignore_field_selector = False
        # Every watch is answered 410 Expired (200 + one ERROR event, as kube-apiserver does
        # when etcd compacts faster than a client can list and watch): a relist loop.
        self.always_gone = False
        self.request_times: list[float] = []  # time.monotonic() of each entry in `requests`
        self._throttle = (0, 429, "1")  # (requests left, status, Retry-After)
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) as received
        self._host, self._port = host, port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._tmpdir: str | None = None
        self.kubeconfig_path = ""
        # Writes (POST): Events created, and which (verb, resource) SelfSubjectAccessReviews deny.
        self.events: list[dict] = []
        self.denied: set[tuple[str, str]] = set()
        self.event_writes: list[tuple[str, str]] = []  # (method, name or "") of each Event write
        self._event_write_error: int | None = None
        # Delegated authn/authz: token -> (user info, audiences, expired); granted
        # (subject, path, verb) where subject is "user:NAME" or "group:NAME".
        self.tokens: dict[str, tuple[dict, tuple[str, ...], bool]] = {}
        self.granted: set[tuple[str, str, str]] = set()
        self.token_reviews = 0
        self.access_reviews = 0
        self.review_delay = 0.0
        self.review_error: int | None = None
        self._conns: set[socket.socket] = set()  # open client connections, cut by stop()

    def set_event_write_error(self, code: int | None) -> None:
        """Answer every POST and PATCH of an Event with this HTTP status and a Status body
        (500: an apiserver whose etcd is unhappy), or normally again (None)."""
        self._event_write_error = code

    def stored_events(self) -> list[dict]:
        """The Event objects the server holds now (created, then patched)."""
        with self._lock:
            return [copy.deepcopy(o) for (c, _), o in self._objects.items() if c == "events"]

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "FakeApiServer":
        """Start serving; after stop() this is a restart on the same port with the same objects,
        as a kube-apiserver restart keeps etcd."""
        server = self
        self._stopping.clear()

        class Handler(_Handler):
            api = server

        self._httpd = _Server((self._host, self._port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-apiserver",
                                        daemon=True)
        self._thread.start()
        self._tmpdir = tempfile.mkdtemp(prefix="fake-apiserver-")
        self.kubeconfig_path = self.write_kubeconfig(os.path.join(self._tmpdir, "kubeconfig"))
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._admit_watches.set()
        with self._lock:
            for watch in self._watches:
                watch.queue.put(_CLOSE)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:  # a dead server's kept-alive connections die with it
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._conns.clear()
        if self._thread is not None:
            self._thread.join(5)
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:  # not started: only known when given (kubeconfig before start)
            assert self._port, "start() first, or construct with a fixed port"
            return self._port
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def write_kubeconfig(self, path: str, token: str = "fake-token") -> str:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }
        with open(path, "w") as f:
            json.dump(config, f)  # JSON is YAML: any kubeconfig reader accepts it
        return path

    # ------------------------------------------------------------ test controls

    def set_delay(self, seconds: float) -> None:
        self._delay = seconds

    def set_forbidden(self, forbidden: bool, collection: str | None = None) -> None:
        """403 for every list and watch, or only for `collection` ("pods")."""
        if collection is None:
            self._forbidden = forbidden
        elif forbidden:
            self._forbidden_collections.add(collection)
        else:
            self._forbidden_collections.discard(collection)

    def set_silent(self, silent: bool) -> None:
        """An API server that accepts connections and never answers (requests held meanwhile
        are answered once it speaks again)."""
        if silent:
            self._silent.set()
        else:
            self._silent.clear()

    def hang_watches(self) -> int:
        """Open watches send no further byte, and keep their connection open."""
        with self._lock:
            for watch in self._watches:
                watch.queue.put(_HANG)
            return len(self._watches)

    def send_raw(self, data: bytes, then_hang: bool = False) -> int:
        """Write `data` into every open watch stream as is (one HTTP chunk), then maybe hang."""
        with self._lock:
            for watch in self._watches:
                watch.queue.put((_RAW, data))
                if then_hang:
                    watch.queue.put(_HANG)
            return len(self._watches)

    def throttle(self, code: int = 429, retry_after: str = "1", count: int = 1) -> None:
        """The next `count` requests get `code` with a Retry-After header (429, 503)."""
        with self._lock:
            self._throttle = (count, code, retry_after)

    def set_watch_error(self, code: int | None) -> None:
        self.watch_error = code

    def set_endless_continue(self, endless: bool) -> None:
        """Every list page says there is another (a `continue` token that never ends)."""
        self.endless_continue = endless

    @property
    def resource_version(self) -> int:
        return self._rv

    def compact(self, expire_watches: bool = True) -> int:
        """Forget history up to now. Open watches get a 410 ERROR event unless told not to."""
        with self._lock:
            self._compacted = self._rv
            self._history.clear()
            if expire_watches:
                for watch in self._watches:
                    watch.queue.put(("ERROR", self._expired(self._rv - 1)))
                    watch.queue.put(_CLOSE)
            return self._compacted

    def drop_watches(self) -> int:
        """Cut every open watch connection abruptly; returns how many were cut."""
        with self._lock:
            for watch in self._watches:
                watch.queue.put(_DROP)
            return len(self._watches)

    def hold_watches(self) -> None:
        """A partition for watches: new watch requests wait (unanswered) until release.

        With drop_watches() this makes a deterministic gap: changes made while held are
        only seen by a client through the history, or through a relist after compact().
        """
        self._admit_watches.clear()

    def release_watches(self) -> None:
        self._admit_watches.set()

    def bookmark(self) -> int:
        """Send a BOOKMARK at the current RV to every watch that asked for bookmarks."""
        with self._lock:
            for watch in self._watches:
                if watch.bookmarks:
                    watch.queue.put(("BOOKMARK", {
                        "kind": KINDS[watch.collection],
                        "apiVersion": API_VERSIONS.get(watch.collection, "v1"),
                        "metadata": {"resourceVersion": str(self._rv)}}))
            return self._rv

    def open_watches(self, collection: str | None = None) -> int:
        with self._lock:
            return sum(1 for w in self._watches if collection in (None, w.collection))

    def wait_for_watches(self, count: int, collection: str | None = None,
                         timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.open_watches(collection) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {count} open {collection or ''} watches, have "
                                   f"{self.open_watches(collection)}")
            time.sleep(0.01)

    def requests_for(self, collection: str, watch: bool | None = None) -> list[dict[str, str]]:
        """Query strings of the requests received for a collection (optionally only watches)."""
        with self._lock:
            out = []
            for path, query in self.requests:
                if not path.endswith("/" + collection):
                    continue
                if watch is not None and (query.get("watch") == "true") != watch:
                    continue
                out.append(query)
            return out

    # ------------------------------------------------------------ delegated auth

    API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"  # kube-apiserver's default

    def add_token(self, token: str, username: str, groups: tuple[str, ...] = (),
                  audiences: tuple[str, ...] = (API_AUDIENCE,), uid: str | None = None) -> None:
        """A token the API server authenticates as `username` (a service account's is
        system:serviceaccount:NS:NAME, in groups system:serviceaccounts and
        system:serviceaccounts:NS, as kube-apiserver says)."""
        user = {"username": username, "uid": uid or str(uuid.uuid4()),
                "groups": [*groups, "system:authenticated"]}
        with self._lock:
            self.tokens[token] = (user, tuple(audiences), False)

    def expire_token(self, token: str) -> None:
        with self._lock:
            user, audiences, _ = self.tokens[token]
            self.tokens[token] = (user, audiences, True)

    def allow_path(self, subject: str, path: str = "/metrics", verb: str = "get") -> None:
        """Grant `verb` on the non-resource `path` to "user:NAME" or "group:NAME" (what a
        ClusterRole with nonResourceURLs and its binding do)."""
        with self._lock:
            self.granted.add((subject, path, verb))

    def set_review_delay(self, seconds: float) -> None:
        self.review_delay = seconds

    def set_review_error(self, code: int | None) -> None:
        self.review_error = code

    def _token_review(self, body: dict) -> dict:
        spec = body.get("spec") or {}
        wanted = tuple(spec.get("audiences") or (self.API_AUDIENCE,))
        with self._lock:
            self.token_reviews += 1
            known = self.tokens.get(spec.get("token", ""))
        status: dict[str, Any] = {"user": {}}
        if known is None:
            status["error"] = "[invalid bearer token, square/go-jose: error in cryptographic " \
                              "primitive]"
        elif known[2]:
            status["error"] = "[invalid bearer token, service account token has expired]"
        elif not set(wanted) & set(known[1]):
            status["error"] = (f"[invalid bearer token, token audiences {list(known[1])} is "
                               f"invalid for the target audiences {list(wanted)}]")
        else:
            status = {"authenticated": True, "user": copy.deepcopy(known[0]),
                      "audiences": sorted(set(wanted) & set(known[1]))}
        return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def _access_review(self, body: dict) -> dict:
        spec = body.get("spec") or {}
        attrs = spec.get("nonResourceAttributes") or {}
        subjects = {f"user:{spec.get('user', '')}"} | {f"group:{g}" for g in
                                                        spec.get("groups") or []}
        with self._lock:
            self.access_reviews += 1
            allowed = any((s, attrs.get("path"), attrs.get("verb")) in self.granted
                          for s in subjects)
        status: dict[str, Any] = {"allowed": allowed}
        if not allowed:
            status["reason"] = ""  # RBAC's no-opinion: allowed false, no reason, not denied
        else:
            status["reason"] = ('RBAC: allowed by ClusterRoleBinding "node-resize-exporter-'
                                'scrape" of ClusterRole "node-resize-exporter-scrape"')
        return {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    # ------------------------------------------------------------ objects

    def set_node(self, name: str, cpu: str = "2", memory: str = "8Gi", *,
                 allocatable_cpu: str | None = None, allocatable_memory: str | None = None,
                 extra_capacity: dict[str, str] | None = None) -> dict:
        """Create or replace a Node; allocatable defaults to capacity."""
        capacity = {"cpu": cpu, "memory": memory, "pods": "110",
                    "ephemeral-storage": "102626232Ki", "hugepages-1Gi": "0",
                    "hugepages-2Mi": "0"}
        capacity.update(extra_capacity or {})
        allocatable = dict(capacity)
        allocatable["cpu"] = allocatable_cpu if allocatable_cpu is not None else cpu
        allocatable["memory"] = allocatable_memory if allocatable_memory is not None else memory
        with self._lock:
            old = self._objects.get(("nodes", name))
            meta = old["metadata"] if old else {
                "name": name, "uid": str(uuid.uuid4()), "creationTimestamp": _now_iso(),
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64"}}
            node = {
                "kind": "Node", "apiVersion": "v1", "metadata": copy.deepcopy(meta),
                "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
                "status": {
                    "capacity": capacity, "allocatable": allocatable,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "kubelet is posting ready status",
                                    "lastHeartbeatTime": _now_iso(),
                                    "lastTransitionTime": _now_iso()}],
                    "addresses": [{"type": "InternalIP", "address": "10.0.0.10"},
                                  {"type": "Hostname", "address": name}],
                    "nodeInfo": {"kubeletVersion": "v1.36.0", "architecture": "amd64",
                                 "operatingSystem": "linux",
                                 "containerRuntimeVersion": "containerd://2.1.0"},
                },
            }
            return self._store("nodes", name, node)

    def update_node(self, name: str, *, cpu: str | None = None, memory: str | None = None,
                    allocatable_cpu: str | None = None, allocatable_memory: str | None = None,
                    capacity: dict[str, str] | None = None,
                    allocatable: dict[str, str] | None = None) -> dict:
        """Change a Node's status (MODIFIED). With no arguments: a heartbeat-only update."""
        with self._lock:
            node = copy.deepcopy(self._objects[("nodes", name)])
            status = node["status"]
            if cpu is not None:
                status["capacity"]["cpu"] = cpu
            if memory is not None:
                status["capacity"]["memory"] = memory
            if allocatable_cpu is not None:
                status["allocatable"]["cpu"] = allocatable_cpu
            if allocatable_memory is not None:
                status["allocatable"]["memory"] = allocatable_memory
            status["capacity"].update(capacity or {})
            status["allocatable"].update(allocatable or {})
            for cond in status["conditions"]:
                cond["lastHeartbeatTime"] = _now_iso()
            return self._store("nodes", name, node)

    def put_pod(self, name: str, *, node: str, namespace: str = "default",
                requests: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                priority_class: str | None = None, phase: str = "Running", reason: str = "",
                ready: bool = True, conditions: list[dict] | None = None,
                applied: dict[str, str] | None = None, resize: str | None = None,
                containers: int = 1, limits: dict[str, str] | None = None,
                container_ids: list[str] | None = None, uid: str | None = None) -> dict:
        """Create or replace a Pod bound to `node` (ADDED, or MODIFIED when it exists).

        `requests` go on each of `containers` app containers; `applied` is what the kubelet
        reports actuated (status.containerStatuses[].resources.requests); `conditions` are
        added to the standard ones; `resize` sets the deprecated status.resize. `limits`
        (default: the requests) decide status.qosClass as the API server does; `container_ids`
        are the runtime's ids the kubelet reports (containerd://<id>).
        """
        requests = {"cpu": "100m", "memory": "64Mi"} if requests is None else requests
        limits = dict(requests) if limits is None else limits
        qos = ("BestEffort" if not requests and not limits
               else "Guaranteed" if set(limits) >= {"cpu", "memory"}
               and all(requests.get(k, limits[k]) == limits[k] for k in limits)
               else "Burstable")
        key = f"{namespace}/{name}"
        with self._lock:
            old = self._objects.get(("pods", key))
            uid = old["metadata"]["uid"] if old else (uid or str(uuid.uuid4()))
            created = old["metadata"]["creationTimestamp"] if old else _now_iso()
            names = [f"c{i}" for i in range(containers)]
            spec: dict[str, Any] = {
                "nodeName": node, "schedulerName": "default-scheduler",
                "restartPolicy": "Always", "priority": 0,
                "containers": [{"name": n, "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": dict(requests),
                                              "limits": dict(limits)}}
                               for n in names],
            }
            if priority_class:
                spec["priorityClassName"] = priority_class
            cond_status = "True" if ready else "False"
            pod_conditions = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": created},
                {"type": "Initialized", "status": "True", "lastTransitionTime": created},
                {"type": "ContainersReady", "status": cond_status,
                 "lastTransitionTime": _now_iso()},
                {"type": "Ready", "status": cond_status, "lastTransitionTime": _now_iso()},
            ] + list(conditions or [])
            status: dict[str, Any] = {
                "phase": phase, "conditions": pod_conditions, "hostIP": "10.0.0.10",
                "podIP": "10.244.0.7", "startTime": created, "qosClass": qos,
                "containerStatuses": [
                    {"name": n, "ready": ready, "restartCount": 0,
                     "image": "registry.k8s.io/pause:3.10",
                     "imageID": "registry.k8s.io/pause@sha256:0",
                     "containerID": f"containerd://{(container_ids or [])[i]}"
                     if i < len(container_ids or []) else "containerd://0",
                     "started": ready, "state": {"running": {"startedAt": created}},
                     "allocatedResources": dict(applied if applied is not None else requests),
                     "resources": {"requests": dict(applied if applied is not None
                                                    else requests)}}
                    for i, n in enumerate(names)],
            }
            if reason:
                status["reason"] = reason
                status["message"] = f"Pod was rejected: {reason}"
            if resize:
                status["resize"] = resize
            pod = {
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": uid,
                             "creationTimestamp": created, "labels": dict(labels or {})},
                "spec": spec, "status": status,
            }
            return self._store("pods", key, pod)

    def put_raw(self, collection: str, obj: dict) -> dict:
        """Store an arbitrary object as-is (malformed-input tests); RV is still assigned."""
        meta = obj.setdefault("metadata", {})
        key = meta.get("name", "")
        if collection in ("pods", "poddisruptionbudgets"):
            key = f"{meta.get('namespace', 'default')}/{key}"
        with self._lock:
            return self._store(collection, key, copy.deepcopy(obj))

    def delete_node(self, name: str) -> dict:
        """Delete a Node (kubectl delete node): DELETED with the last state, as the real
        server sends it; the name is free to be registered again (a new uid)."""
        with self._lock:
            node = copy.deepcopy(self._objects.pop(("nodes", name)))
            self._rv += 1
            node["metadata"]["resourceVersion"] = str(self._rv)
            self._publish("nodes", "DELETED", node)
            return node

    def put_pdb(self, name: str, *, namespace: str = "default",
                match_labels: dict[str, str] | None = None,
                match_expressions: list[dict] | None = None, selector: Any = "given",
                disruptions_allowed: int = 1, current_healthy: int = 2,
                desired_healthy: int = 1, expected_pods: int = 2,
                observed_generation: int | None = None, generation_bump: bool = False,
                unhealthy_pod_eviction_policy: str | None = None,
                min_available: int | str | None = 1) -> dict:
        """Create or replace a policy/v1 PodDisruptionBudget (ADDED, or MODIFIED), its status as
        the disruption controller writes it. `selector` "given" builds spec.selector from
        match_labels/match_expressions; None leaves it out; anything else is stored as is.
        metadata.generation starts at 1 and grows by one with each replace (a spec change, as
        the real server counts); status.observedGeneration is the generation unless given
        (lower: the controller has not caught up). `generation_bump`: bump it once more."""
        key = f"{namespace}/{name}"
        with self._lock:
            old = self._objects.get(("poddisruptionbudgets", key))
            uid = old["metadata"]["uid"] if old else str(uuid.uuid4())
            created = old["metadata"]["creationTimestamp"] if old else _now_iso()
            generation = (old["metadata"]["generation"] + 1 if old else 1) + generation_bump
            spec: dict[str, Any] = {}
            if min_available is not None:
                spec["minAvailable"] = min_available
            if selector == "given":
                sel: dict[str, Any] = {}
                if match_labels is not None:
                    sel["matchLabels"] = dict(match_labels)
                if match_expressions is not None:
                    sel["matchExpressions"] = [dict(e) for e in match_expressions]
                spec["selector"] = sel
            elif selector is not None:
                spec["selector"] = selector
            if unhealthy_pod_eviction_policy is not None:
                spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
            pdb = {
                "kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
                "metadata": {"name": name, "namespace": namespace, "uid": uid,
                             "generation": generation, "creationTimestamp": created},
                "spec": spec,
                "status": {
                    "observedGeneration": generation if observed_generation is None
                    else observed_generation,
                    "disruptionsAllowed": disruptions_allowed,
                    "currentHealthy": current_healthy, "desiredHealthy": desired_healthy,
                    "expectedPods": expected_pods,
                    "conditions": [{"type": "DisruptionAllowed",
                                    "status": "True" if disruptions_allowed > 0 else "False",
                                    "reason": "SufficientPods" if disruptions_allowed > 0
                                    else "InsufficientPods",
                                    "message": "", "observedGeneration": generation,
                                    "lastTransitionTime": created}]},
            }
            return self._store("poddisruptionbudgets", key, pdb)

    def delete_pdb(self, name: str, namespace: str = "default") -> dict:
        with self._lock:
            pdb = copy.deepcopy(self._objects.pop(("poddisruptionbudgets",
                                                   f"{namespace}/{name}")))
            self._rv += 1
            pdb["metadata"]["resourceVersion"] = str(self._rv)
            self._publish("poddisruptionbudgets", "DELETED", pdb)
            return pdb

    def delete_pod(self, name: str, namespace: str = "default") -> dict:
        with self._lock:
            pod = self._objects.pop(("pods", f"{namespace}/{name}"))
            pod = copy.deepcopy(pod)
            self._rv += 1
            pod["metadata"]["resourceVersion"] = str(self._rv)
            pod["metadata"]["deletionTimestamp"] = _now_iso()
            self._publish("pods", "DELETED", pod)
            return pod

    def get(self, collection: str, key: str) -> dict:
        with self._lock:
            return copy.deepcopy(self._objects[(collection, key)])

    def put_event(self, node: str, reason: str, *, count: int = 1, last: str | None = None,
                  namespace: str = "default", etype: str = "Warning") -> dict:
        """An Event about a Node, as the kubelet records one (core/v1, aggregated by count)."""
        stamp = last or _now_iso()
        with self._lock:
            name = f"{node}.{uuid.uuid4().hex[:16]}"
            event = {"kind": "Event", "apiVersion": "v1",
                     "metadata": {"name": name, "namespace": namespace,
                                  "uid": str(uuid.uuid4()), "creationTimestamp": stamp},
                     "involvedObject": {"kind": "Node", "name": node, "uid": node,
                                        "apiVersion": "v1"},
                     "reason": reason, "type": etype, "message": f"{reason} on {node}",
                     "source": {"component": "kubelet", "host": node},
                     "firstTimestamp": stamp, "lastTimestamp": stamp, "count": count}
            return self._store("events", f"{namespace}/{name}", event)

    def set_lease(self, node: str, renew_time: str | None, holder: str | None = None) -> dict:
        """Create or renew a node's Lease in kube-node-lease, as a kubelet does every 10 s
        (renew_time: a MicroTime such as 2026-11-23T08:21:44.123456Z)."""
        with self._lock:
            old = self._objects.get(("leases", f"kube-node-lease/{node}"))
            meta = copy.deepcopy(old["metadata"]) if old else {
                "name": node, "namespace": "kube-node-lease", "uid": str(uuid.uuid4()),
                "creationTimestamp": _now_iso(),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                     "uid": str(uuid.uuid4())}]}
            spec: dict[str, Any] = {"holderIdentity": holder or node, "leaseDurationSeconds": 40}
            if renew_time is not None:
                spec["renewTime"] = renew_time
            lease = {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", "metadata": meta,
                     "spec": spec}
            return self._store("leases", f"kube-node-lease/{node}", lease)

    # ------------------------------------------------------------ recordings

    def publish_recorded(self, event: dict) -> dict:
        """Publish one recorded watch event ({"type", "object"} as kube-apiserver sent it).

        ADDED/MODIFIED store the object as recorded and DELETED removes it, all under the
        recorded type; a BOOKMARK goes to the watches that asked for bookmarks, its object
        (annotations included) as recorded. The recorded resourceVersion is kept while it is
        ahead of this server's, else the next one is used (RVs only grow). Returns the object
        as published.
        """
        kind, obj = event["type"], copy.deepcopy(event["object"])
        collection = {v: k for k, v in KINDS.items()}[obj["kind"]]
        meta = obj.setdefault("metadata", {})
        with self._lock:
            recorded = int(meta.get("resourceVersion") or 0)
            if kind == "BOOKMARK":
                self._rv = max(self._rv, recorded)
                meta["resourceVersion"] = str(self._rv)
                for watch in self._watches:
                    if watch.collection == collection and watch.bookmarks:
                        watch.queue.put(("BOOKMARK", copy.deepcopy(obj)))
                return obj
            self._rv = max(self._rv + 1, recorded)
            meta["resourceVersion"] = str(self._rv)
            key = meta["name"] if collection == "nodes" else \
                f"{meta.get('namespace', 'default')}/{meta['name']}"  # pods, leases
            if kind == "DELETED":
                self._objects.pop((collection, key), None)
            else:
                self._objects[(collection, key)] = obj
            self._publish(collection, kind, obj)
            return copy.deepcopy(obj)

    def replay(self, path: str | os.PathLike, step: Callable[[int, dict], None] | None = None,
               only: Callable[[dict], bool] | None = None) -> list[dict]:
        """Publish a recorded watch stream (JSONL, one event a line) in order, BOOKMARKs
        included; step(i, published event) runs after each, so a test can scrape between
        events. `only` picks the events to publish. Returns the events published."""
        published = []
        with open(path) as f:
            events = [json.loads(line) for line in f if line.strip()]
        for event in events:
            if only is not None and not only(event):
                continue
            done = {"type": event["type"], "object": self.publish_recorded(event)}
            published.append(done)
            if step is not None:
                step(len(published) - 1, done)
        return published

    # ------------------------------------------------------------ internals

    def _store(self, collection: str, key: str, obj: dict) -> dict:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        kind = "MODIFIED" if (collection, key) in self._objects else "ADDED"
        self._objects[(collection, key)] = obj
        self._publish(collection, kind, obj)
        return copy.deepcopy(obj)

    def _publish(self, collection: str, kind: str, obj: dict) -> None:
        snapshot = copy.deepcopy(obj)
        self._history.append((self._rv, collection, kind, snapshot))
        for watch in self._watches:
            if watch.collection == collection and watch.matches(snapshot):
                watch.queue.put((kind, snapshot))

    def _expired(self, requested: int) -> dict:
        return status_object(410, "Expired",
                             f"too old resource version: {requested} ({self._compacted})")

    def _list(self, collection: str, matches: Callable[[dict], bool]) -> dict:
        with self._lock:
            items = [copy.deepcopy(o) for (c, _), o in sorted(self._objects.items())
                     if c == collection and matches(o)]
            meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
            if self.endless_continue:
                meta["continue"] = str(uuid.uuid4())
            return {"kind": KINDS[collection] + "List",
                    "apiVersion": API_VERSIONS.get(collection, "v1"),
                    "metadata": meta, "items": items}

    def _open_watch(self, collection: str, matches: Callable[[dict], bool], rv: str,
                    bookmarks: bool) -> tuple[_Watch | None, list, dict | None]:
        """Register a watch; returns (watch, initial events, expired-Status or None)."""
        with self._lock:
            if rv in ("", "0"):
                initial = [("ADDED", copy.deepcopy(o)) for (c, _), o in
                           sorted(self._objects.items()) if c == collection and matches(o)]
            else:
                try:
                    since = int(rv)
                except ValueError:
                    return None, [], status_object(400, "BadRequest",
                                                   f"invalid resource version: {rv}")
                if since < self._compacted:
                    return None, [], self._expired(since)
                initial = [(k, copy.deepcopy(o)) for r, c, k, o in self._history
                           if r > since and c == collection and matches(o)]
            watch = _Watch(collection, matches, bookmarks)
            self._watches.append(watch)
            return watch, initial, None

    def _close_watch(self, watch: _Watch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - keep test output clean
        pass

    def setup(self) -> None:
        super().setup()
        with self.api._lock:
            self.api._conns.add(self.connection)

    def finish(self) -> None:
        with self.api._lock:
            self.api._conns.discard(self.connection)
        super().finish()

    def _send_json(self, code: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, event_type: str, obj: dict) -> None:
        line = json.dumps({"type": event_type, "object": obj}).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        api = self.api
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with api._lock:
            api.requests.append((url.path, query))
            api.request_times.append(time.monotonic())
            left, code, retry_after = api._throttle
            if left > 0:
                api._throttle = (left - 1, code, retry_after)
        if left > 0:
            self._send_json(code, status_object(code, "TooManyRequests", "please try again "
                                                "later", {"retryAfterSeconds": int(retry_after)}),
                            {"Retry-After": retry_after})
            return
        while api._silent.is_set():  # read, never answered: the client must give up by itself
            if api._stopping.wait(0.05):
                return
        if api._delay:
            time.sleep(api._delay)
        parts = url.path.strip("/").split("/")
        if url.path.strip("/") in _LEASE_PATHS:
            parts = ["api", "v1", "leases"]
        if url.path.strip("/") in _EVENT_PATHS:
            parts = ["api", "v1", "events"]
        if url.path.strip("/") in _PDB_PATHS:
            parts = ["api", "v1", "poddisruptionbudgets"]
        if len(parts) != 3 or parts[:2] != ["api", "v1"] or parts[2] not in KINDS:
            self._send_json(404, status_object(404, "NotFound",
                                               "the server could not find the requested "
                                               "resource"))
            return
        collection = parts[2]
        if api._forbidden or collection in api._forbidden_collections:
            verb = "watch" if query.get("watch") == "true" else "list"
            self._send_json(403, status_object(
                403, "Forbidden",
                f'{collection} is forbidden: User "system:serviceaccount:kube-system:'
                f'node-resize-exporter" cannot {verb} resource "{collection}" in API group '
                f'"{API_VERSIONS.get(collection, "v1").rpartition("/")[0]}" at the cluster '
                f"scope", {"kind": collection}))
            return
        try:
            matches = parse_field_selector(query.get("fieldSelector", ""))
        except ValueError as e:
            self._send_json(400, status_object(400, "BadRequest", str(e)))
            return
        if api.ignore_field_selector:
            matches = parse_field_selector("")
        if query.get("watch") not in ("true", "1"):
            self._send_json(200, api._list(collection, matches))
            return
        self._watch(collection, matches, query)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        """Two writes, as kube-apiserver answers them: SelfSubjectAccessReview (allowed unless
        the test put (verb, resource) in `denied`) and core/v1 Event creation (kept in
        `events`, with the name generateName asks for)."""
        api = self.api
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send_json(400, status_object(400, "BadRequest", "invalid JSON"))
            return
        with api._lock:
            api.requests.append((url.path, {"method": "POST"}))
        parts = url.path.strip("/").split("/")
        review = {("authentication.k8s.io", "tokenreviews"): api._token_review,
                  ("authorization.k8s.io", "subjectaccessreviews"): api._access_review}.get(
                      (parts[1], parts[3]) if len(parts) == 4 and parts[0] == "apis"
                      and parts[2] == "v1" else ("", ""))
        if review is not None:
            while api._silent.is_set():
                if api._stopping.wait(0.05):
                    return
            began = time.monotonic()  # set_review_delay(0) releases the held ones
            while time.monotonic() - began < api.review_delay:
                if api._stopping.wait(0.05):
                    return
            if api.review_error is not None:
                self._send_json(api.review_error, status_object(
                    api.review_error, "InternalError", "an error on the server (\"etcdserver: "
                    "request timed out\") has prevented the request from succeeding"))
                return
            if ("create", parts[3]) in api.denied:
                self._send_json(403, status_object(
                    403, "Forbidden", f'{parts[3]}.{parts[1]} is forbidden: User "system:'
                    f'serviceaccount:node-resize-exporter:node-resize-exporter" cannot create '
                    f'resource "{parts[3]}" in API group "{parts[1]}" at the cluster scope',
                    {"group": parts[1], "kind": parts[3]}))
                return
            self._send_json(201, review(body))
            return
        if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]:
            attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
            allowed = (attrs.get("verb"), attrs.get("resource")) not in api.denied
            body["status"] = {"allowed": allowed}
            if not allowed:
                body["status"]["reason"] = "no RBAC policy matched"
            self._send_json(201, body)
            return
        if (len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"]
                and parts[4] == "events"):
            with api._lock:
                api.event_writes.append(("POST", ""))
            if ("create", "events") in api.denied:
                self._send_json(403, status_object(403, "Forbidden", "events is forbidden"))
                return
            if api._event_write_error is not None:
                self._event_write_failed()
                return
            with api._lock:
                meta = body.setdefault("metadata", {})
                meta["name"] = meta.get("name") or meta.get("generateName", "") + uuid.uuid4(
                ).hex[:5]
                if ("events", f"{parts[3]}/{meta['name']}") in api._objects:
                    self._send_json(409, status_object(
                        409, "AlreadyExists", f'events "{meta["name"]}" already exists',
                        {"name": meta["name"], "kind": "events"}))
                    return
                meta.update(namespace=parts[3], uid=str(uuid.uuid4()),
                            creationTimestamp=_now_iso())
                body = api._store("events", f"{parts[3]}/{meta['name']}", body)  # watchable
                api.events.append(body)
            self._send_json(201, body)
            return
        self._send_json(404, status_object(404, "NotFound", "the server could not find the "
                                           "requested resource"))

    def _event_write_failed(self) -> None:
        code = self.api._event_write_error or 500
        self._send_json(code, status_object(code, "InternalError",
                                            "Internal error occurred: etcdserver: request "
                                            "timed out"))

    def do_PATCH(self) -> None:  # noqa: N802 - http.server's naming
        """PATCH of a core/v1 Event, as kube-apiserver answers it: a strategic-merge or merge
        patch (what client-go's EventSink sends: count, lastTimestamp, message) applied to the
        stored object, 200 with the result; 404 NotFound for an Event it does not hold; 415
        for a content type it does not take here."""
        api = self.api
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        parts = url.path.strip("/").split("/")
        with api._lock:
            api.requests.append((url.path, {"method": "PATCH"}))
        if not (len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"]
                and parts[4] == "events"):
            self._send_json(404, status_object(404, "NotFound", "the server could not find "
                                               "the requested resource"))
            return
        namespace, name = parts[3], parts[5]
        with api._lock:
            api.event_writes.append(("PATCH", name))
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype not in ("application/strategic-merge-patch+json",
                         "application/merge-patch+json"):
            self._send_json(415, status_object(415, "UnsupportedMediaType",
                                               "the body of the request was in an unknown "
                                               "format - accepted media types include: "
                                               "application/json-patch+json, "
                                               "application/merge-patch+json, "
                                               "application/apply-patch+yaml"))
            return
        if ("patch", "events") in api.denied:
            self._send_json(403, status_object(403, "Forbidden", "events is forbidden"))
            return
        if api._event_write_error is not None:
            self._event_write_failed()
            return
        try:
            patch = json.loads(raw or b"{}")
        except ValueError:
            self._send_json(400, status_object(400, "BadRequest", "invalid JSON"))
            return
        with api._lock:
            current = api._objects.get(("events", f"{namespace}/{name}"))
            if current is None:
                self._send_json(404, status_object(
                    404, "NotFound", f'events "{name}" not found',
                    {"name": name, "kind": "events"}))
                return
            merged = _merge_patch(copy.deepcopy(current), patch)
            body = api._store("events", f"{namespace}/{name}", merged)
        self._send_json(200, body)

    def _watch(self, collection: str, matches, query: dict[str, str]) -> None:
        api = self.api
        if api.watch_error is not None:
            self._send_json(api.watch_error, status_object(
                api.watch_error, "InternalError", "an error on the server (\"etcdserver: "
                "request timed out\") has prevented the request from succeeding"))
            return
        while not api._admit_watches.wait(0.05):
            if api._stopping.is_set():
                return
        bookmarks = query.get("allowWatchBookmarks") == "true"
        watch, initial, error = api._open_watch(collection, matches,
                                                query.get("resourceVersion", ""), bookmarks)
        if api.always_gone and error is None:
            assert watch is not None
            api._close_watch(watch)
            watch, initial = None, []
            error = api._expired(int(query.get("resourceVersion") or 0))
        if error is not None and (api.gone_as_http or error["code"] != 410):
            self._send_json(error["code"], error)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if error is not None:  # the real server: 200, then one ERROR event, then the end
            self._chunk("ERROR", error)
            self._end_stream()
            return
        assert watch is not None
        timeout = float(query.get("timeoutSeconds") or 0)
        deadline = time.monotonic() + timeout if timeout > 0 else None
        try:
            for event_type, obj in initial:
                self._chunk(event_type, obj)
            while not api._stopping.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                try:
                    item = watch.queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is _DROP:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if item is _CLOSE:
                    break
                if item is _HANG:
                    self._hold()
                    return
                if item[0] is _RAW:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(item[1]), item[1]))
                    self.wfile.flush()
                    continue
                self._chunk(*item)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True  # the client went away
        finally:
            api._close_watch(watch)

    def _hold(self) -> None:
        """Keep the connection open, sending nothing, until the client goes or stop()."""
        while not self.api._stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        break  # the client closed its end
                except OSError:
                    break
        self.close_connection = True

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@contextlib.contextmanager
def serving_node(directory: str, node: str, cpu: str = "2", memory: str = "8Gi"):
    """A running FakeApiServer holding Node `node`, its kubeconfig written under `directory`
    and kept at `.kubeconfig`: what the tests that run against one Node start from."""
    with FakeApiServer() as server:
        server.set_node(node, cpu=cpu, memory=memory)
        server.kubeconfig = server.write_kubeconfig(os.path.join(directory, "kubeconfig"))
        yield server
