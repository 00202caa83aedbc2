"""How the exporter talks to the API server: configuration, the lightkube client, resources.

lightkube does the HTTP, auth, TLS and list/watch decoding. Three things it does not do that a
node agent needs are added here, through lightkube's public `transport` hook rather than by
writing HTTP ourselves:
- ask watches for bookmarks (`allowWatchBookmarks=true`; lightkube has no parameter for it),
  so a quiet, field-selected watch still advances its resourceVersion and survives compaction;
- bound a watch's read time (lightkube reads forever): its headers must come within the
  request timeout and then each read within `watch_read_timeout` seconds, so a silent server
  or a silently dead TCP connection is noticed instead of never;
- bound what an answer may make us hold: a watch line (one event) of at most
  MAX_LINE_BYTES that completes within `line_timeout` once it began (a line trickled a byte at
  a time never ends a read), a list page of at most MAX_PAGE_BYTES, at most MAX_LIST_PAGES
  pages per list (a `continue` token that never ends); past a bound the request fails with
  AnswerTooLarge / WatchStalled, which the source reports as down before it relists;
- abort in-flight watches from another thread (socket shutdown), so a source stops promptly.
"""
from __future__ import annotations

import itertools
import os
import socket
import stat
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import httpx2 as httpx
import lightkube
import msgspec
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.core import decoders
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_api_info,
)

from exporter.kube.bounds import LIST_MAX_OBJECTS

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# etcd refuses objects over 1.5 MiB by default, so one watch event line is well under this; the
# bound keeps a hostile line without a newline from growing the heap (512 MiB was seen).
MAX_LINE_BYTES = 8 * 2**20
# A page of LIST_CHUNK pods of ~10 KB is a few MiB; the bound keeps decoding under the
# DaemonSet's 400 MiB memory limit.
MAX_PAGE_BYTES = 32 * 2**20
LIST_CHUNK = 250  # objects per list page (client-go asks for 500)
MAX_LIST_PAGES = 100  # a list longer than this is a hostile `continue` loop, not this node
LINE_TIMEOUT = 30.0  # s for one watch line to complete once its first byte came


class AnswerTooLarge(Exception):
    """An API answer went past a bound (line, page, pages): not decoded, the source relists."""


class WatchStalled(Exception):
    """A watch line began but did not complete in time (a stall or a trickle mid-event)."""


class KubeUnavailable(Exception):
    """No usable API configuration. `reason` says what is wrong, `fix` what to do."""

    def __init__(self, reason: str, fix: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})" if self.fix else self.reason

_VERBS = ["get", "list", "watch", "global_list", "global_watch"]


class RawNode(GenericGlobalResource):
    """core/v1 Node decoded as a plain dict: our converter tolerates odd fields, while
    lightkube's typed models would reject a whole list for one unexpected value."""

    _api_info = create_api_info("", "v1", "Node", "nodes", verbs=_VERBS)


class RawPod(GenericNamespacedResource):
    _api_info = create_api_info("", "v1", "Pod", "pods", verbs=_VERBS)


class RawPdb(GenericNamespacedResource):
    """policy/v1 PodDisruptionBudget: whether an eviction the plan asks for would be refused."""

    _api_info = create_api_info("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets",
                                verbs=_VERBS)


def prepare_decoding() -> int:
    """Has msgspec build its decoder of every API type now, in the calling thread, before the
    sources' threads start; returns how many types. Call it once every module that names a
    resource is imported (build_agent: after the sources are opened, before they run).

    msgspec (0.22, the newest) builds a Struct type's decoding information the first time
    that type is decoded, and two threads doing so at once for the same type crash the
    process: SIGSEGV in msgspec's _core. CI saw it when two watches were told 410 Expired
    together and both decoded their first Status; here, four threads decoding a first Status at
    once with a 1 us switch interval crashed 11 of 200 processes, none once it was built ahead.
    Built, decoding is thread-safe. What is built: every Struct type loaded (lightkube's
    WatchEvent, Status, models; 0.06 s for ~400) and the list type lightkube makes, on first
    use, for each resource class (RawNode, RawPod, ... defined anywhere)."""
    built = 0
    for struct in _subclasses(msgspec.Struct):
        try:
            msgspec.json.Decoder(struct)
        except (TypeError, NameError):  # a type msgspec cannot decode is never decoded
            continue
        built += 1
    for resource in _subclasses(GenericGlobalResource) | _subclasses(GenericNamespacedResource):
        decoders.decode_list(b'{"items":[]}', resource)  # makes and builds its list type
        built += 1
    return built


def _subclasses(cls: type) -> set[type]:
    """Every class below `cls`, at any depth."""
    found: set[type] = set()
    todo = [cls]
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def load_config(kubeconfig: str | None = None, *,
                service_account_dir: str = SERVICE_ACCOUNT_DIR,
                env: Mapping[str, str] | None = None) -> SingleConfig:
    """--kubeconfig if given, else the in-cluster service account, else $KUBECONFIG.

    Never ~/.kube/config: an agent on a node must not silently act as whoever logged in last.
    """
    env = os.environ if env is None else env
    if kubeconfig:
        return _from_file(kubeconfig, "--kubeconfig")
    token = Path(service_account_dir, "token")
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    if host and token.is_file():
        # lightkube's from_service_account does the same, but reads os.environ itself.
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"  # IPv6
        namespace_file = Path(service_account_dir, "namespace")
        namespace = namespace_file.read_text().strip() if namespace_file.is_file() else None
        return KubeConfig.from_one(
            cluster=Cluster(server=f"https://{host}:{port}",
                            certificate_auth=str(Path(service_account_dir, "ca.crt"))),
            # token_file: re-read on 401, the kubelet rotates projected tokens.
            user=User(token=token.read_text().strip(), token_file=str(token)),
            namespace=namespace).get()  # type: ignore[return-value]  # from_one: one context
    if env.get("KUBECONFIG"):
        return _from_file(env["KUBECONFIG"], "$KUBECONFIG")
    raise KubeUnavailable(
        "no Kubernetes API configuration: not in a pod (KUBERNETES_SERVICE_HOST unset or no "
        f"token in {service_account_dir}) and no --kubeconfig",
        "run as the DaemonSet in deploy/ or pass --kubeconfig PATH (or disable the API sources)")


# A kubeconfig is a few KB (certificates inline make it tens); past this it is not one.
KUBECONFIG_MAX = 1 << 20


def _from_file(path: str, what: str) -> SingleConfig:
    try:
        info = os.stat(path)
    except OSError as e:
        raise KubeUnavailable(f"cannot use kubeconfig {path} ({what}): {e.strerror or e}",
                              "pass a readable kubeconfig with a current-context") from e
    if not stat.S_ISREG(info.st_mode) or info.st_size > KUBECONFIG_MAX:
        # A FIFO hung start-up in the YAML reader; /dev/zero would be read for ever.
        raise KubeUnavailable(f"cannot use kubeconfig {path} ({what}): not a regular file "
                              f"of at most {KUBECONFIG_MAX} bytes",
                              "pass a readable kubeconfig with a current-context")
    try:
        config = KubeConfig.from_file(path).get()
    except KeyError as e:  # lightkube indexes the YAML: a missing section is a bare KeyError
        raise KubeUnavailable(f"cannot use kubeconfig {path} ({what}): it has no {e} section",
                              "pass a kubeconfig with clusters, users, contexts and a "
                              "current-context (kubectl config view --minify --raw)") from e
    except (ConfigError, OSError, TypeError, ValueError) as e:
        raise KubeUnavailable(f"cannot use kubeconfig {path} ({what}): {e}",
                                "pass a readable kubeconfig with a current-context") from e
    if config is None or config.cluster is None or not config.cluster.server:
        raise KubeUnavailable(f"kubeconfig {path} ({what}) names no cluster server",
                                "set clusters[].cluster.server and current-context")
    return config


class KubeTransport(httpx.BaseTransport):
    """Wraps the real HTTP transport for the three additions described in the module doc."""

    def __init__(self, inner: httpx.BaseTransport, watch_read_timeout: float, *,
                 header_timeout: float = 10.0, line_timeout: float = LINE_TIMEOUT) -> None:
        self._inner = inner
        self._watch_read_timeout = watch_read_timeout
        self._header_timeout = header_timeout
        self._line_timeout = line_timeout
        self._list_pages = 0  # pages of the list in progress (one list at a time per client)
        self._lock = threading.Lock()
        self._watch_streams: weakref.WeakSet[Any] = weakref.WeakSet()
        self._watch_responses: weakref.WeakSet[Any] = weakref.WeakSet()
        self._aborted = False
        # Called (in the requesting thread) with the HTTP status of each watch request: lets a
        # source say "up again" when a re-watch connects, before any event arrives.
        self.on_watch_response: Callable[[int], None] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._aborted:
            raise httpx.ConnectError("client stopped", request=request)
        is_watch = request.url.params.get("watch") == "true"
        timeout = dict(request.extensions.get("timeout") or {})
        request.extensions["timeout"] = timeout
        if is_watch:
            if "allowWatchBookmarks" not in request.url.params:
                request.url = request.url.copy_add_param("allowWatchBookmarks", "true")
            # The headers come at once from a live server; only the stream may be quiet.
            timeout["read"] = self._header_timeout
            self._release_old_watches()
        else:
            self._count_page(request)
        response = self._inner.handle_request(request)
        if is_watch:
            # httpcore reads this same dict again when the body is first read: from here on
            # each read may wait as long as a quiet watch lasts, no longer.
            timeout["read"] = self._watch_read_timeout
            response.stream = _BoundedStream(response.stream, MAX_LINE_BYTES,
                                             self._line_timeout)
        else:
            response.stream = _BoundedStream(response.stream, MAX_PAGE_BYTES, None)
        if is_watch:
            self._watch_responses.add(response)
            stream = response.extensions.get("network_stream")
            if stream is not None:
                with self._lock:
                    self._watch_streams.add(stream)
                if self._aborted:  # stop() raced with this request: do not block on it
                    self.abort_watches()
            if self.on_watch_response is not None:
                self.on_watch_response(response.status_code)
        return response

    def _count_page(self, request: httpx.Request) -> None:
        if request.method != "GET":
            return
        self._list_pages = self._list_pages + 1 if "continue" in request.url.params else 1
        if self._list_pages > MAX_LIST_PAGES:
            raise AnswerTooLarge(f"list of {request.url.path} still not done after "
                                 f"{MAX_LIST_PAGES} pages of {LIST_CHUNK} (a continue token "
                                 "that never ends)")

    def _release_old_watches(self) -> None:
        """Close earlier watch responses before a new watch starts (one watch per client).

        lightkube leaves a watch response open when it raises out of it (an ERROR event such
        as 410): unclosed, its pooled connection would stay checked out forever, and after
        enough relists the pool would run dry.
        """
        for old in list(self._watch_responses):
            try:
                old.close()
            except Exception:  # noqa: BLE001 - a broken stream is exactly what we discard
                pass
            self._watch_responses.discard(old)

    def abort_watches(self) -> None:
        """Wake any thread blocked reading a watch: it sees a closed connection and returns.
        Later requests fail at once: this is for stopping."""
        with self._lock:
            self._aborted = True
            streams = list(self._watch_streams)
        for stream in streams:
            sock = stream.get_extra_info("socket")
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: nothing to wake

    def close(self) -> None:
        self._inner.close()


class _BoundedStream(httpx.SyncByteStream):
    """A response body that refuses to grow past `max_bytes` per line (watch: one event per
    line) or in all (`line_timeout` None: a list page), and, for a watch, a line that began
    and did not end within `line_timeout` seconds."""

    def __init__(self, inner: Any, max_bytes: int, line_timeout: float | None) -> None:
        self._inner = inner
        self._max = max_bytes
        self._line_timeout = line_timeout

    def __iter__(self) -> Iterator[bytes]:
        pending = 0  # bytes since the last newline (watch) or in all (list)
        began: float | None = None  # when the unfinished line's first byte came
        for chunk in self._inner:
            if self._line_timeout is None:
                pending += len(chunk)
                if pending > self._max:
                    raise AnswerTooLarge(f"list page larger than {self._max} bytes")
                yield chunk
                continue
            first, last = chunk.find(b"\n"), chunk.rfind(b"\n")
            if (pending + len(chunk) if first < 0 else pending + first) > self._max:
                raise AnswerTooLarge(f"watch event line longer than {self._max} bytes")
            now = time.monotonic()
            if first < 0:
                pending += len(chunk)
                began = now if began is None else began
            else:
                pending = len(chunk) - last - 1
                began = now if pending else None
            if began is not None and now - began > self._line_timeout:
                raise WatchStalled(f"a watch event line took more than {self._line_timeout:.0f}"
                                   " s to arrive (trickling or stalled mid-event)")
            yield chunk

    def close(self) -> None:
        self._inner.close()


def make_client(config: SingleConfig, *, request_timeout: float = 10.0,
                watch_read_timeout: float = 330.0,
                line_timeout: float = LINE_TIMEOUT) -> tuple[lightkube.Client, KubeTransport]:
    """A lightkube client for `config` plus the transport that can abort its watches."""
    if config.user is None:
        # lightkube asserts a user exists; an anonymous kubeconfig is legal, give it one.
        config = SingleConfig(context_name=config.context_name, context=config.context,
                              cluster=config.cluster, user=User(), fname=config.fname)
    assert config.user is not None  # given one above
    verify = verify_cluster(config.cluster, config.user, config.abs_file)
    transport = KubeTransport(httpx.HTTPTransport(verify=verify, retries=0), watch_read_timeout,
                              header_timeout=request_timeout, line_timeout=line_timeout)
    client = lightkube.Client(config, timeout=httpx.Timeout(request_timeout), trust_env=False,
                              transport=transport)
    return client, transport


def probe_api(config: SingleConfig, node: str, timeout: float = 5.0) -> str:
    """"" when the API server answers a list of this node's Node object within `timeout`
    (the verb the exporter's RBAC grants), else what went wrong, for a start-up error."""
    client, transport = make_client(config, request_timeout=timeout)
    try:
        list(client.list(RawNode, fields={"metadata.name": node}, chunk_size=1))
        return ""
    except httpx.HTTPError as e:
        return f"API server {config.cluster.server} unreachable: {e or type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - lightkube's ApiError and friends: report them
        status = getattr(e, "status", None)
        message = getattr(status, "message", None) or str(e) or type(e).__name__
        return f"API server {config.cluster.server} refused a list of nodes: {message}"
    finally:
        transport.close()


ALL_NAMESPACES = "*"  # lightkube's marker for /api/v1/pods
NODE_PODS_MAX = LIST_MAX_OBJECTS  # pods listed at most: the watch sources' own bound


def node_and_pods(config: SingleConfig, node: str, max_pods: int = NODE_PODS_MAX,
                  timeout: float = 10.0) -> tuple[dict[str, Any] | None, list[dict[str, Any]],
                                                  bool]:
    """One list of this node's Node and of the pods bound to it, as `check` and `plan` take
    them: (the Node or None, at most `max_pods` pods, whether there were more). Raises what
    the API answered (unreachable, 403), for the caller to say."""
    client, transport = make_client(config, request_timeout=timeout)
    try:
        nodes = [dict(o) for o in client.list(RawNode, fields={"metadata.name": node},
                                              chunk_size=1)]
        pods = [dict(o) for o in itertools.islice(
            client.list(RawPod, namespace=ALL_NAMESPACES, fields={"spec.nodeName": node},
                        chunk_size=500), max_pods + 1)]
    finally:
        transport.close()
    return (nodes[0] if nodes else None), pods[:max_pods], len(pods) > max_pods


def disruption_budgets(config: SingleConfig, max_objects: int = LIST_MAX_OBJECTS,
                       timeout: float = 10.0) -> tuple[list[dict[str, Any]], bool]:
    """One list of the cluster's PodDisruptionBudgets, as `plan` takes them: (at most
    `max_objects` of them, whether there were more). Raises what the API answered."""
    client, transport = make_client(config, request_timeout=timeout)
    try:
        items = [dict(o) for o in itertools.islice(
            client.list(RawPdb, namespace=ALL_NAMESPACES, chunk_size=500), max_objects + 1)]
    finally:
        transport.close()
    return items[:max_objects], len(items) > max_objects
