"""Build the guest's initramfs: busybox-static, the virtio/9p/virtio_net modules, and /init.

Nothing from the host is copied except busybox and a handful of modules: the guest mounts the
host's root read-only over 9p and chroots into it, so Python and bcc need no guest image. The
checkout is a 9p share of its own, mounted at its host path: the guest's tmpfs on /tmp would hide
a checkout under /tmp. The guest kernel, its modules and headers come from a cache the lab owns
(scripts/setup.sh lab downloads the Debian packages and unpacks them there, never installs them),
bind-mounted over the guest's /lib/modules. The archive is written in the cpio "newc" format
by hand (a few lines) so the build needs no cpio binary and is byte-for-byte reproducible for a
given kernel.
"""
from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
# The modules /init needs, by name; their dependencies come from modules.dep.
# virtio_mem and virtio_balloon: the paravirtual memory devices (lab/scenarios_virtio.py); they
# load without a device too.
WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "virtio_net", "virtio_mem",
                  "virtio_balloon")
GUEST_PORT = 9862
SCRATCH_IN_GUEST = "/tmp/scratch"  # where the writable share appears inside the chroot
CHECKOUT = Path(__file__).resolve().parent.parent  # the same path inside the guest's chroot
# Written by scripts/setup.sh (lab_kernel): <release>/boot/vmlinuz-<release>,
# <release>/lib/modules/<release>/{modules.dep,build,source}, <release>/usr/src/linux-headers-*.
KERNEL_CACHE = Path("/var/cache/node-resize-exporter/lab-kernel")

# /init runs as PID 1 under busybox sh. Every line it prints starts with "lab-init:" so the host
# can follow boot progress in the serial log. The guest never gets a default route: the only
# traffic is the host's hostfwd connections (from 10.0.2.2, on-link), and restrict=on in QEMU
# drops anything else anyway.
INIT_SCRIPT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
say() { echo "lab-init: $*"; }
fail() { say "FAILED: $*"; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say "loading modules"
while read -r m; do insmod "/lib/modules/$m" || fail "insmod $m"; done < /modules.list
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 host /host || fail "9p host root"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mount -t tmpfs -o size=256m tmpfs /host/tmp
mount -t tmpfs tmpfs /host/run
# The checkout, wherever it is (under /tmp the tmpfs above hides it; elsewhere this covers it).
mkdir -p /host@CHECKOUT@ 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 checkout /host@CHECKOUT@ \
  || fail "9p checkout"
# The guest kernel's modules and headers (bcc in the guest compiles against them).
mount --bind /host@MODULES@ /host/lib/modules || fail "bind @MODULES@ on /lib/modules"
mount -t tracefs nodev /host/sys/kernel/tracing || say "no tracefs"
mount -t debugfs nodev /host/sys/kernel/debug || say "no debugfs"
mkdir -p /host@SCRATCH@
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 scratch /host@SCRATCH@; then
  say "no scratch share, using tmpfs (artifacts stay in the guest)"
fi
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up || say "eth0 not up"
cmd=""; script=""
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    lab.script=*) script="${arg#lab.script=}" ;;
    lab.cmd=*) cmd="$(echo "${arg#lab.cmd=}" | tr , ' ')" ;;
  esac
done
say "ready $(cut -d' ' -f1 /proc/uptime)s"
if [ -n "$script" ]; then
  chroot /host /bin/sh -c "cd @CHECKOUT@ && exec /bin/sh @SCRATCH@/$script"
elif [ -n "$cmd" ]; then
  chroot /host /bin/sh -c "cd @CHECKOUT@ && exec $cmd"
else
  say "nothing to run (lab.script=NAME or lab.cmd=WORDS,WITH,COMMAS)"
fi
say "command exited $?"
sync
poweroff -f
""".replace("@SCRATCH@", SCRATCH_IN_GUEST).replace("@CHECKOUT@", str(CHECKOUT))


@dataclass(frozen=True)
class Kernel:
    """The guest kernel: a Debian 6.1 image and its module tree, unpacked in KERNEL_CACHE."""

    release: str
    image: Path
    modules: Path

    @classmethod
    def find(cls, cache: Path = KERNEL_CACHE) -> "Kernel":
        images = sorted(glob.glob(f"{cache}/*/boot/vmlinuz-6.1.*-amd64"))
        if not images:
            raise FileNotFoundError(f"no guest kernel in {cache}: run `scripts/setup.sh lab` "
                                    "(downloads linux-image-amd64 there, without installing it)")
        image = Path(images[-1])
        release = image.name.removeprefix("vmlinuz-")
        modules = image.parent.parent / "lib" / "modules" / release
        if not (modules / "modules.dep").exists():
            raise FileNotFoundError(f"{modules}/modules.dep missing for guest kernel {release}: "
                                    "run `scripts/setup.sh lab`")
        if not (modules / "build" / "Makefile").exists():
            # bcc inside the guest compiles against the guest kernel's own headers.
            raise FileNotFoundError(f"{modules}/build has no headers: run `scripts/setup.sh lab`")
        return cls(release, image, modules)


def module_load_order(modules_dir: Path, wanted: tuple[str, ...] = WANTED_MODULES) -> list[str]:
    """Module paths (relative to modules_dir) in an order insmod accepts: dependencies first."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        name = Path(path).name.split(".ko")[0].replace("-", "_")
        by_name[name] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name not in by_name:
            raise LookupError(f"module {name} not in {modules_dir}/modules.dep "
                              "(built in? then drop it from WANTED_MODULES)")
        visit(by_name[name])
    return order


class _Cpio:
    """A minimal newc writer: directories, regular files, symlinks and device nodes."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)):
        encoded = name.encode() + b"\0"
        fields = (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0)
        self.ino += 1
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.chunks.append(header + encoded + b"\0" * (-(len(header) + len(encoded)) % 4))
        self.chunks.append(data + b"\0" * (-len(data) % 4))

    def directory(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def char_device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        blob = b"".join(self.chunks)
        return blob + b"\0" * (-len(blob) % 512)


def build(out: Path, kernel: Kernel | None = None) -> Path:
    """Write the initramfs to `out` and return it."""
    kernel = kernel or Kernel.find()
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} missing: run `scripts/setup.sh lab` (busybox-static)")
    busybox = BUSYBOX.read_bytes()
    # A dynamically linked busybox (Debian's `busybox` package) names its loader in PT_INTERP
    # near the start of the file; it cannot run in an initramfs without libc.
    if b"ld-linux" in busybox[:4096]:
        raise RuntimeError(f"{BUSYBOX} is dynamically linked: install busybox-static")
    archive = _Cpio()
    for d in ("bin", "sbin", "dev", "proc", "sys", "host", "tmp", "lib", "lib/modules"):
        archive.directory(d)
    # The kernel opens /dev/console before /init runs; without it /init has no stdout.
    archive.char_device("dev/console", 5, 1)
    archive.char_device("dev/null", 1, 3)
    archive.file("bin/busybox", busybox, 0o755)
    archive.symlink("bin/sh", "busybox")
    order = module_load_order(kernel.modules)
    made: set[str] = set()
    for rel in order:
        parent = "lib/modules"
        for part in Path(rel).parent.parts:
            parent = f"{parent}/{part}"
            if parent not in made:
                archive.directory(parent)
                made.add(parent)
        archive.file(f"lib/modules/{rel}", (kernel.modules / rel).read_bytes())
    archive.file("modules.list", ("\n".join(order) + "\n").encode())
    init = INIT_SCRIPT.replace("@MODULES@", str(kernel.modules.parent))
    archive.file("init", init.encode(), 0o755)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(archive.bytes())
    os.replace(tmp, out)
    return out
