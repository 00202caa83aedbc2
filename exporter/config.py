"""One typed options object for `run`, validated once, with errors that say what to fix."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

DEFAULT_PORT = 9862
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
KERNEL_SOURCES = ("bpf", "uevent", "sysfs")
DEFAULT_PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_BALLOON_SELECTOR = "node-resize-exporter.io/balloon=true"


class ConfigError(ValueError):
    """Bad configuration: the message names the option and the fix. The CLI exits 2."""


def parse_listen(value: str) -> tuple[str, int]:
    """"host:port", ":port" or "[v6]:port" -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT with a port 1-65535, "
                          f"for example {DEFAULT_LISTEN} or 127.0.0.1:{DEFAULT_PORT}")
    host = host.strip("[]") or "0.0.0.0"
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"--listen {value!r}: {host!r} is not an IP address "
                              "(use an address such as 0.0.0.0, 127.0.0.1 or ::)") from None
    return host, int(port)


def parse_sources(value: str) -> tuple[str, ...]:
    """"auto" or a comma list of bpf, uevent, sysfs."""
    value = value.strip().lower()
    if value == "auto":
        return ("auto",)
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    bad = [n for n in names if n not in KERNEL_SOURCES]
    if bad or not names:
        raise ConfigError(f"--source {value!r}: unknown source {', '.join(bad) or '(empty)'}; "
                          f"use auto or a comma list of {', '.join(KERNEL_SOURCES)}")
    return names


@dataclass(frozen=True)
class Options:
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    sources: tuple[str, ...] = ("auto",)
    sysfs_interval: float = 30.0
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    ringbuf_pages: int = 64
    # Kubernetes
    kubernetes: str = "auto"  # auto: on when in a cluster or --kubeconfig given; on; off
    kubeconfig: str | None = None
    node_name: str | None = None
    podresources_socket: str = DEFAULT_PODRESOURCES_SOCKET
    podresources_interval: float = 30.0
    kubelet_metrics_url: str | None = None
    balloon_selector: str = DEFAULT_BALLOON_SELECTOR
    # episodes
    coalesce_window: float = 2.0
    resync_deadline: float = 600.0
    readmission_settle: float = 10.0
    memory_tolerance_bytes: float = 100 * 2**20
    # journal and web
    journal: str | None = None  # None: the default path
    journal_enabled: bool = True
    web_config_file: str | None = None
    extra: dict = field(default_factory=dict)

    def validate(self) -> "Options":
        for name in ("sysfs_interval", "coalesce_window", "resync_deadline",
                     "readmission_settle", "podresources_interval"):
            if getattr(self, name) <= 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be a positive number of seconds")
        if self.memory_tolerance_bytes < 0:
            raise ConfigError("--memory-tolerance must not be negative")
        if self.ringbuf_pages < 1 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ConfigError("--ringbuf-pages must be a power of two (the kernel requires it)")
        if self.kubernetes not in ("auto", "on", "off"):
            raise ConfigError("--kubernetes must be auto, on or off")
        return self
