"""Boot the lab guest under QEMU TCG and make sure it dies with us, whatever happens.

The guest: Debian's 6.1 kernel (from the lab's cache), our initramfs, the host root read-only over
9p, the checkout read-only over 9p (mounted at its host path, /tmp included), a writable 9p
scratch share (the run's artifact folder, so the guest's logs land there directly), QEMU user
networking with restrict=on and one hostfwd from the host's loopback, QMP on a unix socket.
KVM is deliberately not used: `-enable-kvm` hangs at boot on these nested-virtualisation hosts.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab import initramfs
from lab.initramfs import GUEST_PORT, Kernel
from lab.qmp import QMP
from testkit.exporter_proc import free_port  # one port picker for every server the tests start

QEMU = "qemu-system-x86_64"
GiB = 1 << 30
MiB = 1 << 20
LPJ = 8400040  # loops per jiffy: 4200.02 BogoMIPS at HZ=250, the boot CPU under TCG here


# The paravirtual memory devices every lab guest has (lab/scenarios_virtio.py drives them):
# virtio-mem in both guest driver modes (the driver picks sub-block mode when the device block
# is smaller than a memory block, 128 MiB here, and big-block mode otherwise), each with a
# 512 MiB region and nothing plugged at boot, and a virtio-balloon without deflate-on-oom
# (inflating it takes pages out of the guest's MemTotal). Idle, they change nothing the other
# scenarios see: no memory block, no page.
VIRTIO_MEM_SBM, VIRTIO_MEM_BBM, BALLOON = "vmem0", "vmem1", "balloon0"
VIRTIO_MEM_REGION_MIB = 512
PARAVIRT_MEMORY: tuple[str, ...] = (
    "-object", f"memory-backend-ram,id={VIRTIO_MEM_SBM}-mem,size={VIRTIO_MEM_REGION_MIB}M",
    "-device", f"virtio-mem-pci,id={VIRTIO_MEM_SBM},memdev={VIRTIO_MEM_SBM}-mem,block-size=2M,"
               "requested-size=0",
    "-object", f"memory-backend-ram,id={VIRTIO_MEM_BBM}-mem,size={VIRTIO_MEM_REGION_MIB}M",
    "-device", f"virtio-mem-pci,id={VIRTIO_MEM_BBM},memdev={VIRTIO_MEM_BBM}-mem,"
               "block-size=256M,requested-size=0",
    "-device", f"virtio-balloon-pci,id={BALLOON},deflate-on-oom=off",
)


@dataclass(frozen=True)
class GuestConfig:
    base_mib: int = 1024  # bcc's clang needs a few hundred MiB inside the guest
    # Boot RAM below 4 GiB is ZONE_DMA32; only RAM above 4 GiB is ZONE_NORMAL, where the kernel
    # keeps its own unmovable memory (memmap, page tables, slab). Splitting the base RAM puts
    # ZONE_NORMAL blocks in the guest from boot, so a refused (EBUSY) offline has a target.
    below_4g_mib: int = 512
    slots: int = 8
    max_mib: int = 8192  # boot RAM, the DIMMs of both suites of scenarios, the virtio-mem regions
    # 3: two hot-pluggable vCPU slots, so the orchestrator's vCPU comes and goes while the other
    # hot-added one stays (QEMU 7.2 under TCG aborts at a vCPU device_add after a vCPU device_del)
    max_cpus: int = 3
    script: str = "run.sh"  # on the scratch share; /init runs it in the chroot
    # nokaslr: the kernel's physical placement (and so which boot blocks are busy) is stable.
    extra_append: tuple[str, ...] = ("nokaslr",)
    # More QEMU arguments (-object/-device pairs): the paravirtual memory devices of
    # lab/scenarios_virtio.py (virtio-mem, virtio-balloon).
    extra_args: tuple[str, ...] = PARAVIRT_MEMORY


_LIVE: dict[int, "Guest"] = {}  # id(guest) -> guest, while its QEMU may be running


def _stop_all_live() -> None:
    """atexit: any guest still running when the interpreter exits is stopped (QEMU killed)."""
    for guest in list(_LIVE.values()):
        guest.stop()


atexit.register(_stop_all_live)


@dataclass
class Guest:
    """One QEMU process. Use as a context manager, or call stop() in a finally."""

    out: Path  # the run's artifact folder: serial.log, initramfs, scratch/ (the 9p share)
    config: GuestConfig = field(default_factory=GuestConfig)
    kernel: Kernel = field(default_factory=Kernel.find)
    host_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    qmp: QMP | None = None

    @property
    def scratch(self) -> Path:
        return self.out / "scratch"

    @property
    def serial_log(self) -> Path:
        return self.out / "serial.log"

    @property
    def qmp_socket(self) -> Path:
        # A unix socket path must fit in 108 bytes; the artifact folder may be deep.
        return Path(f"/tmp/nre-lab-{os.getpid()}-{self.host_port}.qmp")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.host_port}"

    def command(self, initrd: Path) -> list[str]:
        c = self.config
        # lpj: no delay-loop calibration on a CPU coming up. Under TCG on a busy host the
        # calibration of a hot-added vCPU took 100 s and more (calibrate_delay_direct()
        # "failed to get a good estimate"), the guest agent unanswered meanwhile; x86 times
        # its delays with the TSC, so the preset value (the boot CPU's, measured) changes none.
        # sysrq_always_enabled: the host can ask a wedged guest for its stacks (sysrq()).
        append = ["console=ttyS0", "panic=-1", "memhp_default_state=online_movable",
                  f"lpj={LPJ}", "sysrq_always_enabled", f"lab.script={c.script}",
                  *c.extra_append]
        return [
            QEMU, "-name", "lab,debug-threads=on",  # threads named "CPU 1/TCG": threads()
            "-machine", f"pc,max-ram-below-4g={c.below_4g_mib}M", "-accel", "tcg",
            "-m", f"{c.base_mib}M,slots={c.slots},maxmem={c.max_mib}M",
            "-smp", f"1,maxcpus={c.max_cpus}",
            "-kernel", str(self.kernel.image), "-initrd", str(initrd),
            "-append", " ".join(append),
            "-nographic", "-monitor", "none", "-serial", f"file:{self.serial_log}",
            "-qmp", f"unix:{self.qmp_socket},server,nowait",
            "-netdev", f"user,id=n0,restrict=on,"
                       f"hostfwd=tcp:127.0.0.1:{self.host_port}-:{GUEST_PORT}",
            "-device", "virtio-net-pci,netdev=n0",
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,"
                       "multidevs=remap",
            "-virtfs", f"local,path={self.scratch},mount_tag=scratch,security_model=none,"
                       "multidevs=remap",
            "-virtfs", f"local,path={initramfs.CHECKOUT},mount_tag=checkout,"
                       "security_model=none,readonly=on,multidevs=remap",
            "-no-reboot",
            *c.extra_args,
        ]

    def start(self) -> "Guest":
        if shutil.which(QEMU) is None:
            raise FileNotFoundError(f"{QEMU} not found: run `scripts/setup.sh lab` "
                                    "(installs qemu-system-x86)")
        self.scratch.mkdir(parents=True, exist_ok=True)
        initrd = initramfs.build(self.out / "initramfs.cpio", self.kernel)
        self.qmp_socket.unlink(missing_ok=True)
        cmd = self.command(initrd)
        (self.out / "qemu-command.txt").write_text(" ".join(cmd) + "\n")
        qemu_log = open(self.out / "qemu.log", "w")
        # Own process group, so a Ctrl-C aimed at the lab does not reach QEMU before our
        # finally does, and stdin detached so -nographic never grabs the terminal.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=qemu_log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        qemu_log.close()
        _LIVE[id(self)] = self
        try:
            self.qmp = QMP(self.qmp_socket).connect()
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def threads(self) -> str:
        """QEMU's threads and the CPU seconds each used ("CPU 1/TCG 0.4s"): whether a vCPU
        that does not answer runs, spins or was never scheduled."""
        if self.proc is None:
            return "no QEMU"
        out = []
        tick = os.sysconf("SC_CLK_TCK")
        for task in sorted(Path(f"/proc/{self.proc.pid}/task").glob("*")):
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            state, used = fields[0], (int(fields[11]) + int(fields[12])) / tick
            out.append(f"{comm} {state} {used:.1f}s")
        return ", ".join(out) or "no threads read"

    def sysrq(self, keys: str = "wl", timeout: float = 15.0) -> str:
        """Alt-SysRq-<key> on the guest's keyboard for each of `keys` (w: blocked tasks, l:
        each CPU's backtrace), through QMP: the guest kernel prints them on the console
        whatever its programs do. What the console printed meanwhile (until every key was
        taken, and 3 s for what it prints), or why nothing."""
        if self.qmp is None or not self.alive():
            return "(no QMP)"
        before = len(self.serial())
        try:
            for key in keys:
                self.qmp.execute("send-key", timeout=5, keys=[
                    {"type": "qcode", "data": k} for k in ("alt", "sysrq", key)])
        except Exception as e:  # noqa: BLE001 - a diagnostic: say why, never raise
            return f"(send-key failed: {e})"
        deadline = time.monotonic() + timeout
        while self.serial()[before:].count("sysrq: ") < len(keys) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(min(3.0, max(0.0, deadline - time.monotonic())))
        return self.serial()[before:]

    def vcpus(self) -> str:
        """QEMU's own view of the vCPUs: `info cpus` (which halted) and each local APIC's
        registers (`info lapic`: what is pending, in service, masked), through QMP's HMP."""
        if self.qmp is None or not self.alive():
            return "(no QMP)"
        out = []
        for command in ("info cpus", "info registers -a",
                        *(f"info lapic {i}" for i in range(self.config.max_cpus))):
            try:
                out.append(f"({command})\n" + str(self.qmp.execute(
                    "human-monitor-command", timeout=5, **{"command-line": command})))
            except Exception as e:  # noqa: BLE001 - a diagnostic: say why, never raise
                out.append(f"({command}) failed: {e}")
        return "\n".join(out)

    def serial(self) -> str:
        try:
            return self.serial_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_serial(self, needle: str, timeout: float) -> float:
        """Wait for `needle` in the serial log; returns seconds waited."""
        t0 = time.monotonic()
        while needle not in self.serial():
            if not self.alive():
                raise RuntimeError(f"QEMU exited ({self.proc.returncode}) before {needle!r}; "
                                   f"serial tail:\n{self.serial()[-3000:]}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{needle!r} not on the serial console in {timeout}s; "
                                   f"tail:\n{self.serial()[-3000:]}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self) -> int | None:
        """Quit QEMU (QMP quit, then SIGKILL); safe to call any number of times."""
        if self.qmp is not None:
            try:
                if self.alive():
                    self.qmp.quit()
            except Exception:  # a wedged QMP must not stop us from killing QEMU below
                pass
            finally:
                self.qmp.close()
                self.qmp = None
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                rc = self.proc.wait()
        _LIVE.pop(id(self), None)
        self.qmp_socket.unlink(missing_ok=True)
        # 3 MB per run and rebuilt byte for byte by initramfs.build(): not worth keeping.
        (self.out / "initramfs.cpio").unlink(missing_ok=True)
        return rc

    def __enter__(self) -> "Guest":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
