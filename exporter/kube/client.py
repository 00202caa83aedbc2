"""How the exporter talks to the API server: configuration, the lightkube client, resources.

lightkube does the HTTP, auth, TLS and list/watch decoding. Three things it does not do that a
node agent needs are added here, through lightkube's public `transport` hook rather than by
writing HTTP ourselves:
- ask watches for bookmarks (`allowWatchBookmarks=true`; lightkube has no parameter for it),
  so a quiet, field-selected watch still advances its resourceVersion and survives compaction;
- bound a watch's read time (lightkube reads forever), so a silently dead TCP connection is
  noticed after `watch_read_timeout` seconds instead of never;
- abort in-flight watches from another thread (socket shutdown), so a source stops promptly.
"""
from __future__ import annotations

import os
import socket
import threading
import weakref
from pathlib import Path
from typing import Callable, Mapping

import httpx2 as httpx
import lightkube
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import GenericGlobalResource, GenericNamespacedResource, \
    create_api_info


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


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
            namespace=namespace).get()
    if env.get("KUBECONFIG"):
        return _from_file(env["KUBECONFIG"], "$KUBECONFIG")
    raise KubeUnavailable(
        "no Kubernetes API configuration: not in a pod (KUBERNETES_SERVICE_HOST unset or no "
        f"token in {service_account_dir}) and no --kubeconfig",
        "run as the DaemonSet in deploy/ or pass --kubeconfig PATH (or disable the API sources)")


def _from_file(path: str, what: str) -> SingleConfig:
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

    def __init__(self, inner: httpx.BaseTransport, watch_read_timeout: float) -> None:
        self._inner = inner
        self._watch_read_timeout = watch_read_timeout
        self._lock = threading.Lock()
        self._watch_streams: weakref.WeakSet = weakref.WeakSet()
        self._watch_responses: weakref.WeakSet = weakref.WeakSet()
        self._aborted = False
        # Called (in the requesting thread) with the HTTP status of each watch request: lets a
        # source say "up again" when a re-watch connects, before any event arrives.
        self.on_watch_response: Callable[[int], None] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._aborted:
            raise httpx.ConnectError("client stopped", request=request)
        is_watch = request.url.params.get("watch") == "true"
        if is_watch:
            if "allowWatchBookmarks" not in request.url.params:
                request.url = request.url.copy_add_param("allowWatchBookmarks", "true")
            timeout = dict(request.extensions.get("timeout") or {})
            timeout["read"] = self._watch_read_timeout
            request.extensions["timeout"] = timeout
            self._release_old_watches()
        response = self._inner.handle_request(request)
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


def make_client(config: SingleConfig, *, request_timeout: float = 10.0,
                watch_read_timeout: float = 330.0) -> tuple[lightkube.Client, KubeTransport]:
    """A lightkube client for `config` plus the transport that can abort its watches."""
    if config.user is None:
        # lightkube asserts a user exists; an anonymous kubeconfig is legal, give it one.
        config = SingleConfig(context_name=config.context_name, context=config.context,
                              cluster=config.cluster, user=User(), fname=config.fname)
    verify = verify_cluster(config.cluster, config.user, config.abs_file)
    transport = KubeTransport(httpx.HTTPTransport(verify=verify, retries=0), watch_read_timeout)
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
