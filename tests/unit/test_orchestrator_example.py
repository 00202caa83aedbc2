"""examples/orchestrator.py, the reference client: ask over real HTTP (and verified TLS), act
in order, verify, roll back. The answers it is served are the planner's own, framed as GET
/plan frames them (exporter/plan/answer.py) and valid against docs/plan.schema.json; the
node's side is an in-memory sysfs that can refuse a write (the kernel's EBUSY). The lab
(lab/scenarios_orchestrator.py) runs the same client against a real guest kernel and QEMU."""
from __future__ import annotations

import datetime
import errno
import ipaddress
import json
import os
import ssl
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import jsonschema
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from examples import orchestrator as orch
from exporter.plan.answer import answer as frame
from exporter.plan.model import Change
from exporter.sources.kernel.cpu_topology import CpuPlace
from testkit.forecast import T, forecaster, node, pod, snapshot
from tests.unit.test_plan import BLOCK, block, hardware, inputs

SCHEMA = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
MEM = "/sys/devices/system/memory/memory{}/state"
CPU = "/sys/devices/system/cpu/cpu{}/online"


def real(change: Change, kube: bool = False, generation: str = "", **edits: object) -> dict:
    """The planner's answer for `change` on a host with a DIMM (memory40-43) and two cores of
    two threads (cpu0-3), with Kubernetes (a Node and a pod) or without, as JSON."""
    hw = hardware(*(block(n, lru=5) for n in range(40, 44)),
                  dimms={"PNP0C80:00": range(40, 44)}, hotpluggable=frozenset({1, 2, 3}))
    hw = replace(hw, cpu_places={c: CpuPlace(c, 0, 0, c // 2, c % 2,
                                             (c - c % 2, c - c % 2 + 1), 0, c)
                                 for c in range(4)})
    kw = {"forecast": forecaster(node(cpu="4", allocatable_cpu="4"), snapshot(4),
                                 [pod("a", {"cpu": "500m"})])} if kube else {}
    got = frame(change, inputs(hw, cpus=4, **kw), node="vm", now=T,
                asked_generation=generation).json()
    got.update(edits)
    VALIDATOR.validate(got)
    return got


MEMORY = Change(0, -4 * BLOCK)  # the DIMM, whole: 4 writes and a hypervisor_remove


def answer(harmful: bool = False, stale: bool | None = None, **edits: object) -> dict:
    got = real(MEMORY, generation="" if stale is None else "0" * 16, **edits)
    if stale is not None:
        got["stale"] = stale
    if harmful:
        got.update(verdict="harmful", safe=False, harm=["a reason"])
    return got


class Plans:
    """A loopback HTTP server answering GET /plan from a queue of (status, body, headers)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
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
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

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
    """sysfs in memory: block state and CPU online files, refusing what it is told to."""

    def __init__(self, refuse: str | None = None):
        self.files = {**{MEM.format(n): "online" for n in range(40, 44)},
                      **{CPU.format(c): "1" for c in range(1, 4)}}
        self.refuse = refuse
        self.writes: list[tuple[str, str]] = []

    def write(self, path: str, value: str) -> None:
        self.writes.append((path, value))
        if path not in self.files:
            raise OSError(errno.ENOENT, "no such file", path)
        if path == self.refuse and value in ("offline", "0"):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), path)
        self.files[path] = "online" if value.startswith("online") else value

    def read(self, path: str) -> str:
        return self.files[path]


class Hypervisor:
    def __init__(self, fail: bool = False):
        self.removed: list[dict] = []
        self.fail = fail

    def remove(self, action: orch.Action) -> None:
        if self.fail:
            raise RuntimeError("device_del: the guest did not eject it")
        self.removed.append(action.raw.get("device") or action.raw.get("cpu"))


def executor(node: MemNode, hv: Hypervisor | None = None, **handlers) -> orch.Executor:
    hv = hv or Hypervisor()
    return orch.Executor(node, {"hypervisor_remove": hv.remove, **handlers})


def test_a_safe_current_plan_is_carried_out_in_order_and_verified(plans):
    plans.reply(answer())  # the plan
    plans.reply(answer(stale=False))  # asked again with its generation: unchanged
    client = orch.PlanClient(plans.url)
    node, hv = MemNode(), Hypervisor()
    got = client.ask(memory="-512Mi")
    out = orch.carry_out(client, got, executor(node, hv))
    take = got.body["memory"]["take"]
    assert node.writes == [(MEM.format(n), "offline") for n in take]
    assert sorted(take) == [40, 41, 42, 43]
    assert [d["id"] for d in hv.removed] == ["PNP0C80:00"]
    assert [a.do for a in out.done] == ["write"] * 4 + ["hypervisor_remove"]
    assert plans.asked[0][0] == {"memory": "-512Mi"}
    assert plans.asked[1][0] == {"memory": "-512Mi", "generation": got.generation}


def test_a_refused_write_rolls_back_the_writes_done_newest_first(plans):
    plans.reply(answer())
    plans.reply(answer(stale=False))
    client = orch.PlanClient(plans.url)
    got = client.ask(memory="-512Mi")
    take = got.body["memory"]["take"]
    node, hv = MemNode(refuse=MEM.format(take[2])), Hypervisor()
    with pytest.raises(orch.StepFailed) as failed:
        orch.carry_out(client, got, executor(node, hv))
    assert failed.value.action.order == 3
    assert isinstance(failed.value.cause, OSError) and failed.value.cause.errno == errno.EBUSY
    assert node.writes[3:] == [(MEM.format(take[1]), "online_movable"),
                               (MEM.format(take[0]), "online_movable")]
    assert set(node.files.values()) == {"online", "1"} and hv.removed == []


def test_a_failed_hypervisor_step_puts_the_blocks_back(plans):
    plans.reply(answer())
    plans.reply(answer(stale=False))
    client = orch.PlanClient(plans.url)
    node = MemNode()
    with pytest.raises(orch.StepFailed, match="did not eject"):
        orch.carry_out(client, client.ask(memory="-512Mi"), executor(node, Hypervisor(True)))
    assert len(node.writes) == 8 and set(node.files.values()) == {"online", "1"}


def test_a_write_the_file_does_not_show_is_a_failure_and_rolled_back(plans):
    class Sticky(MemNode):
        def write(self, path: str, value: str) -> None:
            super().write(path, value)
            if len(self.writes) == 2:
                self.files[path] = "online"  # the kernel said yes, the file says otherwise

    plans.reply(answer())
    plans.reply(answer(stale=False))
    client = orch.PlanClient(plans.url)
    node = Sticky()
    with pytest.raises(orch.StepFailed, match="reads 'online' after the write"):
        orch.carry_out(client, client.ask(memory="-512Mi"), executor(node))
    assert set(node.files.values()) == {"online", "1"}


def test_with_kubernetes_a_failure_uncordons_after_the_rollback(plans):
    """cpu -1 on a Node: cordon, offline a CPU, hypervisor_remove, ..., uncordon; the offline
    refused: nothing to roll back, the Node uncordoned, nothing after the failure done. (The
    actions are the planner's; the verdict is set safe: this host has no checkpoints to read.)"""
    body = real(Change(-1, 0), kube=True, verdict="safe", safe=True, unknown=[])
    dos = [a["do"] for a in body["actions"]]
    assert dos[0] == "cordon" and dos[-2:] == ["wait_for_capacity", "uncordon"]
    plans.reply(body)
    plans.reply({**body, "stale": False})
    client = orch.PlanClient(plans.url)
    got = client.ask(cpu="-1")
    taken = got.body["cpu"]["take"][0]
    calls: list[str] = []
    kube = {do: (lambda a, do=do: calls.append(do)) for do in
            ("cordon", "uncordon", "wait_for_capacity", "restart_kubelet")}
    node = MemNode(refuse=CPU.format(taken))
    with pytest.raises(orch.StepFailed):
        orch.carry_out(client, got, executor(node, **kube))
    assert calls == ["cordon", "uncordon"] and node.files[CPU.format(taken)] == "1"


def test_a_harmful_or_unknown_verdict_is_never_acted_on(plans):
    client = orch.PlanClient(plans.url)
    for body in (answer(harmful=True), real(Change(0, -64 * BLOCK))):  # more than there is
        plans.reply(body)
        node = MemNode()
        with pytest.raises(orch.NotSafe, match="harmful"):
            orch.carry_out(client, client.ask(memory="-512Mi"), executor(node))
        assert node.writes == []
    plans.reply(answer(verdict="unknown", safe=False, unknown=["pods: not listed yet"]))
    with pytest.raises(orch.NotSafe, match="unknown.*pods: not listed yet"):
        orch.carry_out(client, client.ask(memory="-512Mi"), executor(MemNode()))
    assert len(plans.asked) == 3  # never asked again: nothing to act on


def test_a_plan_answered_before_the_node_changed_is_stale_and_nothing_is_done(plans):
    plans.reply(answer())
    plans.reply(answer(stale=True))  # a DIMM came in between
    client = orch.PlanClient(plans.url)
    node = MemNode()
    got = client.ask(memory="-512Mi")
    with pytest.raises(orch.Stale, match=got.generation):
        orch.carry_out(client, got, executor(node))
    assert node.writes == []


def test_an_echo_the_server_does_not_judge_is_not_taken_as_current(plans):
    plans.reply(answer())
    plans.reply(answer())  # stale null: the generation was not looked at
    client = orch.PlanClient(plans.url)
    with pytest.raises(orch.PlanError, match="not judged"):
        orch.carry_out(client, client.ask(memory="-512Mi"), executor(MemNode()))


def test_an_action_the_client_cannot_do_stops_the_plan_before_anything_changes(plans):
    plans.reply(answer())
    client = orch.PlanClient(plans.url)
    node = MemNode()
    with pytest.raises(orch.PlanError, match="hypervisor_remove"):
        orch.carry_out(client, client.ask(memory="-512Mi"), orch.Executor(node))
    assert node.writes == [] and len(plans.asked) == 1


@pytest.mark.parametrize("edit,match", [
    ({"schema": "someone-else/plan"}, "schema 'someone-else/plan'"),
    ({"schema_version": 3}, "schema_version 3"),
    ({"schema_version": "2"}, "schema_version '2'"),
])
def test_an_answer_in_another_schema_is_refused(plans, edit, match):
    plans.reply({**answer(), **edit})
    with pytest.raises(orch.PlanError, match=match):
        orch.PlanClient(plans.url).ask(cpu="-1")


@pytest.mark.parametrize("bad,match", [
    ({"order": 1, "do": "write", "path": "/etc/passwd", "value": "x", "rollback": []},
     "outside /sys"),
    ({"order": 1, "do": "write", "path": "/sys/../etc/passwd", "value": "x", "rollback": []},
     "outside /sys"),
    ({"order": 1, "do": "delete", "path": "/etc/shadow", "rollback": []}, "outside /var/lib"),
    ({"order": 2, "do": "cordon", "rollback": []}, "not in order"),
])
def test_a_malformed_action_is_refused(bad, match):
    with pytest.raises(orch.PlanError, match=match):
        orch.actions({"actions": [bad]})


def test_429_is_waited_out_with_retry_after(plans):
    plans.reply({"error": "busy"}, 429, **{"Retry-After": "1"})
    plans.reply(answer())
    t0 = time.monotonic()
    assert orch.PlanClient(plans.url).ask(memory="-512Mi").body["verdict"] == "safe"
    assert time.monotonic() - t0 >= 0.9 and len(plans.asked) == 2


def test_a_400_is_a_plan_error_with_the_servers_reason(plans):
    plans.reply({"error": "cpu '1.5': a whole number of CPUs"}, 400)
    with pytest.raises(orch.PlanError, match="HTTP 400: cpu '1.5'"):
        orch.PlanClient(plans.url).ask(cpu="1.5")


def test_a_token_is_never_sent_over_plain_http(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret")
    with pytest.raises(orch.PlanError, match="https only"):
        orch.PlanClient("http://127.0.0.1:9862", token_file=str(token))


@pytest.mark.parametrize("text,value", [("4", 4), ("16393832Ki", 16393832 << 10),
                                        ("1Gi", 1 << 30), ("2k", 2000)])
def test_quantity_reads_capacity_as_the_kubelet_writes_it(text, value):
    assert orch.quantity(text) == value


# ---------------------------------------------------------------- TLS: the certificate's SANs


def _cert(tmp_path, name: str, sans: list, issuer=None) -> tuple[str, str, object, object]:
    """(cert file, key file, cert, key): a CA when issuer is None, else a server certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = (subject, key) if issuer is None else (issuer[2].subject, issuer[3])
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(hours=1)))
    if issuer is None:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(issuer_key, hashes.SHA256())
    cert_file, key_file = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file), cert, key


SVC = "node-resize-exporter.node-resize-exporter.svc"


def _tls_plans(tmp_path, sans: list, ca=None) -> tuple[Plans, str]:
    ca = ca or _cert(tmp_path, "ca", [])
    server = _cert(tmp_path, "server", sans, issuer=ca)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(server[0], server[1])
    return Plans(ctx), ca[0]


def test_over_tls_the_token_goes_to_a_verified_node_and_is_read_each_time(tmp_path):
    plans, ca = _tls_plans(tmp_path, [x509.DNSName("node-1"),
                                      x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    token = tmp_path / "token"
    token.write_text("first\n")
    try:
        client = orch.PlanClient(plans.url, token_file=str(token), ca_file=ca)
        plans.reply(answer())
        client.ask(memory="-256Mi")
        token.write_text("rotated\n")  # the kubelet rotated the projected token
        plans.reply(answer())
        client.ask(memory="-256Mi")
    finally:
        plans.close()
    assert [h.get("Authorization") for _, h in plans.asked] == ["Bearer first", "Bearer rotated"]


def test_a_certificate_without_the_dialled_address_gets_no_token(tmp_path):
    plans, ca = _tls_plans(tmp_path, [x509.DNSName(SVC)])
    token = tmp_path / "token"
    token.write_text("secret")
    try:
        plans.reply(answer())
        with pytest.raises(orch.PlanError, match="127.0.0.1"):
            orch.PlanClient(plans.url, token_file=str(token), ca_file=ca).ask(cpu="-1")
        assert plans.asked == []
        # One certificate for every node, checked by its name (docs/security.md's recipe)
        orch.PlanClient(plans.url, token_file=str(token), ca_file=ca,
                        server_name=SVC).ask(cpu="-1")
    finally:
        plans.close()
    assert [h.get("Authorization") for _, h in plans.asked] == ["Bearer secret"]


def test_a_certificate_from_another_ca_gets_no_token(tmp_path):
    plans, _ = _tls_plans(tmp_path, [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    (tmp_path / "other").mkdir()
    other_ca = _cert(tmp_path / "other", "ca", [])
    token = tmp_path / "token"
    token.write_text("secret")
    try:
        with pytest.raises(orch.PlanError, match="certificate verify failed"):
            orch.PlanClient(plans.url, token_file=str(token), ca_file=other_ca[0]).ask(cpu="-1")
    finally:
        plans.close()
    assert plans.asked == []


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
