"""The source registry, as node_exporter registers collectors.

A source module declares itself, and the options only it reads, at its end:

    register(SourceSpec("uevent", KERNEL, "kernel uevents over netlink", lambda ctx: ...,
                        options=(Opt("uevent_x", ("--uevent.x",), 1, "..."),)))

and nothing else lists the sources: the `--source` choices, the order they start in, the flags,
`check` and the composition root (exporter/app.py) all read this registry. `load()` imports
every module under exporter/sources/ (kernel/, apiserver/, kubelet/, ...): the ones that call
register() are the sources, the rest are their helpers. So a new source is one new file.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

import click

import exporter.sources as package
from exporter.clock import MonotonicWallClock
from exporter.config.options import Opt, Options, declare
from exporter.sources.base import Source

KERNEL = "kernel"  # chosen with --source (auto: every one that opens)
KUBERNETES = "kubernetes"  # on with --kubernetes, each when its own options ask for it


@dataclass(frozen=True)
class SourceContext:
    """What a factory may use to build its source."""

    options: Options
    clock: MonotonicWallClock
    node_name: str  # resolved once, by the composition root


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
    options: tuple[Opt, ...] = ()  # the flags only this source reads


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
    """Import every module of the package once, so each registers itself."""
    global _loaded
    if _loaded:
        return
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if not info.ispkg:
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


def kernel_source_names() -> tuple[str, ...]:
    """The --source choices."""
    return tuple(s.name for s in specs(KERNEL) if s.selectable)


class SourceList(click.ParamType):
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


declare(Opt("sources", ("--source",), "auto",
            "Kernel event sources: auto (every one that works) or a comma list of them. The "
            "sysfs reconciler always sets the gauges.", SourceList()))
