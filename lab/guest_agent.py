"""The guest-side helper: does what the host asks, inside the guest, through the scratch share.

Control channel (chosen over the serial console because it is framed, binary-safe and leaves
the console to the kernel's log): the host drops `ctl/<seq>.req` (JSON, written to a temporary
name and renamed, so a request is never seen half-written) into the writable 9p scratch share;
this loop polls the folder, runs the request and answers `ctl/<seq>.res` the same way. Requests
are a closed set of verbs (see OPS), never a shell: the host can only write sysfs attributes,
read files, start and stop the programs it names, and ask for a state snapshot.

Runs inside the chroot of the host's root with the host's /usr/bin/python3, standard library
only: `python3 -m lab.guest_agent /tmp/scratch` from the checkout.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

MEM_ROOT = Path("/sys/devices/system/memory")
CPU_ROOT = Path("/sys/devices/system/cpu")
# A sysfs write still in the kernel after this long has the kernel print its blocked tasks
# and every CPU's backtrace on the console (serial.log): what a hung hotplug waits for.
SLOW_WRITE = 30.0


class Agent:
    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.ctl = scratch / "ctl"
        self.ctl.mkdir(parents=True, exist_ok=True)
        self.children: dict[int, subprocess.Popen] = {}
        # Blocks present at boot are the ZONE_NORMAL ones (hot-added DIMMs come online_movable).
        self.boot_blocks = sorted(int(p.name[6:]) for p in MEM_ROOT.glob("memory[0-9]*"))
        self.running = True

    # ------------------------------------------------------------------ verbs

    def op_state(self) -> dict:
        blocks = {}
        for p in MEM_ROOT.glob("memory[0-9]*"):
            try:
                blocks[p.name] = (p / "state").read_text().strip()
            except OSError:
                blocks[p.name] = "gone"
        return {"mem_total_kb": mem_total_kb(), "cpus_online": read(CPU_ROOT / "online"),
                "cpus_present": read(CPU_ROOT / "present"), "memory_blocks": blocks,
                "block_size_bytes": int(read(MEM_ROOT / "block_size_bytes"), 16),
                "time": time.time()}  # the guest's clock: what its episodes are stamped with

    def op_write(self, path: str, value: str) -> dict:
        """Write a sysfs attribute; the kernel's errno is the answer (EBUSY for a refusal)."""
        # One write(2), unbuffered: a buffered file whose flush fails retries the write when
        # it is closed, so the kernel would see (and refuse) the request twice.
        t0 = time.monotonic()
        watchdog = threading.Timer(SLOW_WRITE, dump_stacks, (f"{value!r} > {path}",))
        watchdog.daemon = True
        watchdog.start()
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
            err = 0
        except OSError as e:
            err = e.errno or errno.EIO
        finally:
            watchdog.cancel()
        return {"errno": err, "error": errno.errorcode.get(err, "") if err else "",
                "seconds": time.monotonic() - t0}

    def op_read(self, path: str) -> dict:
        return {"value": read(Path(path))}

    def op_refuse_memory_offline(self) -> dict:
        """Write `offline` to a boot ZONE_NORMAL memory block the kernel refuses (EBUSY).

        memblock allocates top-down, so the highest boot block of ZONE_NORMAL holds the memmap
        and other unmovable kernel memory: it is tried first and is refused on every boot seen.
        A block that does go offline instead is put back online at once and reported, so the
        host can account for that extra successful pair; other errnos are reported too.
        """
        restored, other = [], []
        for n in reversed(self.boot_blocks):
            block = MEM_ROOT / f"memory{n}"
            if "Normal" not in read(block / "valid_zones") or read(block / "state") != "online":
                continue
            result = self.op_write(str(block / "state"), "offline")
            if result["errno"] == errno.EBUSY:
                return {"block": n, **result, "restored": restored, "other_errors": other}
            if result["errno"] == 0:
                self.op_write(str(block / "state"), "online")
                restored.append(n)
            else:
                other.append([n, result["error"]])
        return {"block": None, "errno": 0, "error": "no ZONE_NORMAL boot block refused",
                "restored": restored, "other_errors": other}

    def op_spawn(self, argv: list[str], log: str, cwd: str,
                 env: dict | None = None, err_log: str | None = None) -> dict:
        """Start a program in `cwd` (the checkout, as the host sees it); stdout to scratch/<log>,
        stderr there too unless err_log names one."""
        out = open(self.scratch / log, "ab")
        err = open(self.scratch / err_log, "ab") if err_log else None
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err or subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        out.close()
        if err:
            err.close()
        self.children[proc.pid] = proc
        return {"pid": proc.pid}

    def op_poll(self, pid: int) -> dict:
        proc = self.children.get(pid)
        return {"returncode": None if proc is None else proc.poll(), "known": proc is not None}

    def op_stop(self, pid: int, timeout: float = 20.0) -> dict:
        proc = self.children.pop(pid, None)
        if proc is None:
            return {"returncode": None, "known": False}
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return {"returncode": proc.returncode, "known": True}

    def op_shutdown(self) -> dict:
        self.running = False
        return {}

    OPS = {"state": op_state, "write": op_write, "read": op_read, "spawn": op_spawn,
           "poll": op_poll, "stop": op_stop, "shutdown": op_shutdown,
           "refuse_memory_offline": op_refuse_memory_offline}

    # ------------------------------------------------------------------ loop

    def handle(self, req_path: Path) -> None:
        seq = req_path.name[:-4]
        try:
            req = json.loads(req_path.read_text())
            op = self.OPS[req.pop("op")]
            answer = {"ok": True, **op(self, **req)}
        except Exception as e:  # any bad request is answered, never fatal to the agent
            answer = {"ok": False, "exception": f"{type(e).__name__}: {e}"}
        tmp = self.ctl / f".{seq}.res.tmp"
        tmp.write_text(json.dumps(answer))
        os.rename(tmp, self.ctl / f"{seq}.res")
        req_path.unlink(missing_ok=True)

    def run(self) -> None:
        (self.scratch / "agent.ready").write_text(json.dumps(self.op_state()))
        while self.running:
            pending = sorted(p for p in self.ctl.iterdir() if p.name.endswith(".req"))
            for p in pending:
                self.handle(p)
            if not pending:
                time.sleep(0.05)
        for pid in list(self.children):
            self.op_stop(pid)


def dump_stacks(what: str) -> None:
    """The write `what` is still in the kernel: sysrq w (blocked tasks) and l (each CPU's
    backtrace) print to the console, whatever kernel.sysrq allows (/proc/sysrq-trigger is not
    masked by it)."""
    print(f"agent: {what} still in the kernel after {SLOW_WRITE:.0f}s: sysrq w and l on the "
          "console", file=sys.stderr, flush=True)
    for key in ("w", "l"):
        try:
            with open("/proc/sysrq-trigger", "w") as f:
                f.write(key)
        except OSError as e:
            print(f"agent: sysrq {key}: {e}", file=sys.stderr, flush=True)


def read(path: Path) -> str:
    return path.read_text().strip()


def mem_total_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise RuntimeError("no MemTotal in /proc/meminfo")


if __name__ == "__main__":
    Agent(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/scratch")).run()
