"""A small QMP client over QEMU's unix socket: just what the lab's hotplug scenarios need.

QMP is line-delimited JSON. Replies and asynchronous events arrive on the same stream, so every
read files events into a list that `wait_event` consumes; a reply is matched by its "id".
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


class QMPError(RuntimeError):
    """QEMU answered a command with an error (class and description from QEMU)."""

    def __init__(self, command: str, error: dict):
        self.command = command
        self.error_class = error.get("class", "")
        self.desc = error.get("desc", "")
        super().__init__(f"QMP {command}: {self.error_class}: {self.desc}")


@dataclass(frozen=True)
class CpuSlot:
    """One entry of query-hotpluggable-cpus."""

    driver: str  # the CPU model's device type, e.g. qemu64-x86_64-cpu
    props: dict[str, int]  # socket-id / core-id / thread-id
    qom_path: str | None  # set when a CPU occupies the slot

    @property
    def free(self) -> bool:
        return self.qom_path is None


class QMP:
    def __init__(self, path: Path, timeout: float = 30.0):
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = b""
        self.events: list[dict] = []
        self.next_id = 0

    # ------------------------------------------------------------------ plumbing

    def connect(self, wait: float = 10.0) -> "QMP":
        """Connect (QEMU creates the socket a moment after it starts) and negotiate."""
        deadline = time.monotonic() + wait
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
                break
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock = sock
        greeting = self._read_message(self.timeout)
        if "QMP" not in greeting:
            raise RuntimeError(f"not a QMP greeting: {greeting}")
        self.execute("qmp_capabilities")
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _read_message(self, timeout: float) -> dict:
        assert self.sock is not None, "QMP not connected"
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no QMP message in {timeout}s")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("QMP socket closed (QEMU exited?)")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, command: str, timeout: float | None = None, **arguments: Any) -> Any:
        """Run one command and return its "return" value; QMPError on an error reply."""
        assert self.sock is not None, "QMP not connected"
        self.next_id += 1
        msg_id = f"lab-{self.next_id}"
        msg: dict[str, Any] = {"execute": command, "id": msg_id}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read_message(max(0.0, deadline - time.monotonic()))
            if "event" in reply:
                self.events.append(reply)
                continue
            if reply.get("id") != msg_id:
                continue  # a reply to nothing we wait for (cannot happen with one caller)
            if "error" in reply:
                raise QMPError(command, reply["error"])
            return reply.get("return")

    def wait_event(self, name: str, timeout: float,
                   match: Callable[[dict], bool] = lambda data: True) -> dict:
        """Return (and consume) the first event `name` whose data satisfies `match`."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("event") == name and match(ev.get("data", {})):
                    return self.events.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [e.get("event") for e in self.events]
                raise TimeoutError(f"no QMP event {name} in {timeout}s (queued: {seen})")
            try:
                msg = self._read_message(min(remaining, 1.0))
            except TimeoutError:
                continue
            if "event" in msg:
                self.events.append(msg)

    # ------------------------------------------------------------------ hotplug verbs

    def add_dimm(self, dimm_id: str, size_bytes: int) -> None:
        """Hot-add a pc-dimm backed by a fresh RAM backend named mem-<dimm_id>."""
        backend = f"mem-{dimm_id}"
        self.execute("object-add", **{"qom-type": "memory-backend-ram", "id": backend,
                                      "size": size_bytes})
        try:
            self.execute("device_add", driver="pc-dimm", id=dimm_id, memdev=backend)
        except QMPError:
            self.execute("object-del", id=backend)
            raise

    def remove_device(self, device_id: str, timeout: float = 120.0) -> dict:
        """device_del, then wait for the guest to eject it (DEVICE_DELETED for that id).

        The guest kernel has to offline what the device holds first (memory blocks, a CPU), so
        this can take a while under TCG, and never completes if the guest refuses.
        """
        self.execute("device_del", id=device_id)
        # QEMU 7.2 names an unplugged vCPU only through its child's path
        # (/machine/peripheral/<id>/lapic), never with "device": <id>; a DIMM gets "device".
        path = f"/machine/peripheral/{device_id}"
        return self.wait_event("DEVICE_DELETED", timeout, lambda d: d.get("device") == device_id
                               or d.get("path", "") == path
                               or d.get("path", "").startswith(path + "/"))

    def remove_dimm(self, dimm_id: str, timeout: float = 120.0) -> None:
        self.remove_device(dimm_id, timeout)
        self.execute("object-del", id=f"mem-{dimm_id}")

    def memory_devices(self) -> list[dict]:
        """query-memory-devices: [{"type": "dimm", "data": {"id", "addr", "size", ...}}]."""
        return self.execute("query-memory-devices")

    def hotpluggable_cpus(self) -> list[CpuSlot]:
        return [CpuSlot(c["type"], dict(c["props"]), c.get("qom-path"))
                for c in self.execute("query-hotpluggable-cpus")]

    def add_cpu(self, cpu_id: str) -> CpuSlot:
        """device_add a CPU into the first free slot; returns the slot used."""
        free = [slot for slot in self.hotpluggable_cpus() if slot.free]
        if not free:
            raise RuntimeError("no free CPU slot (raise maxcpus)")
        slot = free[0]
        self.execute("device_add", driver=slot.driver, id=cpu_id, **slot.props)
        return slot

    # ------------------------------------------------------------------ paravirtual memory

    def virtio_mem(self, device_id: str) -> dict[str, int]:
        """A virtio-mem device's sizes: {"size": plugged, "requested-size", "block-size",
        "max-size" (its region), "memaddr"} (query-memory-devices, type virtio-mem)."""
        for dev in self.memory_devices():
            if dev.get("type") == "virtio-mem" and dev["data"].get("id") == device_id:
                return dict(dev["data"])
        raise LookupError(f"no virtio-mem device {device_id}")

    def set_virtio_mem_size(self, device_id: str, requested: int) -> None:
        """Ask the guest to plug or unplug until `requested` bytes of the device are plugged
        (the guest driver decides which blocks; it may not manage all of an unplug)."""
        self.execute("qom-set", path=f"/machine/peripheral/{device_id}",
                     property="requested-size", value=requested)

    def balloon(self, guest_bytes: int) -> None:
        """Set the balloon's target: the guest should be left with `guest_bytes` of its boot
        RAM (the balloon inflates by the difference)."""
        self.execute("balloon", value=guest_bytes)

    def query_balloon(self) -> int:
        """What the guest has of its boot RAM now, by the balloon ("actual", bytes)."""
        return int(self.execute("query-balloon")["actual"])

    def quit(self) -> None:
        try:
            self.execute("quit", timeout=5)
        except (ConnectionError, OSError, TimeoutError):
            pass  # QEMU closing the socket is the answer to quit
