"""Counts and amounts in the words people read in logs, check lines and Events: "1 pod",
"2 pods", "2 cores", "512 MiB". One definition, so no message says "1 pods" or "5.36871e+08"."""
from __future__ import annotations

from exporter.events import Resource

_IEC = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def count(n: int, noun: str, plural: str = "") -> str:
    """count(1, "pod") -> "1 pod"; count(2, "pod") -> "2 pods"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def size(value: float) -> str:
    """Bytes, exactly, in the largest binary unit that divides them: 536870912 -> "512 MiB",
    8053063680 -> "7680 MiB", 25276502016 -> "24684084 KiB", 1000 -> "1000 bytes"."""
    n = round(value)
    if n != value or n < 0:
        return f"{value:.0f} bytes"
    for unit, name in _IEC:
        if n and n % unit == 0:
            return f"{n // unit} {name}"
    return count(n, "byte")


def cores(value: float) -> str:
    """CPU in cores: 2 -> "2 cores", 1 -> "1 core", 0.5 -> "0.5 cores"."""
    if value == int(value):
        return count(int(value), "core")
    return f"{value:g} cores"


def amount(resource: Resource, value: float | None) -> str:
    """A resource's capacity in its words ("unknown" when not known): cores for CPU, bytes in
    binary units for everything else (Resource.unit)."""
    if value is None:
        return "unknown"
    return cores(value) if resource is Resource.CPU else size(value)
