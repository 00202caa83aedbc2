"""Every command-line option, defined once: flag, type, validation, default, help.

The options every part of the agent shares are declared here; a source declares its own beside
its registration (`SourceSpec(options=...)`), as node_exporter's collectors declare their flags,
so a new source is one new file. `run`, `check` and `replay` build their flags from this one
table, so `run --memory-tolerance 100Mi` and `replay --memory-tolerance 100Mi` cannot disagree,
and `check` accepts exactly what `run` does. `Options` is the result: each value is the flag's, or
the table's default converted by the option's own type, never a second copy.

Each option is a module-level constant typed by its converted value, and is read through it:
`COALESCE_WINDOW.of(options)` is a float to mypy, so a misspelt or mistyped read fails the
lint, and every reader of a flag is found by searching for its constant. A constant is
declared where it is defined, so whoever can read an option has already put it in the table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar, cast

import click

from exporter.config.types import Bytes, KubeName, ListenAddress, Path_, Seconds, TelemetryPath

# What a command takes: RUN (and check) every option, REPLAY only the episode settings.
RUN, REPLAY = "run", "replay"

T = TypeVar("T")


@dataclass(frozen=True)
class Opt(Generic[T]):
    """One option: its flags, destination, type, default and help, applied with `opt(f)`.
    T is the value's type once converted (`Opt[float]` for Seconds(), `Opt[str | None]` for a
    path without a default, `Opt[tuple[str, ...]]` for a repeatable one): declare it on the
    constant, `SYSFS_INTERVAL: Opt[float] = Opt(...)`."""

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

    def of(self, options: Options) -> T:
        """This option's value in `options`: the one given, else the default converted."""
        given = options._values
        return cast(T, given[self.dest]) if self.dest in given else self.value()

    def value(self) -> T:
        """The default as the option's type converts it (what the flag left unset gives)."""
        if self.type is None or self.default is None or isinstance(self.type, click.Choice):
            return cast(T, self.default)
        if self.multiple:
            return cast(T, tuple(self.type.convert(v, None, None) for v in self.default))
        return cast(T, self.type.convert(self.default, None, None))


TABLE: dict[str, Opt[Any]] = {}
_FLAGS: dict[str, str] = {}


def declare(*opts: Opt[Any]) -> tuple[Opt[Any], ...]:
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
    """What a command was asked to do, converted and validated, read option by option with
    `OPT.of(options)`. An option not given has the table's default; a name the table does not
    declare is an error, not a silent None."""

    __slots__ = ("_values",)
    _values: dict[str, Any]

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(TABLE))
        if unknown:
            raise TypeError(f"unknown options {unknown} (is the module that declares them "
                            "imported? a source's are beside its registration)")
        object.__setattr__(self, "_values", values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Options are read-only; use replace()")

    def __repr__(self) -> str:
        return f"Options({self._values!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self.given() == other.given()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.given().items(), key=lambda kv: kv[0])))

    def given(self) -> dict[str, Any]:
        """The values set explicitly (a copy)."""
        return dict(self._values)

    def replace(self, **changes: Any) -> Options:
        return Options(**{**self.given(), **changes})

    @classmethod
    def from_cli(cls, values: dict[str, Any]) -> Options:
        """The keyword arguments click passed to a command -> Options (keys that are the
        command's own, such as --print-bpf, are its business)."""
        return cls(**{k: v for k, v in values.items() if k in TABLE})

    @property
    def listen_host(self) -> str:
        return WEB_LISTEN_ADDRESS.of(self)[0]

    @property
    def listen_port(self) -> int:
        return WEB_LISTEN_ADDRESS.of(self)[1]


# The options the whole agent shares. Kernel and Kubernetes sources declare their own.
# HTTP and logs, node_exporter's names. The old --listen/--log-level still parse.
WEB_LISTEN_ADDRESS: Opt[tuple[str, int]] = Opt(
    "web_listen_address", ("--web.listen-address", "--listen"), "0.0.0.0:9862",
    "Address for the telemetry path and /healthz (HOST:PORT).", ListenAddress())
WEB_HEALTH_LISTEN_ADDRESS: Opt[tuple[str, int] | None] = Opt(
    "web_health_listen_address", ("--web.health-listen-address",), None,
    "Also answer /healthz here, plain HTTP on a listener of its own (HOST:PORT, such as "
    "127.0.0.1:9863): a liveness probe no flood of the main port delays.", ListenAddress())
WEB_TELEMETRY_PATH: Opt[str] = Opt(
    "web_telemetry_path", ("--web.telemetry-path",), "/metrics",
    "Path under which to expose metrics.", TelemetryPath())
WEB_CONFIG_FILE: Opt[str | None] = Opt(
    "web_config_file", ("--web.config.file",), None,
    "TLS / basic auth config in the Prometheus exporter-toolkit format "
    "(docs/security.md).", Path_())
WEB_AUTH: Opt[str] = Opt(
    "web_auth", ("--web.auth",), "config",
    "Who may read the telemetry path: config = as --web.config.file says (basic auth, or "
    "nobody checked without it); kubernetes = a bearer token the API server authenticates "
    "(TokenReview) and authorizes for get on the path (SubjectAccessReview), over TLS "
    "(the file's certificate, else a self-signed one made at start); none = no check.",
    click.Choice(["config", "kubernetes", "none"]))
WEB_AUTH_TOKEN_AUDIENCE: Opt[tuple[str, ...]] = Opt(
    "web_auth_token_audience", ("--web.auth.token-audience",), (),
    "Repeatable: with --web.auth=kubernetes, accept only tokens for one of these "
    "audiences [default: the API server's own].", multiple=True, show_default=False)
WEB_TLS_EXTRA_SAN: Opt[tuple[str, ...]] = Opt(
    "web_tls_extra_san", ("--web.tls.extra-san",), (),
    "Repeatable: with --web.auth=kubernetes and no tls_server_config, another DNS name or "
    "IP address for the certificate made at start [default: the node name, localhost, "
    "127.0.0.1, ::1].", multiple=True, show_default=False)
LOG_LEVEL: Opt[str] = Opt(
    "log_level", ("--log.level", "--log-level"), "info",
    "Only log messages with the given severity or above.",
    click.Choice(["debug", "info", "warn", "warning", "error"]))
LOG_FORMAT: Opt[str] = Opt(
    "log_format", ("--log.format",), "logfmt",
    "Output format of log messages (UTC timestamps).", click.Choice(["logfmt", "json"]))

# Where the host's filesystems are (node_exporter's --path.* flags; every source reads them)
SYSFS_ROOT: Opt[str] = Opt(
    "sysfs_root", ("--path.sysfs", "--sysfs-root"), "/sys",
    "Where the host's sysfs is mounted.")
PROCFS_ROOT: Opt[str] = Opt(
    "procfs_root", ("--path.procfs", "--procfs-root"), "/proc",
    "Where the host's procfs is mounted.")

# Kubernetes: the connection every Kubernetes source and sink uses
KUBERNETES: Opt[str] = Opt(
    "kubernetes", ("--kubernetes",), "auto",
    "Watch the Node and its pods: auto = when in a cluster or --kubeconfig is given; on "
    "= required at start-up.", click.Choice(["auto", "on", "off"]))
KUBECONFIG: Opt[str | None] = Opt(
    "kubeconfig", ("--kubeconfig",), None,
    "Kubeconfig file (default: the in-cluster service account).", Path_())
NODE_NAME: Opt[str | None] = Opt(
    "node_name", ("--node-name",), None,
    "This node's name [default: the hostname].",
    KubeName("node name", "name", empty_ok=True), envvar="NODE_NAME")
KUBE_EVENTS: Opt[bool] = Opt(
    "kube_events", ("--kube-events",), False,
    "Post each episode's start and end as a Kubernetes Event on the Node (needs create "
    "on events: deploy/components/kube-events).", is_flag=True)

# Episodes (the correlator's settings; replay takes them too)
COALESCE_WINDOW: Opt[float] = Opt(
    "coalesce_window", ("--coalesce-window",), 2.0,
    "Seconds: transitions of one resource and direction this close are one episode.",
    Seconds(), commands=(RUN, REPLAY))
RESYNC_DEADLINE: Opt[float] = Opt(
    "resync_deadline", ("--resync-deadline",), 600.0,
    "Seconds after the kernel is done before an episode is a resync_timeout.", Seconds(),
    commands=(RUN, REPLAY))
READMISSION_SETTLE: Opt[float] = Opt(
    "readmission_settle", ("--readmission-settle",), 10.0,
    "Seconds without pod changes after a resync before readmission settles.", Seconds(),
    commands=(RUN, REPLAY))
MEMORY_TOLERANCE: Opt[float] = Opt(
    "memory_tolerance", ("--memory-tolerance",), "100Mi",
    "Node memory within this of the kernel's counts as resynced (bytes or 100Mi; "
    "KEP-3953's jitter bound).", Bytes(), commands=(RUN, REPLAY))

# Journal
JOURNAL: Opt[str | None] = Opt(
    "journal", ("--journal",), None,
    "Journal file [default: /var/lib/node-resize-exporter/journal.db as root].", Path_(),
    show_default=False)
NO_JOURNAL: Opt[bool] = Opt(
    "no_journal", ("--no-journal",), False, "Keep no journal.", is_flag=True)

# In this order in --help and the README.
declare(
    WEB_LISTEN_ADDRESS, WEB_HEALTH_LISTEN_ADDRESS, WEB_TELEMETRY_PATH, WEB_CONFIG_FILE, WEB_AUTH,
    WEB_AUTH_TOKEN_AUDIENCE, WEB_TLS_EXTRA_SAN, LOG_LEVEL, LOG_FORMAT, SYSFS_ROOT, PROCFS_ROOT,
    KUBERNETES, KUBECONFIG, NODE_NAME, KUBE_EVENTS, COALESCE_WINDOW, RESYNC_DEADLINE,
    READMISSION_SETTLE, MEMORY_TOLERANCE, JOURNAL, NO_JOURNAL)
