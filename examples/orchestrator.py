#!/usr/bin/env python3
"""A reference client for node-resize-exporter's `GET /plan` (docs/plan.schema.json), written
the way an orchestrator would use it before it takes CPUs or memory away from a node: ask, act
in the order given, verify, roll back. Python 3.9+ standard library only: copy it.

    python3 orchestrator.py --url https://NODE:9862 --token-file TOKEN --ca-file CA --memory -1Gi
    python3 orchestrator.py ... --cpu -1 --act     # on the node, as root: do the node's steps

The rules it keeps (README, "Integrating an orchestrator"):

1. Check the answer's `schema` and `schema_version` before reading anything else.
2. Act only when `verdict` is "safe". "harmful" (it would hurt, or cannot be done) and
   "unknown" (something it depends on was not read) are both "no"; `harm`/`unknown` say why.
3. Understand every action before doing the first: an action this client cannot carry out
   stops the plan before anything has changed.
4. Right before acting, ask again echoing the answer's `generation`: `stale` true means the
   node changed since (a CPU or DIMM came or went, pods moved): ask anew.
5. Do the actions in `order`, each write a single write(2) bounded in time (an offline whose
   pages cannot move loops in the kernel until the writer gets a signal), and read each file
   back. At the first failure do the rollback writes of the writes done, newest first (those
   the hypervisor has not yet taken away), then uncordon, and stop.
6. The hypervisor's steps come where the plan puts them: after the node has let go of what
   they remove (a DIMM by its slot, a vCPU by its socket/die/core/thread).
"""
from __future__ import annotations

import argparse
import errno
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

SCHEMA_ID = "urn:node-resize-exporter:plan"
SCHEMA_VERSIONS = (2,)  # the versions this client understands (a new version: keys changed)
WRITE_DEADLINE = 30.0  # seconds a single sysfs write may take before the writer is killed
ONLINE_VALUES = ("online", "online_movable", "online_kernel")  # all read back as "online"


class PlanError(Exception):
    """The answer cannot be acted on: another schema, malformed, refused by the server."""


class NotSafe(PlanError):
    """The verdict is "harmful" or "unknown"."""

    def __init__(self, answer: "Answer"):
        self.answer = answer
        body = answer.body
        why = body.get("harm") if body.get("verdict") == "harmful" else body.get("unknown")
        super().__init__(f"verdict {body.get('verdict')!r}: "
                         + "; ".join(str(w) for w in (why or [])))


class Stale(PlanError):
    """The node changed after the plan was answered (its generation moved on)."""


class StepFailed(Exception):
    """An action failed; the writes done were rolled back (see `rolled_back`)."""

    def __init__(self, action: "Action", cause: BaseException, rolled_back: List["Action"],
                 rollback_errors: List[str]):
        self.action, self.cause = action, cause
        self.rolled_back, self.rollback_errors = rolled_back, rollback_errors
        super().__init__(f"step {action.order} ({action.describe()}) failed: {cause}; "
                         f"rolled back {len(rolled_back)} write(s)"
                         + (f", rollback errors: {rollback_errors}" if rollback_errors else ""))


# ---------------------------------------------------------------- the answer


@dataclass(frozen=True)
class Action:
    """One step of `actions`, in `order`."""

    order: int
    do: str  # cordon, evict, write, hypervisor_remove, ... (docs/plan.schema.json)
    path: str = ""
    value: str = ""
    rollback: Tuple["Action", ...] = ()  # the writes that undo this one
    raw: Dict[str, Any] = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        if self.do == "write":
            return f"echo {self.value} > {self.path}"
        rest = {k: v for k, v in self.raw.items() if k not in ("order", "do", "rollback")}
        return f"{self.do} {json.dumps(rest, sort_keys=True)}" if rest else self.do


def _write(order: int, raw: Any) -> Action:
    if not (isinstance(raw, dict) and raw.get("do") == "write"
            and isinstance(raw.get("path"), str) and raw["path"].startswith("/sys/")
            and ".." not in raw["path"] and isinstance(raw.get("value"), str)):
        raise PlanError(f"action {order}: a write outside /sys or without a value: {raw!r:.200}")
    return Action(order, "write", raw["path"], raw["value"], raw=raw)


def _action(raw: Any) -> Action:
    if not isinstance(raw, dict) or not isinstance(raw.get("do"), str) \
            or not isinstance(raw.get("order"), int):
        raise PlanError(f"an action without order and do: {raw!r:.200}")
    order = raw["order"]
    back = raw.get("rollback", [])
    if not isinstance(back, list):
        raise PlanError(f"action {order}: rollback is not a list")
    rollback = tuple(_write(order, b) for b in back)
    if raw["do"] == "write":
        return Action(order, "write", _write(order, raw).path, raw["value"], rollback, raw)
    if raw["do"] == "delete" and not (isinstance(raw.get("path"), str)
                                      and raw["path"].startswith("/var/lib/kubelet/")):
        raise PlanError(f"action {order}: a delete outside /var/lib/kubelet: {raw!r:.200}")
    return Action(order, raw["do"], str(raw.get("path", "")), str(raw.get("value", "")),
                  rollback, raw)


def actions(body: Dict[str, Any]) -> List[Action]:
    raw = body.get("actions")
    if not isinstance(raw, list):
        raise PlanError("the answer has no list of actions")
    steps = [_action(a) for a in raw]
    if [a.order for a in steps] != list(range(1, len(steps) + 1)):
        raise PlanError(f"actions not in order 1..{len(steps)}: {[a.order for a in steps]}")
    return steps


def check_schema(body: Any) -> Dict[str, Any]:
    """The answer, if this client understands it (schema id and version)."""
    if not isinstance(body, dict):
        raise PlanError("the answer is not a JSON object")
    if body.get("schema") != SCHEMA_ID:
        raise PlanError(f"schema {body.get('schema')!r}, this client speaks {SCHEMA_ID!r}")
    if body.get("schema_version") not in SCHEMA_VERSIONS:
        raise PlanError(f"schema_version {body.get('schema_version')!r}, this client speaks "
                        f"{', '.join(map(str, SCHEMA_VERSIONS))}")
    return body


@dataclass(frozen=True)
class Answer:
    """One answer and the question it answers (to ask again with its generation)."""

    body: Dict[str, Any]
    question: Dict[str, str]

    @property
    def generation(self) -> str:
        return str(self.body.get("generation", ""))

    @property
    def safe(self) -> bool:
        return self.body.get("verdict") == "safe" and self.body.get("safe") is True

    def actions(self) -> List[Action]:
        return actions(self.body)


# ---------------------------------------------------------------- asking


class PlanClient:
    """GET /plan on one node's exporter, with a bearer token, over TLS that is verified.

    The token goes only to a server whose certificate a trusted CA signed (`ca_file`) for the
    name checked: the host in `url` (a SAN of the node's own certificate: its name, or an
    address given to --web.tls.extra-san), or `server_name` when every node serves one
    certificate for one name (docs/security.md: node-resize-exporter.node-resize-exporter.svc).
    """

    def __init__(self, url: str, token_file: Optional[str] = None, ca_file: Optional[str] = None,
                 server_name: Optional[str] = None, timeout: float = 30.0, tries: int = 5):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PlanError(f"--url {url!r}: http(s)://HOST:PORT")
        if token_file and parts.scheme != "https":
            raise PlanError("a bearer token is sent over https only")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.token_file = token_file
        self.server_name = server_name or self.host
        self.timeout = timeout
        self.tries = tries
        self.context: Optional[ssl.SSLContext] = None
        if self.scheme == "https":
            self.context = ssl.create_default_context(cafile=ca_file)  # verifies name and CA

    def _headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_file:
            # Re-read each time: the kubelet rotates a projected service account token.
            with open(self.token_file) as f:
                headers["Authorization"] = f"Bearer {f.read().strip()}"
        return headers

    def _connect(self) -> http.client.HTTPConnection:
        if self.context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            tls = self.context.wrap_socket(sock, server_hostname=self.server_name)
        except BaseException:
            sock.close()
            raise
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                           context=self.context)
        conn.sock = tls  # verified above, for server_name: the token is sent on this socket
        return conn

    def get(self, query: Dict[str, str]) -> Tuple[int, Dict[str, Any]]:
        """(status, JSON body) of GET /plan?query; waits out 429/503 (Retry-After)."""
        path = f"/plan?{urllib.parse.urlencode(query)}"
        for attempt in range(self.tries):
            try:
                conn = self._connect()
            except (OSError, ssl.SSLError) as e:
                raise PlanError(f"{self.scheme}://{self.host}:{self.port}: {e}") from e
            try:
                conn.request("GET", path, headers=self._headers())
                r = conn.getresponse()
                status, body, retry = r.status, r.read(), r.getheader("Retry-After")
            finally:
                conn.close()
            if status in (429, 503) and attempt + 1 < self.tries:
                time.sleep(min(float(retry or 1), 10.0))
                continue
            try:
                return status, json.loads(body)
            except ValueError:
                return status, {"error": body.decode(errors="replace")[:500]}
        raise PlanError(f"GET {path}: still busy after {self.tries} tries")

    def ask(self, cpu: Optional[str] = None, memory: Optional[str] = None) -> Answer:
        """The plan for a change (cpu "-1", "-1core"; memory "-1Gi"), schema checked."""
        question = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
        status, body = self.get(question)
        if status != 200:  # 400: the question is malformed, and the body says the fix
            raise PlanError(f"GET /plan {question}: HTTP {status}: {body.get('error', body)}")
        return Answer(check_schema(body), question)

    def is_current(self, answer: Answer) -> bool:
        """Has the node stayed as it was when `answer` was given? (its generation, echoed)"""
        status, body = self.get({**answer.question, "generation": answer.generation})
        if status != 200:
            raise PlanError(f"GET /plan with generation: HTTP {status}: "
                            f"{body.get('error', body)}")
        stale = check_schema(body).get("stale")
        if not isinstance(stale, bool):
            raise PlanError(f"the echoed generation was not judged (stale {stale!r})")
        return not stale


# ---------------------------------------------------------------- acting


class Node(Protocol):
    """The node's side: sysfs writes and reads (locally, or through a guest agent)."""

    def write(self, path: str, value: str) -> None: ...  # OSError with the kernel's errno

    def read(self, path: str) -> str: ...


Handler = Callable[[Action], None]


class LocalNode:
    """This machine's sysfs, as root. Each write is one write(2) in a child process that is
    killed after `deadline` seconds: an offline whose pages cannot migrate loops in the kernel
    until its writer gets a signal, and must not hang the orchestrator."""

    def __init__(self, deadline: float = WRITE_DEADLINE):
        self.deadline = deadline

    def write(self, path: str, value: str) -> None:
        pid = os.fork()
        if pid == 0:  # the child: one unbuffered write, its errno as the exit status
            code = 0
            try:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, value.encode())
                finally:
                    os.close(fd)
            except OSError as e:
                code = e.errno or errno.EIO
            os._exit(code)
        end = time.monotonic() + self.deadline
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                if code:
                    raise OSError(code, os.strerror(code), path)
                return
            if time.monotonic() > end:
                os.kill(pid, signal.SIGKILL)  # the kernel stops the offline on a fatal signal
                os.waitpid(pid, 0)
                raise OSError(errno.ETIMEDOUT, f"no answer in {self.deadline:.0f}s", path)
            time.sleep(0.01)

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read().strip()

    def handlers(self) -> Dict[str, Handler]:
        """The kubelet's steps, on a systemd node."""
        def systemctl(verb: str) -> Handler:
            return lambda a: subprocess.run(["systemctl", verb, "kubelet"], check=True,
                                            timeout=120)

        def delete(a: Action) -> None:
            try:
                os.unlink(a.path)
            except FileNotFoundError:
                pass

        return {"stop_kubelet": systemctl("stop"), "start_kubelet": systemctl("start"),
                "restart_kubelet": systemctl("restart"), "delete": delete}


class KubeApi:
    """The Kubernetes side (cordon, evict, wait_for_capacity, uncordon) with the pod's own
    service account: `patch` on nodes, `create` on pods/eviction, `get` on nodes."""

    SA = "/var/run/secrets/kubernetes.io/serviceaccount"

    def __init__(self, node: str, url: str = "", token_file: str = SA + "/token",
                 ca_file: str = SA + "/ca.crt", timeout: float = 30.0):
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        self.url = url or f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
        self.node, self.token_file, self.timeout = node, token_file, timeout
        self.context = ssl.create_default_context(cafile=ca_file)

    def call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
             content_type: str = "application/json") -> Dict[str, Any]:
        parts = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port or 443,
                                           timeout=self.timeout, context=self.context)
        with open(self.token_file) as f:
            headers = {"Authorization": f"Bearer {f.read().strip()}",
                       "Content-Type": content_type, "Accept": "application/json"}
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None, headers)
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        if r.status >= 300:  # 429 on an eviction: a PodDisruptionBudget says not now
            raise OSError(errno.EIO, f"{method} {path}: HTTP {r.status}: {data[:300]!r}")
        return dict(json.loads(data or b"{}"))

    def cordon(self, unschedulable: bool) -> None:
        self.call("PATCH", f"/api/v1/nodes/{self.node}", {"spec": {"unschedulable":
                                                                  unschedulable}},
                  "application/merge-patch+json")

    def evict(self, action: Action) -> None:
        for pod in action.raw.get("pods", []):
            ns, name = pod["namespace"], pod["name"]
            self.call("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction",
                      {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": name, "namespace": ns}})

    def wait_for_capacity(self, action: Action) -> None:
        want = (int(action.raw["cpu"]), int(action.raw["memory_bytes"]))
        end = time.monotonic() + float(action.raw.get("timeout_seconds", 300))
        seen: Tuple[int, int] = (0, 0)
        while time.monotonic() < end:
            cap = self.call("GET", f"/api/v1/nodes/{self.node}").get("status", {}).get(
                "capacity", {})
            seen = (quantity(cap.get("cpu", "0")), quantity(cap.get("memory", "0")))
            if seen == want:
                return
            time.sleep(2)
        raise OSError(errno.ETIMEDOUT, f"Node capacity {seen}, not {want}")

    def handlers(self) -> Dict[str, Handler]:
        return {"cordon": lambda a: self.cordon(True), "uncordon": lambda a: self.cordon(False),
                "evict": self.evict, "wait_for_capacity": self.wait_for_capacity}


_SUFFIX = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10 ** 3,
           "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "": 1}


def quantity(text: str) -> int:
    """A Kubernetes quantity as the kubelet writes capacity ("4", "16393832Ki")."""
    num = text.rstrip("KMGTik")
    return int(num) * _SUFFIX[text[len(num):]]


@dataclass
class Outcome:
    done: List[Action] = field(default_factory=list)


class Executor:
    """Carries out a plan's actions in order, verifying each write, rolling back on failure.

    `handlers` carry out what is not a write: hypervisor_remove/hypervisor_add (yours),
    cordon/evict/wait_for_capacity/uncordon (KubeApi), the kubelet's steps and delete
    (LocalNode.handlers()). An action with no handler stops the plan before it starts."""

    def __init__(self, node: Node, handlers: Optional[Dict[str, Handler]] = None,
                 log: Callable[[str], None] = lambda line: None):
        self.node = node
        self.log = log
        self.handlers: Dict[str, Handler] = {"write": self._write, **(handlers or {})}

    def _write(self, action: Action) -> None:
        self.node.write(action.path, action.value)
        seen = self.node.read(action.path)
        want = "online" if action.value in ONLINE_VALUES else action.value
        if seen != want:
            raise OSError(errno.EIO, f"reads {seen!r} after the write, not {want!r}",
                          action.path)

    def check(self, steps: Sequence[Action]) -> None:
        unknown = sorted({a.do for a in steps if a.do not in self.handlers})
        if unknown:
            raise PlanError(f"actions this client does not carry out: {unknown}; "
                            "nothing was done")

    def run(self, steps: Sequence[Action]) -> Outcome:
        self.check(steps)
        out = Outcome()
        committed = 0  # writes before a hypervisor step that succeeded are not undone
        for action in steps:
            self.log(f"step {action.order}: {action.describe()}")
            try:
                self.handlers[action.do](action)
            except Exception as e:
                rolled, errors = self.roll_back(out.done[committed:])
                if any(a.do == "cordon" for a in out.done) and "uncordon" in self.handlers:
                    try:
                        self.handlers["uncordon"](Action(0, "uncordon"))
                    except Exception as u:
                        errors.append(f"uncordon: {u}")
                raise StepFailed(action, e, rolled, errors) from e
            out.done.append(action)
            if action.do in ("hypervisor_remove", "hypervisor_add"):
                committed = len(out.done)
        return out

    def roll_back(self, done: Sequence[Action]) -> Tuple[List[Action], List[str]]:
        rolled: List[Action] = []
        errors: List[str] = []
        for action in reversed(done):
            for undo in action.rollback:
                self.log(f"undo step {action.order}: {undo.describe()}")
                try:
                    self._write(undo)
                    rolled.append(undo)
                except Exception as e:  # keep undoing the rest; report every failure
                    errors.append(f"step {action.order}: {e}")
        return rolled, errors


def carry_out(client: PlanClient, answer: Answer, executor: Executor) -> Outcome:
    """The whole protocol for one answer: safe, understood, current, then the actions."""
    if not answer.safe:
        raise NotSafe(answer)
    steps = answer.actions()
    executor.check(steps)
    if not client.is_current(answer):
        raise Stale(f"the node changed since generation {answer.generation}: ask again")
    return executor.run(steps)


# ---------------------------------------------------------------- command line


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--url", required=True, help="the node's exporter, e.g. https://NODE:9862")
    p.add_argument("--token-file", help="a bearer token (a projected, audience-bound one)")
    p.add_argument("--ca-file", help="the CA that signed the exporter's certificate")
    p.add_argument("--server-name", help="the name the certificate must carry, when it is not "
                                         "the host in --url")
    p.add_argument("--cpu", help="CPUs to take away, e.g. -1 or -1core")
    p.add_argument("--memory", help="memory to take away, e.g. -1Gi")
    p.add_argument("--act", action="store_true",
                   help="carry out the plan here (root, on the node, in a pod whose service "
                        "account may cordon and evict); the hypervisor's steps are printed "
                        "and waited for (Enter)")
    args = p.parse_args(argv)
    if not (args.cpu or args.memory):
        p.error("give --cpu and/or --memory")
    try:
        client = PlanClient(args.url, args.token_file, args.ca_file, args.server_name)
        answer = client.ask(cpu=args.cpu, memory=args.memory)
        print(f"verdict {answer.body.get('verdict')} (generation {answer.generation})")
        for a in answer.actions():
            print(f"{a.order}. {a.describe()}")
        if not args.act:
            return 0 if answer.safe else 1

        def by_hand(action: Action) -> None:
            input(f"now the hypervisor: {action.describe()}; Enter when done ")

        node = LocalNode()
        handlers = {**node.handlers(), "hypervisor_remove": by_hand, "hypervisor_add": by_hand}
        if answer.body.get("node"):
            handlers.update(KubeApi(str(answer.body["node"])).handlers())
        carry_out(client, answer, Executor(node, handlers, log=print))
    except (PlanError, StepFailed, OSError) as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return 3 if isinstance(e, (NotSafe, Stale)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
