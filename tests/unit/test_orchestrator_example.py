"""examples/orchestrator.py, the reference client: ask over real HTTP, act in order, verify,
roll back. The node's side is an in-memory sysfs that can refuse a write (the kernel's EBUSY);
the lab (lab/scenarios_orchestrator.py) runs the same client against a real guest kernel."""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest

from examples import orchestrator as orch

BLOCK = "/sys/devices/system/memory/memory{}/state"


def offline(n: int, back: str = "online_movable") -> dict:
    return {"kind": "write", "path": BLOCK.format(n), "value": "offline",
            "rollback": {"kind": "write", "path": BLOCK.format(n), "value": back,
                         "expect": "online"}}


def answer(safe: object = True, generation: str = "g1", steps: list | None = None,
           **extra: object) -> dict:
    return {"schema": orch.SCHEMA_ID, "schema_version": "1.0", "node": "n1",
            "time": "2026-11-27T22:00:00Z", "generation": generation, "safe": safe,
            "question": {"memory": "-256Mi"}, "harm": [] if safe else ["a reason"],
            "actions": steps if steps is not None else [offline(40), offline(41)], **extra}


class Plans:
    """A loopback HTTP server answering GET /plan from a queue of (status, body, headers)."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, dict, dict]] = []
        self.asked: list[tuple[dict, dict]] = []
        plans = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                plans.asked.append((dict(parse_qsl(url.query)), dict(self.headers)))
                status, body, headers = plans.replies.pop(0) if plans.replies else (
                    500, {"error": "no reply queued"}, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def reply(self, body: dict, status: int = 200, **headers: str) -> None:
        self.replies.append((status, body, headers))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def plans():
    p = Plans()
    yield p
    p.close()


class MemNode:
    """sysfs in memory: memory block state files that go offline unless told to refuse."""

    def __init__(self, blocks: range, refuse: int | None = None):
        self.files = {BLOCK.format(n): "online" for n in blocks}
        self.refuse = refuse
        self.writes: list[tuple[str, str]] = []

    def write(self, path: str, value: str) -> None:
        self.writes.append((path, value))
        if path not in self.files:
            raise OSError(errno.ENOENT, "no such file", path)
        if value == "offline" and self.refuse is not None and path == BLOCK.format(self.refuse):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), path)
        self.files[path] = "offline" if value == "offline" else "online"

    def read(self, path: str) -> str:
        return self.files[path]


def test_a_safe_current_plan_is_carried_out_in_order_and_verified(plans):
    plans.reply(answer())  # the plan
    plans.reply(answer())  # asked again before acting: the same generation
    client = orch.PlanClient(plans.url)
    node = MemNode(range(40, 42))
    got = client.ask(memory="-256Mi")
    out = orch.carry_out(client, got, orch.Executor(node))
    assert node.writes == [(BLOCK.format(40), "offline"), (BLOCK.format(41), "offline")]
    assert [a.index for a in out.done] == [1, 2]
    assert set(node.files.values()) == {"offline"}
    assert plans.asked[0][0] == {"memory": "-256Mi"}


def test_a_refused_step_rolls_back_what_was_done_newest_first(plans):
    plans.reply(answer(steps=[offline(40), offline(41), offline(42)]))
    plans.reply(answer())
    client = orch.PlanClient(plans.url)
    node = MemNode(range(40, 43), refuse=42)
    with pytest.raises(orch.StepFailed) as failed:
        orch.carry_out(client, client.ask(memory="-256Mi"), orch.Executor(node))
    assert failed.value.action.index == 3
    assert isinstance(failed.value.cause, OSError) and failed.value.cause.errno == errno.EBUSY
    assert [a.index for a in failed.value.rolled_back] == [2, 1]
    assert node.writes[3:] == [(BLOCK.format(41), "online_movable"),
                               (BLOCK.format(40), "online_movable")]
    assert set(node.files.values()) == {"online"}


def test_a_write_the_file_does_not_show_is_a_failure_and_rolled_back(plans):
    class Sticky(MemNode):
        def write(self, path: str, value: str) -> None:
            super().write(path, value)
            if path == BLOCK.format(41):
                self.files[path] = "online"  # the kernel said yes, the file says otherwise

    plans.reply(answer())
    plans.reply(answer())
    client = orch.PlanClient(plans.url)
    node = Sticky(range(40, 42))
    with pytest.raises(orch.StepFailed, match="reads 'online' after the write"):
        orch.carry_out(client, client.ask(memory="-256Mi"), orch.Executor(node))
    assert node.files[BLOCK.format(40)] == "online"


@pytest.mark.parametrize("safe", [False, None])
def test_not_safe_or_unknown_is_never_acted_on(plans, safe):
    plans.reply(answer(safe=safe))
    client = orch.PlanClient(plans.url)
    node = MemNode(range(40, 42))
    with pytest.raises(orch.NotSafe, match="unknown" if safe is None else "not safe"):
        orch.carry_out(client, client.ask(memory="-256Mi"), orch.Executor(node))
    assert node.writes == [] and len(plans.asked) == 1


def test_a_plan_answered_before_the_node_changed_is_stale_and_nothing_is_done(plans):
    plans.reply(answer(generation="g1"))
    plans.reply(answer(generation="g2"))  # a DIMM came in between
    client = orch.PlanClient(plans.url)
    node = MemNode(range(40, 42))
    with pytest.raises(orch.Stale, match="g1"):
        orch.carry_out(client, client.ask(memory="-256Mi"), orch.Executor(node))
    assert node.writes == []


def test_an_action_of_unknown_kind_stops_the_plan_before_anything_changes(plans):
    plans.reply(answer(steps=[offline(40), {"kind": "reboot_the_node"}]))
    client = orch.PlanClient(plans.url)
    node = MemNode(range(40, 41))
    with pytest.raises(orch.PlanError, match="reboot_the_node"):
        orch.carry_out(client, client.ask(memory="-256Mi"), orch.Executor(node))
    assert node.writes == [] and len(plans.asked) == 1


@pytest.mark.parametrize("bad,match", [
    ({"schema": "someone-else/plan", "schema_version": "1.0"}, "schema 'someone-else/plan'"),
    ({"schema": orch.SCHEMA_ID, "schema_version": "2.0"}, "version '2.0'"),
    ({"schema": orch.SCHEMA_ID}, "version ''"),
])
def test_an_answer_in_another_schema_is_refused(plans, bad, match):
    plans.reply(bad)
    with pytest.raises(orch.PlanError, match=match):
        orch.PlanClient(plans.url).ask(cpu="-1")


def test_a_write_outside_sys_is_refused_as_malformed():
    with pytest.raises(orch.PlanError, match="outside /sys"):
        orch.actions(answer(steps=[{"kind": "write", "path": "/etc/passwd", "value": "x"}]))


def test_429_is_waited_out_with_retry_after_and_the_token_is_read_each_time(plans, tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    plans.reply({"error": "busy"}, 429, **{"Retry-After": "1"})
    plans.reply(answer())
    client = orch.PlanClient(plans.url, token_file=str(token))
    t0 = time.monotonic()
    client.ask(memory="-256Mi")
    assert time.monotonic() - t0 >= 0.9
    token.write_text("rotated\n")
    plans.reply(answer())
    client.ask(memory="-256Mi")
    assert [h.get("Authorization") for _, h in plans.asked] == [
        "Bearer first", "Bearer first", "Bearer rotated"]


def test_a_400_is_a_plan_error_with_the_servers_reason(plans):
    plans.reply({"error": "cpu '1.5': a whole number of CPUs"}, 400)
    with pytest.raises(orch.PlanError, match="HTTP 400: cpu '1.5'"):
        orch.PlanClient(plans.url).ask(cpu="1.5")


# ---------------------------------------------------------------- LocalNode: real files


def test_local_node_writes_once_and_reports_the_errno(tmp_path):
    f = tmp_path / "state"
    f.write_text("online\n")
    node = orch.LocalNode()
    node.write(str(f), "offline")
    assert node.read(str(f)) == "offline"
    with pytest.raises(OSError) as e:
        node.write(str(tmp_path / "missing" / "state"), "offline")
    assert e.value.errno == errno.ENOENT


def test_local_node_kills_a_write_that_never_returns(tmp_path):
    """A write that blocks (here: a FIFO nobody reads, as an offline whose pages cannot move
    loops in the kernel) is ended by a signal at the deadline, not waited for."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    node = orch.LocalNode(deadline=0.5)
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        node.write(str(fifo), "offline")
    assert e.value.errno == errno.ETIMEDOUT
    assert time.monotonic() - t0 < 5
