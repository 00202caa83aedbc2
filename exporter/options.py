"""Every command-line option, defined once: flag, type, validation, default, help.

`run`, `replay` and `check` take the options they share from here (`ALL["coalesce_window"]`,
...), so `run --memory-tolerance 100Mi` and `replay --memory-tolerance 100Mi` cannot disagree.
Conversion and validation happen in the click parameter types below: a bad value is a usage
error (exit 2) that names the flag and the fix, before anything starts. `Options` is the typed
result `run` hands to exporter/app.py.
"""
from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Callable

import click

from exporter import defaults

# ---------------------------------------------------------------- parameter types


class Seconds(click.ParamType):
    """A finite number of seconds, more than 0 and at most a year: inf or nan would make a
    thread wait forever or spin."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(v) or v <= 0:
            self.fail(f"{value!r} must be more than 0 and finite", param, ctx)
        if v > defaults.MAX_SECONDS:
            self.fail(f"{value!r} is more than a year; use at most {defaults.MAX_SECONDS:.0f}",
                      param, ctx)
        return v


class Bytes(click.ParamType):
    """Bytes as a number or a Kubernetes quantity (100Mi, 1Gi)."""

    name = "bytes"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = float(value)
        else:
            from exporter.kube.quantity import parse_quantity
            try:
                v = parse_quantity(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a byte count (examples: 104857600, 100Mi, 1Gi)",
                          param, ctx)
        if not math.isfinite(v) or v < 0:
            self.fail(f"{value!r} must be a finite, non-negative byte count", param, ctx)
        return v


class ListenAddress(click.ParamType):
    """"host:port", ":port" or "[v6]:port" -> (host, port)."""

    name = "host:port"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        text = str(value)
        host, sep, port = text.rpartition(":")
        # isdigit() alone admits "¹" and other digits int() refuses
        if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            self.fail(f"{text!r}: expected HOST:PORT with a port 1-65535, for example "
                      f"{defaults.LISTEN_ADDRESS} or 127.0.0.1:{defaults.PORT}", param, ctx)
        host = host.strip("[]") or "0.0.0.0"
        if host != "localhost":
            try:
                ipaddress.ip_address(host)
            except ValueError:
                self.fail(f"{text!r}: {host!r} is not an IP address (use an address such as "
                          "0.0.0.0, 127.0.0.1 or ::)", param, ctx)
        return host, int(port)


class TelemetryPath(click.ParamType):
    name = "path"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", text) or text in ("/", "/healthz"):
            self.fail(f"{text!r}: an absolute URL path such as /metrics (not / or /healthz)",
                      param, ctx)
        return text


class SourceList(click.ParamType):
    """"auto" or a comma list of the kernel sources the registry knows."""

    name = "sources"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        from exporter.sources.registry import kernel_source_names
        known = kernel_source_names()
        text = str(value).strip().lower()
        if text == "auto":
            return ("auto",)
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        bad = [n for n in names if n not in known]
        if bad or not names:
            self.fail(f"{text!r}: unknown source {', '.join(bad) or '(empty)'}; use auto or a "
                      f"comma list of {', '.join(known)}", param, ctx)
        return names


class PowerOfTwo(click.ParamType):
    name = "pages"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            v = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        if v < 1 or v > 1 << 16 or v & (v - 1):
            self.fail(f"{value!r} must be a power of two from 1 to 65536 (the kernel requires "
                      "a power of two)", param, ctx)
        return v


class LabelSelectorText(click.ParamType):
    """A balloon label selector, checked at start-up so a typo fails before anything runs."""

    name = "selector"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from exporter.kube.convert import LabelSelector
        try:
            LabelSelector(str(value))
        except ValueError as e:
            self.fail(f"{value!r}: {e}; use key=value, key!=value, key or !key terms joined "
                      "by commas", param, ctx)
        return str(value)


class KubeName(click.ParamType):
    """A Kubernetes object name (a DNS-1123 subdomain): a node name (anything else could never
    match a Node, and a newline in it would forge log lines) or a PriorityClass name (a balloon
    pattern that silently matches nothing is the failure to avoid). Empty: None, when allowed."""

    _DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

    def __init__(self, what: str, name: str, empty_ok: bool = False) -> None:
        self.what, self.name, self.empty_ok = what, name, empty_ok

    def convert(self, value: Any, param: Any, ctx: Any) -> str | None:
        text = str(value).strip()
        if not text and self.empty_ok:
            return None
        if len(text) > 253 or not self._DNS1123.fullmatch(text):
            self.fail(f"{text[:80]!r} is not a {self.what} (lower-case letters, digits, '-' "
                      "and '.', at most 253 characters)", param, ctx)
        return text


class KubeletMetricsURL(click.ParamType):
    """https://, or http:// to a loopback address: the service account token goes there
    (issue 16: file:// and plain http to other hosts were accepted)."""

    name = "url"

    def convert(self, value: Any, param: Any, ctx: Any) -> str | None:
        if value is None or str(value) == "":
            return None
        from exporter.sources.kubelet_metrics import check_url
        try:
            return check_url(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Path_(click.Path):
    """A file path that is not a directory (click.Path's checks, our name)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)


class RootDir(click.ParamType):
    """A directory the exporter reads under (issue 13): it may not exist yet (no kubelet has
    run), but an existing non-directory is a typo. Empty turns the reader off."""

    name = "dir"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        import os
        text = str(value).strip()
        if text and os.path.exists(text) and not os.path.isdir(text):
            self.fail(f"{text!r} is not a directory; pass the directory (or '' to turn this "
                      "reader off)", param, ctx)
        return text


# ---------------------------------------------------------------- the definitions


@dataclass(frozen=True)
class Opt:
    """One option: its flags, destination, type, default and help, applied with `opt(f)`."""

    dest: str
    flags: tuple[str, ...]
    default: Any
    help: str
    type: Any = None
    envvar: str | None = None
    is_flag: bool = False
    show_default: bool = True
    multiple: bool = False  # repeatable: the values arrive as a tuple

    def __call__(self, f: Callable[..., Any]) -> Callable[..., Any]:
        return click.option(*self.flags, self.dest, type=self.type, default=self.default,
                            help=self.help, envvar=self.envvar, is_flag=self.is_flag,
                            show_default=self.show_default and not self.is_flag,
                            show_envvar=self.envvar is not None, multiple=self.multiple)(f)


_DEFINITIONS = (
    # HTTP and logs, node_exporter's names. The old --listen/--log-level still parse.
    Opt("web_listen_address", ("--web.listen-address", "--listen"), defaults.LISTEN_ADDRESS,
        "Address for the telemetry path and /healthz (HOST:PORT).", ListenAddress()),
    Opt("web_telemetry_path", ("--web.telemetry-path",), defaults.TELEMETRY_PATH,
        "Path under which to expose metrics.", TelemetryPath()),
    Opt("web_config_file", ("--web.config.file",), None,
        "TLS / basic auth config in the Prometheus exporter-toolkit format "
        "(docs/security.md).", Path_()),
    Opt("log_level", ("--log.level", "--log-level"), defaults.LOG_LEVEL,
        "Only log messages with the given severity or above.",
        click.Choice(["debug", "info", "warn", "warning", "error"])),
    Opt("log_format", ("--log.format",), defaults.LOG_FORMAT,
        "Output format of log messages (UTC timestamps).", click.Choice(["logfmt", "json"])),
    # Kernel sources
    Opt("sources", ("--source",), defaults.SOURCES,
        "Kernel event sources: auto (every one that works) or a comma list of them. The "
        "sysfs reconciler always sets the gauges.", SourceList()),
    Opt("sysfs_interval", ("--sysfs-interval",), defaults.SYSFS_INTERVAL,
        "Seconds between sysfs/procfs re-reads (also re-read after every event).", Seconds()),
    Opt("sysfs_root", ("--sysfs-root", "--path.sysfs"), defaults.SYSFS_ROOT,
        "Where the host's sysfs is mounted."),
    Opt("procfs_root", ("--procfs-root", "--path.procfs"), defaults.PROCFS_ROOT,
        "Where the host's procfs is mounted."),
    Opt("ringbuf_pages", ("--ringbuf-pages",), defaults.RINGBUF_PAGES,
        "BPF ring buffer size in pages (a power of two).", PowerOfTwo()),
    # Kubernetes
    Opt("kubernetes", ("--kubernetes",), defaults.KUBERNETES,
        "Watch the Node and its pods: auto = when in a cluster or --kubeconfig is given; on "
        "= required at start-up.", click.Choice(["auto", "on", "off"])),
    Opt("kubeconfig", ("--kubeconfig",), None,
        "Kubeconfig file (default: the in-cluster service account).", Path_()),
    Opt("node_name", ("--node-name",), None,
        "This node's name [default: the hostname].",
        KubeName("node name", "name", empty_ok=True), envvar="NODE_NAME"),
    Opt("podresources_socket", ("--podresources-socket",), defaults.PODRESOURCES_SOCKET,
        "The kubelet's podresources gRPC socket (empty: do not poll)."),
    Opt("podresources_interval", ("--podresources-interval",), defaults.PODRESOURCES_INTERVAL,
        "Seconds between podresources GetAllocatableResources polls.", Seconds()),
    Opt("kubelet_metrics_url", ("--kubelet-metrics-url",), None,
        "Scrape the kubelet's /metrics for resize feature gates (optional; https, or http "
        "to a loopback address).", KubeletMetricsURL()),
    Opt("balloon_selector", ("--balloon-selector",), defaults.BALLOON_SELECTOR,
        "Label selector of balloon pods.", LabelSelectorText()),
    Opt("node_lease", ("--node-lease/--no-node-lease",), defaults.NODE_LEASE,
        "Watch this node's Lease in kube-node-lease: the kubelet renews it every 10 s, so a "
        "dead kubelet shows in node_resize_kubelet_heartbeat_age_seconds{via=\"lease\"} within "
        "seconds (needs list/watch on leases).", is_flag=True),
    Opt("balloon_priority_classes", ("--balloon-priority-class",),
        defaults.BALLOON_PRIORITY_CLASSES,
        "Pods of this PriorityClass are balloon pods too, whatever their labels (repeatable; "
        "for example the cluster-autoscaler's overprovisioning class).",
        KubeName("PriorityClass name", "class"),
        show_default=False, multiple=True),
    # The kubelet's local state (issue 13): checkpoints a restart re-validates, kubepods cgroup
    Opt("kubelet_root_dir", ("--kubelet-root-dir",), defaults.KUBELET_ROOT_DIR,
        "The kubelet's --root-dir: where cpu_manager_state and memory_manager_state are "
        "(empty: do not read them).", RootDir()),
    Opt("cgroup_root", ("--cgroup-root",), defaults.CGROUP_ROOT,
        "Where the host's cgroup hierarchy is mounted (the kubepods cpuset is read there; "
        "empty: do not read it).", RootDir()),
    Opt("kube_events", ("--kube-events",), False,
        "Post each episode's start and end as a Kubernetes Event on the Node (needs create "
        "on events: deploy/components/kube-events).", is_flag=True),
    # Episodes
    Opt("coalesce_window", ("--coalesce-window",), defaults.COALESCE_WINDOW,
        "Seconds: transitions of one resource and direction this close are one episode.",
        Seconds()),
    Opt("resync_deadline", ("--resync-deadline",), defaults.RESYNC_DEADLINE,
        "Seconds after the kernel is done before an episode is a resync_timeout.", Seconds()),
    Opt("readmission_settle", ("--readmission-settle",), defaults.READMISSION_SETTLE,
        "Seconds without pod changes after a resync before readmission settles.", Seconds()),
    Opt("memory_tolerance", ("--memory-tolerance",), defaults.MEMORY_TOLERANCE,
        "Node memory within this of the kernel's counts as resynced (bytes or 100Mi).",
        Bytes()),
    # Journal
    Opt("journal", ("--journal",), None,
        "Journal file [default: /var/lib/node-resize-exporter/journal.db as root].", Path_(),
        show_default=False),
    Opt("no_journal", ("--no-journal",), False, "Keep no journal.", is_flag=True),
)

ALL: dict[str, Opt] = {o.dest: o for o in _DEFINITIONS}

# What each command takes, in --help order.
RUN = tuple(ALL)
REPLAY = ("coalesce_window", "resync_deadline", "readmission_settle", "memory_tolerance")
CHECK = ("sysfs_root", "procfs_root", "kubernetes", "kubeconfig", "node_name",
         "podresources_socket", "kubelet_metrics_url", "kubelet_root_dir", "cgroup_root",
         "journal", "no_journal")


def apply(names: tuple[str, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a click command with the named options (first name shown first)."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(names):
            f = ALL[name](f)
        return f
    return decorate


def _default(name: str) -> Any:
    """The converted default of an option, for the dataclass below."""
    opt = ALL[name]
    if opt.type is None or opt.default is None or isinstance(opt.type, click.Choice):
        return opt.default
    return opt.type.convert(opt.default, None, None)


@dataclass(frozen=True)
class Options:
    """What `run` was asked to do, converted and validated (defaults from exporter/defaults.py,
    via the definitions above)."""

    web_listen_address: tuple[str, int] = ("0.0.0.0", defaults.PORT)
    web_telemetry_path: str = defaults.TELEMETRY_PATH
    web_config_file: str | None = None
    log_level: str = defaults.LOG_LEVEL
    log_format: str = defaults.LOG_FORMAT
    sources: tuple[str, ...] = ("auto",)
    sysfs_interval: float = defaults.SYSFS_INTERVAL
    sysfs_root: str = defaults.SYSFS_ROOT
    procfs_root: str = defaults.PROCFS_ROOT
    ringbuf_pages: int = defaults.RINGBUF_PAGES
    kubernetes: str = defaults.KUBERNETES
    kubeconfig: str | None = None
    node_name: str | None = None
    podresources_socket: str = defaults.PODRESOURCES_SOCKET
    podresources_interval: float = defaults.PODRESOURCES_INTERVAL
    kubelet_metrics_url: str | None = None
    balloon_selector: str = defaults.BALLOON_SELECTOR
    balloon_priority_classes: tuple[str, ...] = defaults.BALLOON_PRIORITY_CLASSES
    node_lease: bool = defaults.NODE_LEASE
    kubelet_root_dir: str = defaults.KUBELET_ROOT_DIR
    cgroup_root: str = defaults.CGROUP_ROOT
    kube_events: bool = False
    coalesce_window: float = defaults.COALESCE_WINDOW
    resync_deadline: float = defaults.RESYNC_DEADLINE
    readmission_settle: float = defaults.READMISSION_SETTLE
    memory_tolerance: float = float(defaults.MEMORY_TOLERANCE_BYTES)
    journal: str | None = None
    no_journal: bool = False

    @classmethod
    def from_cli(cls, values: dict[str, Any]) -> "Options":
        """The keyword arguments click passed to a command -> Options (unknown keys, such as
        --print-bpf, are the command's own business)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    @property
    def listen_host(self) -> str:
        return self.web_listen_address[0]

    @property
    def listen_port(self) -> int:
        return self.web_listen_address[1]
