"""The BPF source's answer to `check`: the host's requirements one line each (why it may
fail), then the source opened for real (compiled, loaded, attached) and closed again."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from exporter.checks import FAIL, OK, WARN, Check, guarded
from exporter.privileges import CAPS, capabilities
from exporter.sources.base import SourceUnavailable
from exporter.sources.kernel.bpf.requirements import requirements

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = CAPS["CAP_SYS_ADMIN"], CAPS["CAP_PERFMON"], CAPS["CAP_BPF"]


def check_capabilities() -> list[Check]:
    caps = capabilities()

    def has(c: int) -> bool:
        return bool(caps >> c & 1)

    if has(CAP_BPF) and has(CAP_PERFMON):
        return [Check("capabilities", OK, "CAP_BPF and CAP_PERFMON")]
    if has(CAP_SYS_ADMIN):
        return [Check("capabilities", OK, "CAP_SYS_ADMIN (covers BPF on kernels < 5.8)")]
    return [Check("capabilities", FAIL, "neither CAP_BPF+CAP_PERFMON nor CAP_SYS_ADMIN",
                  "run as root, or add capabilities BPF and PERFMON (SYS_ADMIN before 5.8)")]


def requirement_checks() -> list[Check]:
    """One line per requirement: the same list the source's open() checks."""
    return [Check(r.name, OK if r.ok else FAIL, r.detail, r.fix) for r in requirements()]


def check_btf() -> list[Check]:
    if Path("/sys/kernel/btf/vmlinux").exists():
        return [Check("BTF", OK, "/sys/kernel/btf/vmlinux present")]
    return [Check("BTF", WARN, "no /sys/kernel/btf/vmlinux (not needed: the programs read "
                  "tracepoint args only)", "use a kernel with CONFIG_DEBUG_INFO_BTF for CO-RE "
                  "tools")]


def check_kprobes() -> list[Check]:
    if not os.access("/sys/kernel/tracing", os.R_OK | os.X_OK):
        return [Check("kprobes", FAIL, "cannot look into /sys/kernel/tracing (not root, or "
                      "tracefs not mounted)", "run as root, or grant CAP_BPF, CAP_PERFMON")]
    if Path("/sys/kernel/tracing/kprobe_events").exists():
        return [Check("kprobes", OK, "memory online/offline probes can attach")]
    return [Check("kprobes", WARN, "kernel built without CONFIG_KPROBES: the memory BPF "
                  "probes (online_pages/offline_pages) cannot attach; memory hotplug is still "
                  "seen through uevents and sysfs, without kernel durations or refusal codes",
                  "a kernel with CONFIG_KPROBES=y for memory durations and EBUSY reasons")]


def check_opened(source: Any) -> list[Check]:
    """The only real test: compile, load and attach as `run` does, then close."""
    name = f"{source.name} source"
    try:
        source.open()
    except SourceUnavailable as e:
        return [Check(name, FAIL, e.reason, e.fix)]
    except Exception as e:  # noqa: BLE001 - `check` reports, it never prints a traceback
        return [Check(name, FAIL, f"cannot open: {e}"[:300], "see the checks above (run as "
                      "root?)")]
    try:
        attached = [p for p, (ok, _) in source.attached.items() if ok]
        missing = [p for p, (ok, _) in source.attached.items() if not ok]
        detail = f"compiled and attached: {', '.join(attached)}"
        if missing:
            detail += f"; not attached: {', '.join(missing)}"
        return [Check(name, OK, detail)]
    finally:
        source.close()


def bpf_check(source: Any) -> list[Check]:
    """The spec's `check`: host diagnostics, then the source itself."""
    return [*guarded("capabilities", check_capabilities),
            *guarded("bpf requirements", requirement_checks),
            *guarded("BTF", check_btf), *guarded("kprobes", check_kprobes),
            *guarded("bpf source", check_opened, source)]
