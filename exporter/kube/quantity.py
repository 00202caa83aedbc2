"""Kubernetes resource quantities ("1500m", "123Mi", "129e6") -> plain numbers.

lightkube.utils.quantity does the parsing (apimachinery's resource.Quantity grammar, in Decimal,
rounded up to thousandths: nothing finer than a millicore or a byte means anything for a node's
capacity, and "1500u" and "1.5m" still come out equal). This wrapper keeps this
project's contract on top of it: a float (CPU in cores, memory in bytes), a ValueError naming
the offending text, and only values a node can hold: no negative, non-finite or absurdly large
capacity reaches the correlator (a bare 400-digit JSON integer once raised OverflowError in
float(), outside the malformed-input path).

lightkube leaves out two forms the API accepts, rewritten here into ones it reads: the "n" and
"u" suffixes (nano, micro: "250u" -> "250e-6") and an upper-case exponent ("129E6"; a bare "E"
stays exa). It knows two the API does not (Z, Y, Zi, Yi), refused here.
"""
from __future__ import annotations

import decimal
import math
import re
from decimal import Decimal
from typing import Callable

# 2^63 - 1: apimachinery's Quantity.Value() is an int64, and the kernel counts bytes in 64 bits;
# a capacity beyond it is a corrupt or hostile object, not a node.
MAX_QUANTITY = Decimal(2**63 - 1)
# The longest real quantity is ~25 characters ("1288490188800m"); the bound keeps Decimal work
# on hostile text (a 400-digit or a million-digit string) small.
MAX_LENGTH = 64

# "250u" -> "250e-6": a number (digits, maybe a point) then n or u, nothing else after it.
_SMALL_SUFFIX = re.compile(r"(?<=[0-9.])([nu])$")
_SMALL_EXPONENT = {"n": "e-9", "u": "e-6"}
_UPPER_EXPONENT = re.compile(r"E(?=[+-]?[0-9])")
_NOT_KUBERNETES = ("Z", "Y", "Zi", "Yi")


def parse_quantity(text: object) -> float:
    """Parse one quantity into cores or bytes. ValueError (naming the text) on anything else."""
    if isinstance(text, str):
        value = _parse_text(text)
    elif isinstance(text, (int, float)) and not isinstance(text, bool):
        # The API always serialises quantities as strings; a bare JSON number is tolerated
        # because hand-written manifests and some fakes produce them. bool is not a number here.
        if isinstance(text, float) and not math.isfinite(text):
            raise ValueError(f"quantity must be a finite number, got {text!r}")
        value = Decimal(text)
    else:
        raise ValueError(f"quantity must be a string, got {type(text).__name__}: {text!r}")
    if value < 0:
        raise ValueError(f"quantity must not be negative: {_shown(text)}")
    if value > MAX_QUANTITY:
        raise ValueError(f"quantity out of range (over 2^63): {_shown(text)}")
    return float(abs(value))  # abs: "-0" is 0.0, not -0.0


def _parse_text(text: str) -> Decimal:
    stripped = text.strip()
    if len(stripped) > MAX_LENGTH:
        raise ValueError(f"quantity longer than {MAX_LENGTH} characters: {_shown(text)}")
    if not stripped.isascii():  # the grammar is ASCII; re's \d would take any script's digits
        raise ValueError(f"not a Kubernetes quantity: {_shown(text)}")
    if stripped.endswith(_NOT_KUBERNETES):
        raise ValueError(f"not a Kubernetes quantity: {_shown(text)} (no Z or Y suffixes)")
    spelled = _UPPER_EXPONENT.sub("e", _SMALL_SUFFIX.sub(lambda m: _SMALL_EXPONENT[m[1]],
                                                         stripped))
    try:
        # Enough digits that every number of MAX_LENGTH characters is exact, so the range check
        # in parse_quantity, not a rounding error, is what rejects a long one.
        with decimal.localcontext(prec=MAX_LENGTH + 16):
            value = _lightkube_parse()(spelled)
    except (ValueError, ArithmeticError) as e:
        # lightkube's reason names the rewritten text; only say it when that is what was given.
        reason = f" ({e})" if spelled == stripped else ""
        raise ValueError(f"not a Kubernetes quantity: {_shown(text)}{reason}") from None
    if value is None:  # pragma: no cover - lightkube returns None only for None in
        raise ValueError(f"not a Kubernetes quantity: {_shown(text)}")
    result: Decimal = value
    return result


def _lightkube_parse() -> Callable[[str], Decimal | None]:
    """lightkube's parser, imported on the first quantity: importing lightkube loads its client
    (httpx and more, ~17 MiB), which a process that never joins Kubernetes has no use for."""
    from lightkube.utils.quantity import parse_quantity
    parse: Callable[[str], Decimal | None] = parse_quantity
    return parse


def _shown(text: object) -> str:
    """The offending input, cut short: a 400-digit value must not flood a log line."""
    if isinstance(text, int) and abs(text) > 10**60:  # repr() fails past 4,300 digits
        return f"an integer of {text.bit_length()} bits"
    shown = repr(text)
    return shown if len(shown) <= 80 else f"{shown[:60]}... ({len(shown)} characters)"
