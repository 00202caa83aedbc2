"""Kubernetes resource quantities ("1500m", "123Mi", "129e6") -> plain numbers.

The grammar is apimachinery's resource.Quantity: an optional sign, a decimal number, and one
suffix: binary SI (Ki..Ei), decimal SI (n, u, m, "", k, M, G, T, P, E) or a decimal exponent
(e3, E-2). CPU comes out in cores, memory in bytes. Decimal arithmetic keeps "0.1" and "100m"
identical before the one conversion to float.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}

# Number part: digits with an optional fraction (".5" and "5." are legal, "." is not).
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)


def parse_quantity(text: object) -> float:
    """Parse one quantity. Raises ValueError (with the offending text) on anything else."""
    if not isinstance(text, str):
        # The API always serialises quantities as strings; a bare JSON number is tolerated
        # because hand-written manifests and some fakes produce them. bool is not a number here.
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            return float(text)
        raise ValueError(f"quantity must be a string, got {type(text).__name__}: {text!r}")
    match = _QUANTITY.match(text.strip())
    if match is None or not text.strip():
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    try:
        number = Decimal(match["num"])
    except InvalidOperation as e:  # pragma: no cover - the regex admits only valid decimals
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from e
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif len(suffix) > 1 and suffix[0] in ("e", "E"):  # a bare "E" is exa, below
        exponent = int(suffix[1:])
        if abs(exponent) > 60:  # beyond anything a node holds; also guards huge Decimal work
            raise ValueError(f"quantity exponent out of range: {text!r}")
        value = number.scaleb(exponent)
    else:
        value = number * _DECIMAL[suffix]
    return float(value)
