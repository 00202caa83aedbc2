"""Host side of the lab: boot a guest with the agent running, talk to it, scrape its exporter.

`LabGuest` ties a QEMU `Guest` to the guest agent (lab/guest_agent.py) through the scratch
share, and to whatever listens on the guest's port through the hostfwd on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lab.initramfs import CHECKOUT, GUEST_PORT, SCRATCH_IN_GUEST
from lab.qemu import Guest, GuestConfig
from testkit.exporter_proc import Scrape, poll_until  # shared with the tests and bench

# The checkout's venv: its python links to /usr/bin/python3 (which bcc is built for) and its
# pyvenv.cfg adds the project's dependencies; the guest sees both at the same paths.
GUEST_PYTHON = str(CHECKOUT / ".venv" / "bin" / "python")
# On the guest's tmpfs (SQLite WAL wants real shared memory, not 9p), in a directory only root
# may write (the exporter refuses a journal in a world-writable one such as /tmp).
GUEST_JOURNAL_DIR = "/tmp/nre-journal"
GUEST_JOURNAL = f"{GUEST_JOURNAL_DIR}/journal.db"
# A journal instead of --no-journal: a refused offline's reason (the BPF return code) is in the
# episode's transitions, which only the journal shows (`episodes list --json`), not /metrics.
EXPORTER_ARGV = [GUEST_PYTHON, "-m", "exporter", "run",
                 "--web.listen-address", f"0.0.0.0:{GUEST_PORT}",
                 "--source", "auto", "--journal", GUEST_JOURNAL, "--log.level", "debug"]
EPISODES_ARGV = [GUEST_PYTHON, "-m", "exporter", "episodes", "list", "--json",
                 "--journal", GUEST_JOURNAL]
EVENTS_ARGV = [GUEST_PYTHON, "-m", "exporter", "episodes", "export", "--journal", GUEST_JOURNAL]
# The guest sees the checkout read-only: no bytecode writes, HOME on the guest's tmpfs.
GUEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp", "PYTHONUNBUFFERED": "1"}

RUN_SH = f"""# Written by lab/control.py; /init runs it in the chroot, cwd the checkout.
export PYTHONDONTWRITEBYTECODE=1 HOME=/tmp PYTHONUNBUFFERED=1
mkdir -m 0700 -p {GUEST_JOURNAL_DIR}
exec {GUEST_PYTHON} -m lab.guest_agent {SCRATCH_IN_GUEST} >>{SCRATCH_IN_GUEST}/agent.log 2>&1
"""


class AgentError(RuntimeError):
    pass


SCRAPE_TIMEOUT = 10.0
SCRAPE_TRIES = 3


@dataclass
class LabGuest:
    guest: Guest
    seq: int = 0
    exporter_pid: int | None = None
    slow_scrapes: int = 0  # scrapes that timed out and were tried again

    @classmethod
    def boot(cls, out: Path, config: GuestConfig | None = None,
             timeout: float = 120.0) -> "LabGuest":
        """Start QEMU and wait until the guest agent answers. Kills QEMU if that fails."""
        guest = Guest(out, config or GuestConfig())
        guest.scratch.mkdir(parents=True, exist_ok=True)
        (guest.scratch / guest.config.script).write_text(RUN_SH)
        guest.start()
        lab = cls(guest)
        try:
            ready = guest.scratch / "agent.ready"
            deadline = time.monotonic() + timeout
            while not ready.exists():
                if not guest.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"guest agent not ready in {timeout}s (QEMU alive: "
                                       f"{guest.alive()}); serial tail:\n{guest.serial()[-3000:]}"
                                       f"\nagent log:\n{lab.artifact('agent.log')[-2000:]}")
                time.sleep(0.1)
        except BaseException:
            guest.stop()
            raise
        return lab

    def artifact(self, name: str) -> str:
        try:
            return (self.guest.scratch / name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ agent

    def call(self, op: str, timeout: float = 60.0, **args) -> dict:
        """One request to the guest agent; AgentError when it fails or does not answer."""
        self.seq += 1
        ctl = self.guest.scratch / "ctl"
        name = f"{self.seq:06d}"
        tmp = ctl / f".{name}.req.tmp"
        tmp.write_text(json.dumps({"op": op, **args}))
        os.rename(tmp, ctl / f"{name}.req")
        res = ctl / f"{name}.res"
        deadline = time.monotonic() + timeout
        while not res.exists():
            if not self.guest.alive():
                raise AgentError(f"QEMU exited while the agent ran {op}")
            if time.monotonic() > deadline:
                # What the guest was doing: the agent dumps the kernel's stacks on the console
                # when a write hangs there (lab/guest_agent.py SLOW_WRITE).
                threads = self.guest.threads()
                tail = self.guest.serial()[-1500:]
                vcpus = self.guest.vcpus()
                stacks = self.guest.sysrq("wl")
                raise AgentError(f"guest agent did not answer {op} {args} in {timeout}s; QEMU "
                                 f"threads: {threads}; serial tail:\n{tail}\nvCPUs:\n"
                                 f"{vcpus[-9000:]}\nsysrq w, l:\n{stacks[-4000:]}")
            time.sleep(0.05)
        answer = json.loads(res.read_text())
        res.unlink()
        if not answer.pop("ok"):
            raise AgentError(f"guest agent {op}: {answer.get('exception')}")
        return answer

    def state(self) -> dict:
        return self.call("state")

    def mem_total_bytes(self) -> int:
        return self.state()["mem_total_kb"] * 1024

    def wait_guest(self, predicate, timeout: float, what: str) -> dict:
        """Poll the guest's state until predicate(state) holds."""
        return poll_until(self.state, predicate, timeout, 0.2, lambda state: TimeoutError(
            f"guest never reached: {what}; last state {state}"))

    # ------------------------------------------------------------------ guest programs

    def spawn(self, argv: list[str], log: str, err_log: str | None = None) -> int:
        return self.call("spawn", argv=argv, log=log, env=GUEST_ENV, err_log=err_log,
                         cwd=str(CHECKOUT))["pid"]

    def run_program(self, argv: list[str], log: str, timeout: float) -> tuple[int, str]:
        """Run a guest program to completion: (exit code, its stdout); stderr to <log>.err."""
        (self.guest.scratch / log).unlink(missing_ok=True)
        pid = self.spawn(argv, log, err_log=log + ".err")
        deadline = time.monotonic() + timeout
        while (rc := self.call("poll", pid=pid)["returncode"]) is None:
            if time.monotonic() > deadline:
                self.stop_program(pid)
                raise TimeoutError(f"guest program {argv} did not finish in {timeout}s")
            time.sleep(0.3)
        self.call("stop", pid=pid)  # forget it in the agent
        return rc, self.artifact(log)

    def stop_program(self, pid: int) -> int | None:
        return self.call("stop", pid=pid, timeout=40.0)["returncode"]

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        with urllib.request.urlopen(self.guest.url + path, timeout=timeout) as r:
            return r.status, r.read()

    def wait_http(self, path: str, timeout: float, pid: int | None = None) -> float:
        """Wait until the guest answers `path` through the hostfwd; returns seconds waited."""
        t0 = time.monotonic()
        while True:
            try:
                status, _ = self.http_get(path, timeout=3)
                if status == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            if pid is not None and self.call("poll", pid=pid)["returncode"] is not None:
                raise RuntimeError(f"guest program {pid} exited before serving {path}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"guest did not serve {path} in {timeout}s")
            time.sleep(0.5)

    def start_exporter(self, timeout: float = 240.0) -> float:
        """Run the checkout's exporter in the guest and wait for /healthz through hostfwd."""
        self.exporter_pid = self.spawn(EXPORTER_ARGV, "exporter.log")
        try:
            return self.wait_http("/healthz", timeout, self.exporter_pid)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{e}; exporter log tail:\n"
                               f"{self.artifact('exporter.log')[-3000:]}") from None

    def scrape(self) -> Scrape:
        """One scrape through hostfwd. Under TCG on a loaded host the guest can stall for
        seconds after a hotplug (one CPU onlining took 4 s); a scrape that times out is tried
        again, up to SCRAPE_TRIES times, and logged in the artifacts. An exporter that answers
        none of them (30 s) fails the wait."""
        for attempt in range(1, SCRAPE_TRIES + 1):
            t0 = time.monotonic()
            try:
                _, body = self.http_get("/metrics", timeout=SCRAPE_TIMEOUT)
                return Scrape(body.decode())
            except (TimeoutError, urllib.error.URLError) as e:
                if not isinstance(getattr(e, "reason", e), TimeoutError):
                    raise
                self.slow_scrapes += 1
                with open(self.guest.out / "slow-scrapes.log", "a") as log:
                    log.write(f"{time.strftime('%H:%M:%S')} scrape {attempt} of {SCRAPE_TRIES} "
                              f"timed out after {time.monotonic() - t0:.1f}s\n")
                if attempt == SCRAPE_TRIES:
                    raise TimeoutError(f"the guest's exporter answered none of {SCRAPE_TRIES} "
                                       f"scrapes in {SCRAPE_TIMEOUT:.0f}s each") from None
        raise AssertionError("unreachable")

    def wait_scrape(self, predicate, timeout: float, what: str) -> Scrape:
        """Scrape until predicate(scrape) holds."""
        return poll_until(self.scrape, predicate, timeout, 0.5, lambda _: AssertionError(
            f"exporter never showed: {what} (in {timeout}s)"))

    def collect(self) -> None:
        """Leave the journal's raw events and episodes in the scratch share, for diagnosis."""
        if self.exporter_pid is None or not self.guest.alive():
            return
        for argv, name in ((EVENTS_ARGV, "events.jsonl"), (EPISODES_ARGV, "episodes.json")):
            try:
                self.run_program(argv, name, timeout=60)
            except (AgentError, TimeoutError, OSError):
                pass

    def shutdown(self) -> None:
        """Stop guest programs and QEMU; safe in every state."""
        try:
            if self.guest.alive():
                if self.exporter_pid is not None:
                    self.stop_program(self.exporter_pid)
                self.call("shutdown", timeout=10)
        except (AgentError, OSError):
            pass
        finally:
            self.guest.stop()
