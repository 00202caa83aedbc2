"""examples/orchestrator.py, the reference client: ask over real HTTP, act in order, verify,
roll back. The node's side is an in-memory sysfs that can refuse a write (the kernel's EBUSY);
the lab (lab/scenarios_orchestrator.py) runs the same client against a real guest kernel."""
from __future__ import annotations

import datetime
import errno
import ipaddress
import json
import os
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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


def test_429_is_waited_out_with_retry_after(plans):
    plans.reply({"error": "busy"}, 429, **{"Retry-After": "1"})
    plans.reply(answer())
    t0 = time.monotonic()
    assert orch.PlanClient(plans.url).ask(memory="-256Mi")["generation"] == "g1"
    assert time.monotonic() - t0 >= 0.9 and len(plans.asked) == 2


def test_a_token_is_never_sent_over_plain_http(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret")
    with pytest.raises(orch.PlanError, match="https only"):
        orch.PlanClient("http://127.0.0.1:9862", token_file=str(token))


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
