"""Every command-line option, defined once: flag, type, validation, default, help.

The options every part of the agent shares are declared here; a source declares its own beside
its registration (`SourceSpec(options=...)`), as node_exporter's collectors declare their flags,
so a new source is one new file. `run`, `check` and `replay` build their flags from this one
table, so `run --memory-tolerance 100Mi` and `replay --memory-tolerance 100Mi` cannot disagree,
and `check` accepts exactly what `run` does. `Options` is the typed result: each value is the
flag's, or the table's default converted by the option's own type, never a second copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import click

from exporter.config.types import Bytes, KubeName, ListenAddress, Path_, Seconds, TelemetryPath

# What a command takes: RUN (and check) every option, REPLAY only the episode settings.
RUN, REPLAY = "run", "replay"


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
    commands: tuple[str, ...] = (RUN,)

    def __call__(self, f: Callable[..., Any]) -> Callable[..., Any]:
        return click.option(*self.flags, self.dest, type=self.type, default=self.default,
                            help=self.help, envvar=self.envvar, is_flag=self.is_flag,
                            show_default=self.show_default and not self.is_flag,
                            show_envvar=self.envvar is not None, multiple=self.multiple)(f)

    def value(self) -> Any:
        """The default as the option's type converts it (what the flag left unset gives)."""
        if self.type is None or self.default is None or isinstance(self.type, click.Choice):
            return self.default
        if self.multiple:
            return tuple(self.type.convert(v, None, None) for v in self.default)
        return self.type.convert(self.default, None, None)


TABLE: dict[str, Opt] = {}
_FLAGS: dict[str, str] = {}


def declare(*opts: Opt) -> tuple[Opt, ...]:
    """Add options to the table. A destination or flag declared twice is a programming error."""
    for opt in opts:
        known = TABLE.get(opt.dest)
        if known is not None:
            if known == opt:
                continue
            raise ValueError(f"option {opt.dest!r} declared twice")
        flags = [one for flag in opt.flags for one in flag.split("/")]
        taken = [f"{one} is {_FLAGS[one]!r}'s" for one in flags if one in _FLAGS]
        if taken:
            raise ValueError(f"option {opt.dest!r}: flag {', '.join(taken)} already")
        _FLAGS.update(dict.fromkeys(flags, opt.dest))
        TABLE[opt.dest] = opt
    return opts


def apply(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a click command with the options it takes, in table order."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed([o for o in TABLE.values() if command in o.commands]):
            f = opt(f)
        return f
    return decorate


class Options:
    """What a command was asked to do, converted and validated. An option not given has the
    table's default; a name the table does not declare is an error, not a silent None."""

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(TABLE))
        if unknown:
            raise TypeError(f"unknown options {unknown} (is the source that declares them "
                            "registered? exporter.sources.registry.load())")
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        try:
            opt = TABLE[name]
        except KeyError:
            raise AttributeError(f"no option {name!r}") from None
        values: dict[str, Any] = object.__getattribute__(self, "_values")
        return values[name] if name in values else opt.value()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Options are read-only; use replace()")

    def __repr__(self) -> str:
        return f"Options({object.__getattribute__(self, '_values')!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self.given() == other.given()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.given().items(), key=lambda kv: kv[0])))

    def given(self) -> dict[str, Any]:
        """The values set explicitly (a copy)."""
        return dict(object.__getattribute__(self, "_values"))

    def replace(self, **changes: Any) -> "Options":
        return Options(**{**self.given(), **changes})

    @classmethod
    def from_cli(cls, values: dict[str, Any]) -> "Options":
        """The keyword arguments click passed to a command -> Options (keys that are the
        command's own, such as --print-bpf, are its business)."""
        return cls(**{k: v for k, v in values.items() if k in TABLE})

    @property
    def listen_host(self) -> str:
        host: str = self.web_listen_address[0]
        return host

    @property
    def listen_port(self) -> int:
        port: int = self.web_listen_address[1]
        return port


# The options the whole agent shares. Kernel and Kubernetes sources declare their own.
declare(
    # HTTP and logs, node_exporter's names. The old --listen/--log-level still parse.
    Opt("web_listen_address", ("--web.listen-address", "--listen"), "0.0.0.0:9862",
        "Address for the telemetry path and /healthz (HOST:PORT).", ListenAddress()),
    Opt("web_telemetry_path", ("--web.telemetry-path",), "/metrics",
        "Path under which to expose metrics.", TelemetryPath()),
    Opt("web_config_file", ("--web.config.file",), None,
        "TLS / basic auth config in the Prometheus exporter-toolkit format "
        "(docs/security.md).", Path_()),
    Opt("web_auth", ("--web.auth",), "config",
        "Who may read the telemetry path: config = as --web.config.file says (basic auth, or "
        "nobody checked without it); kubernetes = a bearer token the API server authenticates "
        "(TokenReview) and authorizes for get on the path (SubjectAccessReview), over TLS "
        "(the file's certificate, else a self-signed one made at start); none = no check.",
        click.Choice(["config", "kubernetes", "none"])),
    Opt("web_auth_token_audience", ("--web.auth.token-audience",), (),
        "Repeatable: with --web.auth=kubernetes, accept only tokens for one of these "
        "audiences [default: the API server's own].", multiple=True, show_default=False),
    Opt("web_tls_extra_san", ("--web.tls.extra-san",), (),
        "Repeatable: with --web.auth=kubernetes and no tls_server_config, another DNS name or "
        "IP address for the certificate made at start [default: the node name, localhost, "
        "127.0.0.1, ::1].", multiple=True, show_default=False),
    Opt("log_level", ("--log.level", "--log-level"), "info",
        "Only log messages with the given severity or above.",
        click.Choice(["debug", "info", "warn", "warning", "error"])),
    Opt("log_format", ("--log.format",), "logfmt",
        "Output format of log messages (UTC timestamps).", click.Choice(["logfmt", "json"])),
    # Where the host's filesystems are (node_exporter's --path.* flags; every source reads them)
    Opt("sysfs_root", ("--path.sysfs", "--sysfs-root"), "/sys",
        "Where the host's sysfs is mounted."),
    Opt("procfs_root", ("--path.procfs", "--procfs-root"), "/proc",
        "Where the host's procfs is mounted."),
    # Kubernetes: the connection every Kubernetes source and sink uses
    Opt("kubernetes", ("--kubernetes",), "auto",
        "Watch the Node and its pods: auto = when in a cluster or --kubeconfig is given; on "
        "= required at start-up.", click.Choice(["auto", "on", "off"])),
    Opt("kubeconfig", ("--kubeconfig",), None,
        "Kubeconfig file (default: the in-cluster service account).", Path_()),
    Opt("node_name", ("--node-name",), None,
        "This node's name [default: the hostname].",
        KubeName("node name", "name", empty_ok=True), envvar="NODE_NAME"),
    Opt("kube_events", ("--kube-events",), False,
        "Post each episode's start and end as a Kubernetes Event on the Node (needs create "
        "on events: deploy/components/kube-events).", is_flag=True),
    # Episodes (the correlator's settings; replay takes them too)
    Opt("coalesce_window", ("--coalesce-window",), 2.0,
        "Seconds: transitions of one resource and direction this close are one episode.",
        Seconds(), commands=(RUN, REPLAY)),
    Opt("resync_deadline", ("--resync-deadline",), 600.0,
        "Seconds after the kernel is done before an episode is a resync_timeout.", Seconds(),
        commands=(RUN, REPLAY)),
    Opt("readmission_settle", ("--readmission-settle",), 10.0,
        "Seconds without pod changes after a resync before readmission settles.", Seconds(),
        commands=(RUN, REPLAY)),
    Opt("memory_tolerance", ("--memory-tolerance",), "100Mi",
        "Node memory within this of the kernel's counts as resynced (bytes or 100Mi; "
        "KEP-3953's jitter bound).", Bytes(), commands=(RUN, REPLAY)),
    # Journal
    Opt("journal", ("--journal",), None,
        "Journal file [default: /var/lib/node-resize-exporter/journal.db as root].", Path_(),
        show_default=False),
    Opt("no_journal", ("--no-journal",), False, "Keep no journal.", is_flag=True),
)
