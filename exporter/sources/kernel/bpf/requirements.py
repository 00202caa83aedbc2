"""What the BPF source needs from this host, each as one named requirement with its fix.

One list, read twice: the source's pre-flight (`BpfSource.open` raises on the first unmet one,
so `--source bpf` fails fast with the fix) and `node-resize-exporter check` (one line each).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from exporter.sources.kernel.bpf import libbpf
from exporter.sources.kernel.bpf.files import kernel_build_dir
from exporter.sources.kernel.bpf.programs import CPUHP_GROUP, CPUHP_PROGRAMS

TRACEFS = Path("/sys/kernel/tracing")
CPUHP_TRACEPOINTS = CPUHP_PROGRAMS  # each program is named after its tracepoint


@dataclass(frozen=True)
class Requirement:
    name: str
    ok: bool
    detail: str  # what is there, or what is wrong
    fix: str = ""


def tracefs() -> Requirement:
    if os.geteuid() != 0 and not os.access(TRACEFS / "events", os.R_OK):
        return Requirement("tracefs", False, "not root and tracefs not readable",
                           "run as root, or grant CAP_BPF, CAP_PERFMON (kernel >= 5.8)")
    if not _exists(TRACEFS / "events"):
        return Requirement("tracefs", False, "tracefs is not mounted at /sys/kernel/tracing",
                           "mount -t tracefs nodev /sys/kernel/tracing")
    return Requirement("tracefs", True, f"mounted at {TRACEFS}")


def _exists(path: Path) -> bool:
    """Path.exists() that says False where it may not look (tracefs is 0700 root: an
    unprivileged `check` or `run` got a PermissionError traceback there)."""
    try:
        return path.exists()
    except OSError:
        return False


def tracepoints() -> Requirement:
    if not os.access(TRACEFS / "events", os.R_OK | os.X_OK):
        return Requirement("cpuhp tracepoints", False,
                           f"cannot look into {TRACEFS}/events (not root, or not mounted)",
                           "run as root, or grant CAP_BPF, CAP_PERFMON (kernel >= 5.8); "
                           "mount -t tracefs nodev /sys/kernel/tracing")
    missing = [t for t in CPUHP_TRACEPOINTS if not _exists(TRACEFS / "events" / CPUHP_GROUP / t)]
    if missing:
        return Requirement("cpuhp tracepoints", False,
                           f"the kernel has no cpuhp tracepoints ({', '.join(missing)})",
                           "mount tracefs; the kernel needs CONFIG_HOTPLUG_CPU and "
                           "CONFIG_TRACEPOINTS")
    return Requirement("cpuhp tracepoints", True, ", ".join(CPUHP_TRACEPOINTS))


def headers() -> Requirement:
    build = kernel_build_dir()
    if _exists(build / "Makefile"):
        return Requirement("kernel headers", True, f"{build} -> {build.resolve()}")
    if _exists(Path("/sys/kernel/kheaders.tar.xz")):
        return Requirement("kernel headers", True, "kheaders module")
    return Requirement("kernel headers", False,
                       f"bcc needs kernel headers and {build} is missing",
                       "make run / scripts/setup.sh run installs linux-headers-amd64 and links "
                       "them (or load the kheaders module)")


def bcc() -> Requirement:
    # find_spec, not import: importing bcc maps LLVM for the life of the process. Only the
    # loader child imports it (and reports an import that fails after all).
    spec = importlib.util.find_spec("bcc")
    if spec is None:
        return Requirement("bcc", False, "cannot import bcc (the BPF compiler)",
                           "apt-get install python3-bpfcc and run with /usr/bin/python3 or a "
                           "venv made with --system-site-packages")
    return Requirement("bcc", True, f"python bcc at {Path(spec.origin or '?').parent}")


def libbpf_library() -> Requirement:
    try:
        libbpf.lib()
    except libbpf.LibbpfMissing as e:
        return Requirement("libbpf", False, str(e).split(" (fix:")[0], libbpf.FIX)
    return Requirement("libbpf", True, "libbpf.so.1 (the ring buffer reader)")


def requirements() -> list[Requirement]:
    """In the order they depend on each other."""
    return [tracefs(), tracepoints(), headers(), bcc(), libbpf_library()]
