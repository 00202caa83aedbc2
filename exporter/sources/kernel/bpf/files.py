"""Where the BPF C (cpuhp.bpf.c, memory.bpf.c, hotplug.h) is, installed or in a checkout.

The repository keeps it in the top-level bpf/; the build maps that directory to the package
`exporter.bpf` (pyproject.toml package-dir, setup.py), so a wheel carries it as
site-packages/exporter/bpf/. An editable install or a plain checkout has no exporter/bpf/ and
reads the checkout's bpf/ beside the package.
"""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[3]  # exporter/


def bpf_dir() -> Path:
    """The directory holding hotplug.h and the *.bpf.c files (the installed copy first)."""
    installed, checkout = _PACKAGE / "bpf", _PACKAGE.parent / "bpf"
    return installed if (installed / "hotplug.h").is_file() else checkout


def kernel_build_dir() -> Path:
    """The kernel headers bcc compiles against: $BCC_KERNEL_SOURCE when set (bcc itself reads it;
    the image sets it to its generic headers on nodes that have none), else the running kernel's
    /lib/modules/<release>/build."""
    return Path(os.environ.get("BCC_KERNEL_SOURCE") or f"/lib/modules/{os.uname().release}/build")
