"""The click parameter types of the options: each converts and checks one kind of value.

A bad value is a usage error (exit 2) that names the flag and the fix, before anything starts.
Types that only one source needs live beside that source's options (exporter/sources/...).
"""
from __future__ import annotations

import ipaddress
import math
import os
import re
from typing import TYPE_CHECKING, Any

import click

from exporter.kube.convert import LabelSelector
from exporter.kube.quantity import parse_quantity

# click.ParamType takes the converted value's type as an argument from click 8.5 on (mypy reads
# it there); the clicks older than that, which the dependencies allow, cannot subscript it at
# run time. The option types derive from this name instead.
if TYPE_CHECKING:
    ParamType = click.ParamType[Any]
else:
    ParamType = click.ParamType

# Longest duration a seconds flag accepts: a year. Beyond it a typo (or inf) would make a
# thread sleep forever and freeze what it updates.
MAX_SECONDS = 365 * 86400.0


class Seconds(ParamType):
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
        if v > MAX_SECONDS:
            self.fail(f"{value!r} is more than a year; use at most {MAX_SECONDS:.0f}",
                      param, ctx)
        return v


class Bytes(ParamType):
    """Bytes as a number or a Kubernetes quantity (100Mi, 1Gi)."""

    name = "bytes"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = float(value)
        else:
            try:
                v = parse_quantity(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a byte count (examples: 104857600, 100Mi, 1Gi)",
                          param, ctx)
        if not math.isfinite(v) or v < 0:
            self.fail(f"{value!r} must be a finite, non-negative byte count", param, ctx)
        return v


class ListenAddress(ParamType):
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
                      "0.0.0.0:9862 or 127.0.0.1:9862", param, ctx)
        host = host.strip("[]") or "0.0.0.0"
        if host != "localhost":
            try:
                ipaddress.ip_address(host)
            except ValueError:
                self.fail(f"{text!r}: {host!r} is not an IP address (use an address such as "
                          "0.0.0.0, 127.0.0.1 or ::)", param, ctx)
        return host, int(port)


class TelemetryPath(ParamType):
    name = "path"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", text) or text in ("/", "/healthz"):
            self.fail(f"{text!r}: an absolute URL path such as /metrics (not / or /healthz)",
                      param, ctx)
        return text


class PowerOfTwo(ParamType):
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


class LabelSelectorText(ParamType):
    """A balloon label selector, checked at start-up so a typo fails before anything runs."""

    name = "selector"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        try:
            LabelSelector(str(value))
        except ValueError as e:
            self.fail(f"{value!r}: {e}; use key=value, key!=value, key or !key terms joined "
                      "by commas", param, ctx)
        return str(value)


class KubeName(ParamType):
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


class Path_(click.Path):
    """A file path that is not a directory (click.Path's checks, our name)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)


class RootDir(ParamType):
    """A directory the exporter reads under: it may not exist yet (no kubelet has
    run), but an existing non-directory is a typo. Empty turns the reader off."""

    name = "dir"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip()
        if text and os.path.exists(text) and not os.path.isdir(text):
            self.fail(f"{text!r} is not a directory; pass the directory (or '' to turn this "
                      "reader off)", param, ctx)
        return text
