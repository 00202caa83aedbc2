"""The source registry, as node_exporter registers collectors.

A source module declares itself at its end: its options and its roles (traits), which the rest
of the exporter reads instead of its name:

    CPUSET_PATH: Opt[str] = Opt("cpuset_path", ("--cpuset.path",), "...", "...")

    register(SourceSpec("cpuset", KERNEL, "a cpuset that follows the CPUs",
                        lambda ctx: CpusetSource(ctx.clock, CPUSET_PATH.of(ctx.options)),
                        options=(CPUSET_PATH,),
                        poked_by=frozenset({Resource.CPU})))  # re-read after CPU events

Nothing else lists the sources: the `--source` choices, the order they start in, the flags,
`check`, the composition root (exporter/app.py), the agent's pokes, the capabilities kept after
start and the series that exist at 0 all read this registry. `load()` imports every module under
exporter/sources/ (kernel/, apiserver/, kubelet/, ...): the ones that call register() are the
sources, the rest are their helpers.

A new source, step by step (every rule a test enforces is named here):
1. One module under exporter/sources/ with a `Source` subclass (exporter/sources/base.py):
   `open()` raises SourceUnavailable with the fix, `loop(emit)` emits typed events
   (exporter/events.py) until `stopping` is set; `poke(resource)` if it re-reads when the kernel
   changes (`poked_by`); a `check` of its own (the spec's, or an override of Source.check)
   where opening it is not the whole test of whether it can run. Its name is the spec's: the
   registry gives the source the spec's name (a class that declares another is refused when
   built: tests/unit/test_source_registry.py).
2. At the module's end, its options as typed constants named after the option's dest in
   capitals (`CPUSET_PATH: Opt[str] = Opt("cpuset_path", ...)`, read as
   `CPUSET_PATH.of(options)`; tests/unit/test_options.py) and `register(SourceSpec(...))` with
   its group, options and traits.
3. Each of its flags gets a row in README.md's flag table (tests/unit/test_readme_flags.py).
4. Its test beside the others (tests/unit/test_source_registry.py registers a toy source
   in one file and sees it opened, poked, counted and checked).
What the correlator makes of a new kind of event is the correlator's business: a source that
emits only the existing event types needs nothing more.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import exporter.sources as package
from exporter.checks import Check
from exporter.clock import MonotonicWallClock
from exporter.config.options import Opt, Options, declare
from exporter.config.types import ParamType
from exporter.events import Resource
from exporter.sources.base import Source

KERNEL = "kernel"  # chosen with --source (auto: every one that opens)
KUBERNETES = "kubernetes"  # on with --kubernetes, each when its own options ask for it


@dataclass(frozen=True)
class SourceContext:
    """What a factory may use to build its source."""

    options: Options
    clock: MonotonicWallClock
    node_name: str  # resolved once, by the composition root


class Watch(NamedTuple):
    """One kind of object a source lists and watches, and the deploy/ file that grants it."""

    group: str  # the API group ("" for the core group)
    resource: str
    namespace: str | None = None  # None: cluster-wide (a ClusterRole)
    granted_by: str = "deploy/clusterrole.yaml"

    def __str__(self) -> str:
        return self.resource + (f" in {self.namespace}" if self.namespace else "")


@dataclass(frozen=True)
class SourceSpec:
    name: str
    group: str  # KERNEL or KUBERNETES
    help: str
    factory: Callable[[SourceContext], Source]
    # Kubernetes sources: whether the options ask for this one (e.g. a URL is set). Kernel
    # sources are chosen by --source instead.
    wanted: Callable[[Options], bool] = lambda options: True
    order: int = 50  # start order; lower first (the sysfs truth before the event sources)
    # Kernel sources: False for a reader of state that runs whatever --source says (like the
    # sysfs reconciler): it is not an event source to choose.
    selectable: bool = True
    options: tuple[Opt[Any], ...] = ()  # the flags only this source reads
    # Its roles, read by the agent, the composition root, metrics, privileges and `check`:
    # The kernel events after which it re-reads (the agent calls `poke(resource)` after each
    # CPU or memory event of another source): the kernel changes what it reads (a cpuset, a
    # checkpoint's meaning, the CPU lists) without telling anyone.
    poked_by: frozenset[Resource] = frozenset()
    # The kernel's truth (the sysfs gauges): always opened, before every other source, whatever
    # --source says (a failure is a start-up error); the journal is checked against it.
    reconciles: bool = False
    # It can lose events (a ring buffer full, netlink ENOBUFS): events_lost_total exists at 0.
    lossy: bool = False
    # Capabilities it still needs once started (privileges.drop_capabilities keeps them); a
    # function because the answer can depend on the kernel (exporter/privileges.py).
    capabilities_after_start: Callable[[], frozenset[str]] = lambda: frozenset()
    # When its CPU programs are attached it reports every CPU transition; it says whether they
    # are after open(), through `reports_cpu_transitions()`.
    reports_cpu_transitions: bool = False
    # It leaves CPU transitions to such a source when one runs (`leave_cpu_transitions()`):
    # one wake-up per transition, not two.
    defers_cpu_transitions: bool = False
    # What it lists and watches in the API: what RBAC must grant (and where deploy/ grants
    # it), and what `check` asks the API server about (SelfSubjectAccessReview).
    watches: tuple[Watch, ...] = ()
    # Whether it can start here, for `check`, when opening it is not the whole answer (BPF:
    # the host's requirements line by line, then the programs it attached); else its
    # Source.check() opens and closes it.
    check: Callable[[Source], list[Check]] | None = None

    def build(self, ctx: SourceContext) -> Source:
        """The source, named as registered: a source class that leaves `name` at the base's
        default takes the spec's; one that declares another name is refused (its series,
        pokes and log lines would name a source nobody registered)."""
        source = self.factory(ctx)
        if source.name == Source.name:
            source.name = self.name
        elif source.name != self.name:
            raise ValueError(f"source {self.name!r}: its factory built a "
                             f"{type(source).__name__} named {source.name!r}; give the class "
                             f"name = {self.name!r}, or no name (the registry sets it)")
        return source

    def can_start(self, ctx: SourceContext) -> list[Check]:
        """`check`'s question to this source, built as `run` builds it."""
        source = self.build(ctx)
        return self.check(source) if self.check is not None else source.check(self.help)


_REGISTRY: dict[str, SourceSpec] = {}
_loaded = False


def register(spec: SourceSpec) -> None:
    if spec.group not in (KERNEL, KUBERNETES):
        raise ValueError(f"source {spec.name}: unknown group {spec.group!r}")
    if spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        raise ValueError(f"source {spec.name!r} registered twice")
    declare(*spec.options)
    _REGISTRY[spec.name] = spec


def load() -> None:
    """Import every module of the package once, so each registers itself. The generated gRPC
    bindings (`proto` packages) register nothing and import gRPC and protobuf (~10 MiB): they
    are left to the code that calls them."""
    global _loaded
    if _loaded:
        return
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if not info.ispkg and ".proto." not in info.name:
            importlib.import_module(info.name)
    _loaded = True


def specs(group: str | None = None) -> list[SourceSpec]:
    """Registered sources (of one group), in start order."""
    load()
    found = [s for s in _REGISTRY.values() if group is None or s.group == group]
    return sorted(found, key=lambda s: (s.order, s.name))


def spec(name: str) -> SourceSpec:
    load()
    return _REGISTRY[name]


def reconciler() -> SourceSpec:
    """The source that reconciles (the kernel's truth): exactly one is registered."""
    found = [s for s in specs(KERNEL) if s.reconciles]
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} reconciling sources registered; exactly one must be")
    return found[0]


def lossy_names() -> frozenset[str]:
    """The sources that can lose events."""
    return frozenset(s.name for s in specs() if s.lossy)


def kernel_source_names() -> tuple[str, ...]:
    """The --source choices."""
    return tuple(s.name for s in specs(KERNEL) if s.selectable)


class SourceList(ParamType):
    """"auto" or a comma list of the kernel sources the registry knows."""

    name = "sources"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
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


SOURCES: Opt[tuple[str, ...]] = Opt(
    "sources", ("--source",), "auto",
    "Kernel event sources: auto (every one that works) or a comma list of them. The sysfs "
    "reconciler always sets the gauges.", SourceList())
declare(SOURCES)
