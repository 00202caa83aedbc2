"""Compile, load and attach the BPF programs in a short-lived process; hand the fds back.

Why: bcc compiles the C in bpf/ with clang/LLVM, and importing bcc maps libLLVM and
libclang-cpp (~90 MiB resident) into the process for as long as it lives, though they are
needed for a third of a second at start-up. So the agent never imports bcc: it starts this
module as a child process (`python -m exporter.sources.kernel.bpf.loader FD`), which compiles, loads
and attaches with bcc (still the compiler, the programs are unchanged), then sends every file
descriptor the programs live on back over a unix socketpair (SCM_RIGHTS) and exits. The agent
reads the ring buffer through libbpf (exporter/sources/kernel/bpf/libbpf.py).

What keeps the programs attached once the child is gone: bcc attaches a tracepoint or kprobe
program by opening a perf event and attaching the program to it (PERF_EVENT_IOC_SET_BPF); the
attachment lives exactly as long as that perf event's file. Those fds are handed over with the
program and map fds, so the agent's copies hold every attachment; the child then leaves with
os._exit (bcc's atexit cleanup would detach legacy kprobes by name). Closing the received fds
(BpfSource.close) detaches everything, as bcc's cleanup() did; a SIGKILLed agent's fds are
closed by the kernel, which detaches too. Kernels since 4.17 create kprobes through the perf
kprobe PMU, so nothing named is left in tracefs either.

Why fds over a socketpair rather than pins in bpffs: pins outlive a crash (they would need
cleaning up, and a mounted bpffs, which containers often lack), and perf-event attachments
cannot be pinned at all (only bpf_link objects can, and bcc does not make links).

Capabilities: the child is exec'd, so it gets what the agent has at start-up (uid 0 keeps its
bounding set through exec; with no_new_privs it keeps exactly its permitted set): CAP_BPF and
CAP_PERFMON, before the agent drops them.

Protocol (SOCK_SEQPACKET, one message each way and an acknowledgement):
  agent -> child  {"text", "cflags", "kprobes": {prog: [function, is_return]}, "kprobes_ok"}
  child -> agent  {"ok": true, "attached": {prog: [ok, reason]}, "fds": [[kind, name], ...]}
                  with the fds in the same order as SCM_RIGHTS, or {"ok": false, "error"}
  agent -> child  b"ok" (the fds arrived; the child may exit)
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from exporter.sources.kernel.bpf.programs import CPUHP_GROUP, CPUHP_PROGRAMS, MAPS

MAX_MESSAGE = 1 << 20  # the program text is ~10 KiB
TIMEOUT = 120.0  # a first compile on a busy 2-CPU machine has taken ~10 s


class LoadError(Exception):
    """The child could not compile, load or attach; the message is bcc's (or the crash's)."""


@dataclass
class Loaded:
    """What the child handed over. Closing every fd detaches and unloads everything."""

    attached: dict[str, tuple[bool, str]]
    maps: dict[str, int] = field(default_factory=dict)  # name -> map fd
    progs: dict[str, int] = field(default_factory=dict)  # function name -> program fd
    links: dict[str, int] = field(default_factory=dict)  # attach point -> perf event fd

    def close(self) -> None:
        for group in (self.links, self.progs, self.maps):
            for fd in group.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            group.clear()


def load(text: str, cflags: list[str], kprobes: dict[str, tuple[str, bool]],
         kprobes_ok: bool, timeout: float = TIMEOUT) -> Loaded:
    """Run the loader child; return the fds it attached, or raise LoadError with why not."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # clang's diagnostics go to the child's stderr: a file, so a verbose compile can never
    # block on a full pipe while we wait for the answer. An anonymous memory file, not one in
    # a temporary directory: a read-only root without a writable /tmp has none (start-up
    # failed with "No usable temporary directory found").
    with os.fdopen(os.memfd_create("bpf-loader-stderr", os.MFD_CLOEXEC), "w+b") as stderr:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "exporter.sources.kernel.bpf.loader", str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=stderr)
        except OSError as e:
            parent.close()
            child.close()
            raise LoadError(f"cannot start the BPF loader process: {e}") from e
        child.close()  # the child has its copy: EOF on `parent` now means the child is gone
        try:
            reply, fds = _ask(parent, proc, text, cflags, kprobes, kprobes_ok, timeout)
            if not reply or not reply.get("ok"):
                for fd in fds:
                    os.close(fd)
                proc.wait(timeout)
                stderr.seek(0)
                said = stderr.read().decode(errors="replace").strip()[-2000:]
                why = "; ".join(x for x in ((reply or {}).get("error"), said) if x)
                raise LoadError(why or f"the loader exited {proc.returncode}")
            loaded = _unpack(reply, fds)
            parent.sendall(b"ok")
        finally:
            parent.close()
            if proc.poll() is None:
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return loaded


def _ask(sock: socket.socket, proc: subprocess.Popen[bytes], text: str, cflags: list[str],
         kprobes: dict[str, Any], kprobes_ok: bool,
         timeout: float) -> tuple[dict[str, Any] | None, list[int]]:
    sock.settimeout(timeout)
    sock.sendall(json.dumps({"text": text, "cflags": cflags, "kprobes": kprobes,
                             "kprobes_ok": kprobes_ok}).encode())
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 256)
    except socket.timeout:
        proc.kill()
        raise LoadError(f"the BPF loader gave no answer in {timeout:.0f} s") from None
    try:
        return (json.loads(data) if data else None), fds
    except ValueError:
        return None, fds


def _unpack(reply: dict[str, Any], fds: list[int]) -> Loaded:
    names = reply["fds"]
    if len(names) != len(fds):
        for fd in fds:
            os.close(fd)
        raise LoadError(f"the loader named {len(names)} fds but sent {len(fds)}")
    loaded = Loaded({k: (bool(v[0]), str(v[1])) for k, v in reply["attached"].items()})
    groups = {"map": loaded.maps, "prog": loaded.progs, "link": loaded.links}
    for (kind, name), fd in zip(names, fds):
        groups[kind][name] = fd
    return loaded


# ------------------------------------------------------------------ the child


def _attach(bpf: Any, request: dict[str, Any]
            ) -> tuple[dict[str, Any], list[tuple[str, str]], list[int]]:
    """bcc has loaded the programs and attached the TRACEPOINT_PROBEs; attach the kprobes."""
    attached: dict[str, list[Any]] = {}
    for prog, (func, is_return) in request["kprobes"].items():
        if not request["kprobes_ok"]:
            attached[prog] = [False, "kernel built without CONFIG_KPROBES"]
            continue
        try:
            attach = bpf.attach_kretprobe if is_return else bpf.attach_kprobe
            attach(event=func.encode(), fn_name=prog.encode())
            attached[prog] = [True, ""]
        except Exception as e:  # bcc raises bare Exceptions
            attached[prog] = [False, f"attach to {func} failed: {e}"]
    names: list[tuple[str, str]] = []
    fds: list[int] = []
    for tp, fd in bpf.tracepoint_fds.items():
        names.append(("link", _text(tp)))
        fds.append(fd)
    for event, by_fn in bpf.kprobe_fds.items():
        for fn, fd in by_fn.items():
            names.append(("link", f"{_text(event)}:{_text(fn)}"))
            fds.append(fd)
    for name, fn in bpf.funcs.items():
        names.append(("prog", _text(name)))
        fds.append(fn.fd)
    for name in MAPS:
        names.append(("map", name))
        fds.append(bpf[name.encode()].map_fd)
    return attached, names, fds


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def child_main(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    request = json.loads(sock.recv(MAX_MESSAGE))
    try:
        from bcc import BPF
        # bcc wants bytes (str is deprecated); TRACEPOINT_PROBEs attach during the load.
        bpf = BPF(text=request["text"].encode(), cflags=request["cflags"])
        attached, names, fds = _attach(bpf, request)
    except Exception as e:  # bcc raises bare Exceptions for compile and load failures
        sock.send(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}).encode())
        return 1
    links = {name for kind, name in names if kind == "link"}
    for prog in CPUHP_PROGRAMS:  # TRACEPOINT_PROBEs, named after their tracepoints
        ok = f"{CPUHP_GROUP}:{prog}" in links
        attached[prog] = [ok, "" if ok else "bcc did not attach the tracepoint"]
    reply = {"ok": True, "attached": attached, "fds": names}
    socket.send_fds(sock, [json.dumps(reply).encode()], fds)
    sock.recv(16)  # the agent has them (or is gone): either way we are done
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: skip bcc's atexit cleanup, which would detach what the agent now holds.
    os._exit(child_main(int(sys.argv[1])))
