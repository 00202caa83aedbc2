#!/usr/bin/env python3
"""A reference client for node-resize-exporter's `GET /plan`, written the way an orchestrator
would use it before it takes CPUs or memory away from a node: ask, act in the order given,
verify, roll back. Python 3.9+ standard library only: copy it into your own code.

    python3 orchestrator.py --url https://NODE:9862 --token-file TOKEN --ca-file CA --memory -1Gi
    python3 orchestrator.py ... --cpu -1 --act     # on the node, as root: do the node's steps

The rules it keeps (README, "Integrating an orchestrator"):

1. Ask, and check the answer's schema id and major version before reading anything else.
2. Act only when `safe` is true. false (it would hurt) and null (it could not tell: something it
   depends on was not read) are both "no"; the reasons are in the answer.
3. Understand every action before doing the first: an action of an unknown kind stops the
   plan before anything has changed.
4. Right before acting, ask again with the generation the plan was answered at: a node that
   changed since (a CPU or DIMM came or went, pods moved) makes the plan stale; ask anew.
5. Do the actions in the order given, each a single write (memory offlines bounded in time: a
   block whose pages cannot move makes the kernel loop until the writer gets a signal), and
   verify each (read the file back). At the first failure undo what was done, newest first,
   with each action's own rollback, and stop.
6. Only then let the hypervisor take the devices the plan named (a DIMM by its id, a vCPU by
   its socket/core/thread), and wait until the node shows the capacity the plan said.
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
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

SCHEMA_ID = "node-resize-exporter/plan"
SCHEMA_MAJOR = 1  # this client understands 1.x answers
WRITE_DEADLINE = 30.0  # seconds a single sysfs write may take before the writer is killed


class PlanError(Exception):
    """The answer cannot be acted on: wrong schema, malformed, or refused by the server."""


class NotSafe(PlanError):
    """The plan says the change would hurt (safe false) or it could not tell (safe null)."""

    def __init__(self, answer: Dict[str, Any]):
        self.answer = answer
        safe = answer.get("safe")
        why = answer.get("harm") or answer.get("unknown") or answer.get("unjudged") or []
        super().__init__(f"plan is {'unknown' if safe is None else 'not safe'}: "
                         + "; ".join(str(w) for w in why))


class Stale(PlanError):
    """The node changed after the plan was answered (its generation moved on)."""


class StepFailed(Exception):
    """An action failed; what had been done was rolled back (see `rolled_back`)."""

    def __init__(self, action: "Action", cause: BaseException,
                 rolled_back: List["Action"], rollback_errors: List[str]):
        self.action, self.cause = action, cause
        self.rolled_back, self.rollback_errors = rolled_back, rollback_errors
        super().__init__(f"step {action.index} ({action.describe()}) failed: {cause}; "
                         f"rolled back {len(rolled_back)} step(s)"
                         + (f", rollback errors: {rollback_errors}" if rollback_errors else ""))


# ---------------------------------------------------------------- the answer


@dataclass(frozen=True)
class Action:
    """One ordered, machine-readable step of a plan."""

    index: int
    kind: str  # "write", "cordon", "wait_capacity", "unplug_memory", "unplug_cpu", ...
    path: str = ""  # write: the file
    value: str = ""  # write: what to write
    expect: str = ""  # write: what the file reads afterwards ("" = value)
    rollback: Optional["Action"] = None
    raw: Dict[str, Any] = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        if self.kind == "write":
            return f"echo {self.value} > {self.path}"
        return f"{self.kind} {json.dumps({k: v for k, v in self.raw.items() if k != 'rollback'})}"


def _action(index: int, raw: Any) -> Action:
    if not isinstance(raw, dict) or not isinstance(raw.get("kind", raw.get("action")), str):
        raise PlanError(f"action {index} is not an object with a kind: {raw!r:.200}")
    kind = raw.get("kind", raw.get("action"))
    back = raw.get("rollback")
    rollback = _action(index, back) if isinstance(back, dict) else None
    path, value = raw.get("path", ""), raw.get("value", "")
    if kind == "write" and not (isinstance(path, str) and path.startswith("/sys/")
                                and isinstance(value, str)):
        raise PlanError(f"action {index}: a write outside /sys or without a value: {raw!r:.200}")
    return Action(index, kind, str(path), str(value), str(raw.get("expect", "") or ""),
                  rollback, raw)


def check_schema(answer: Any) -> Dict[str, Any]:
    """The answer, if this client understands it (schema id and major version)."""
    if not isinstance(answer, dict):
        raise PlanError("the answer is not a JSON object")
    schema, version = answer.get("schema"), str(answer.get("schema_version", ""))
    if schema != SCHEMA_ID:
        raise PlanError(f"schema {schema!r}, this client speaks {SCHEMA_ID!r}")
    major = version.split(".")[0]
    if not major.isdigit() or int(major) != SCHEMA_MAJOR:
        raise PlanError(f"schema version {version!r}, this client speaks {SCHEMA_MAJOR}.x")
    return answer


def actions(answer: Dict[str, Any]) -> List[Action]:
    raw = answer.get("actions")
    if not isinstance(raw, list):
        raise PlanError("the answer has no list of actions")
    return [_action(i, a) for i, a in enumerate(raw, 1)]


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

    def ask(self, cpu: Optional[str] = None, memory: Optional[str] = None,
            **extra: str) -> Dict[str, Any]:
        """The plan for a change (cpu "-1", memory "-1Gi"), schema checked."""
        query = {k: v for k, v in (("cpu", cpu), ("memory", memory), *extra.items())
                 if v is not None}
        status, body = self.get(query)
        if status != 200:
            raise PlanError(f"GET /plan {query}: HTTP {status}: {body.get('error', body)}")
        return check_schema(body)

    def is_current(self, answer: Dict[str, Any]) -> bool:
        """Is the node still as it was when `answer` was given? (the generation, echoed)"""
        query = dict(answer.get("question") or {})
        fresh = self.ask(**{k: str(v) for k, v in query.items()})
        return bool(fresh.get("generation") == answer.get("generation"))


# ---------------------------------------------------------------- acting


class Node(Protocol):
    """The node's side: sysfs writes and reads (locally, or through a guest agent)."""

    def write(self, path: str, value: str) -> None: ...  # OSError with the kernel's errno

    def read(self, path: str) -> str: ...


class Hypervisor(Protocol):
    """The hypervisor's side: remove a device once the node has let go of it."""

    def unplug(self, action: Action) -> None: ...


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


@dataclass
class Outcome:
    done: List[Action] = field(default_factory=list)
    unplugged: List[Action] = field(default_factory=list)


Handler = Callable[[Action], None]


class Executor:
    """Carries out a plan's actions in order, verifying each, rolling back on failure."""

    def __init__(self, node: Node, hypervisor: Optional[Hypervisor] = None,
                 handlers: Optional[Dict[str, Handler]] = None,
                 log: Callable[[str], None] = lambda line: None):
        self.node = node
        self.hypervisor = hypervisor
        self.log = log
        self.handlers: Dict[str, Handler] = {"write": self._write}
        if hypervisor is not None:
            self.handlers.update({"unplug_memory": hypervisor.unplug,
                                  "unplug_cpu": hypervisor.unplug})
        self.handlers.update(handlers or {})

    def _write(self, action: Action) -> None:
        self.node.write(action.path, action.value)
        seen = self.node.read(action.path)
        want = action.expect or action.value
        if seen != want:
            raise OSError(errno.EIO, f"reads {seen!r} after the write, not {want!r}",
                          action.path)

    def check(self, steps: Sequence[Action]) -> None:
        unknown = sorted({a.kind for a in steps if a.kind not in self.handlers})
        if unknown:
            raise PlanError(f"action kind(s) this client does not carry out: {unknown}; "
                            "nothing was done")

    def run(self, steps: Sequence[Action]) -> Outcome:
        self.check(steps)
        out = Outcome()
        for action in steps:
            self.log(f"step {action.index}: {action.describe()}")
            try:
                self.handlers[action.kind](action)
            except Exception as e:
                rolled, errors = self.roll_back(out.done)
                raise StepFailed(action, e, rolled, errors) from e
            out.done.append(action)
        return out

    def roll_back(self, done: Sequence[Action]) -> Tuple[List[Action], List[str]]:
        rolled, errors = [], []
        for action in reversed(done):
            if action.rollback is None:
                continue
            self.log(f"undo step {action.index}: {action.rollback.describe()}")
            try:
                self.handlers[action.rollback.kind](action.rollback)
                rolled.append(action)
            except Exception as e:  # keep undoing the rest; report every failure
                errors.append(f"step {action.index}: {e}")
        return rolled, errors


def carry_out(client: PlanClient, answer: Dict[str, Any], executor: Executor) -> Outcome:
    """The whole protocol for one answer: safe, understood, current, then the actions."""
    if answer.get("safe") is not True:
        raise NotSafe(answer)
    steps = actions(answer)
    executor.check(steps)
    if not client.is_current(answer):
        raise Stale(f"the node changed since generation {answer.get('generation')!r}: ask again")
    return executor.run(steps)


# ---------------------------------------------------------------- command line


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the node's exporter, e.g. https://NODE:9862")
    p.add_argument("--token-file", help="a bearer token (a projected, audience-bound one)")
    p.add_argument("--ca-file", help="the CA that signed the exporter's certificate")
    p.add_argument("--server-name", help="the name the certificate must carry, when it is not "
                                         "the host in --url")
    p.add_argument("--cpu", help="CPUs to take away, e.g. -1")
    p.add_argument("--memory", help="memory to take away, e.g. -1Gi")
    p.add_argument("--act", action="store_true",
                   help="carry out the node's steps here (root, on the node); the hypervisor's "
                        "steps are printed for you to do")
    args = p.parse_args(argv)
    if not (args.cpu or args.memory):
        p.error("give --cpu and/or --memory")
    client = PlanClient(args.url, args.token_file, args.ca_file, args.server_name)
    try:
        answer = client.ask(cpu=args.cpu, memory=args.memory)
        steps = actions(answer)
        for a in steps:
            print(f"{a.index}. {a.describe()}")
        if not args.act:
            return 0 if answer.get("safe") is True else 1

        def later(action: Action) -> None:
            print(f"now the hypervisor's turn: {action.describe()}")

        executor = Executor(LocalNode(), handlers={"unplug_memory": later, "unplug_cpu": later},
                            log=print)
        carry_out(client, answer, executor)
    except (PlanError, StepFailed, OSError) as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return 3 if isinstance(e, (NotSafe, Stale)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
