"""The source registry, as node_exporter registers collectors.

Each module in exporter/sources/ declares itself at its end:

    register(SourceSpec("uevent", KERNEL, "kernel uevents over netlink", lambda ctx: ...))

and nothing else lists the sources: the `--source` choices, the order they start in, `check`
and the composition root (exporter/app.py) all read this registry. A module is found by being
in the package (pkgutil), so a new source is one new file.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from exporter.clock import MonotonicWallClock
    from exporter.options import Options
    from exporter.sources.base import Source

KERNEL = "kernel"  # chosen with --source (auto: every one that opens)
KUBERNETES = "kubernetes"  # on with --kubernetes, each when its own options ask for it

# Not sources: the base class and this registry.
_NOT_SOURCES = frozenset({"base", "registry"})


@dataclass(frozen=True)
class SourceContext:
    """What a factory may use to build its source."""

    options: "Options"
    clock: "MonotonicWallClock"
    node_name: str  # resolved once, by the composition root


@dataclass(frozen=True)
class SourceSpec:
    name: str
    group: str  # KERNEL or KUBERNETES
    help: str
    factory: Callable[[SourceContext], "Source"]
    # Kubernetes sources: whether the options ask for this one (e.g. a URL is set). Kernel
    # sources are chosen by --source instead.
    wanted: Callable[["Options"], bool] = lambda options: True
    order: int = 50  # start order; lower first (the sysfs truth before the event sources)
    # Kernel sources: False for a reader of state that runs whatever --source says (like the
    # sysfs reconciler): it is not an event source to choose.
    selectable: bool = True


_REGISTRY: dict[str, SourceSpec] = {}
_loaded = False


def register(spec: SourceSpec) -> None:
    if spec.group not in (KERNEL, KUBERNETES):
        raise ValueError(f"source {spec.name}: unknown group {spec.group!r}")
    if spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        raise ValueError(f"source {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec


def _load() -> None:
    """Import every module of the package once, so each registers itself."""
    global _loaded
    if _loaded:
        return
    import exporter.sources as package
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_SOURCES and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    _loaded = True


def specs(group: str | None = None) -> list[SourceSpec]:
    """Registered sources (of one group), in start order."""
    _load()
    found = [s for s in _REGISTRY.values() if group is None or s.group == group]
    return sorted(found, key=lambda s: (s.order, s.name))


def spec(name: str) -> SourceSpec:
    _load()
    return _REGISTRY[name]


def kernel_source_names() -> tuple[str, ...]:
    """The --source choices."""
    return tuple(s.name for s in specs(KERNEL) if s.selectable)
