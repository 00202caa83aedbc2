"""Kubernetes quantity parsing: the forms the API server and manifests use, through lightkube,
and the values no node holds (negative, non-finite, absurdly large) refused as ValueError."""
from __future__ import annotations

import json
from decimal import ROUND_UP, Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.kube.quantity import MAX_LENGTH, parse_quantity


@pytest.mark.parametrize("text, value", [
    ("2", 2.0), ("1500m", 1.5), ("100m", 0.1), ("0.1", 0.1), ("128974848", 128974848.0),
    ("129e6", 129e6), ("129E6", 129e6), ("123Mi", 123 * 2**20), ("1Gi", 2**30),
    ("8148504Ki", 8148504 * 1024), ("1k", 1000.0), ("1M", 1e6), ("1G", 1e9), ("1E", 1e18),
    ("1.5Gi", 1.5 * 2**30), (".5", 0.5), ("5.", 5.0), ("+3", 3.0), ("1E-2", 0.01),
    ("250000u", 0.25), ("500000000n", 0.5), ("1e-3", 0.001), ("0", 0.0), (4, 4.0), (2.5, 2.5),
    ("-0", 0.0), (" 2 ", 2.0), ("1288490188800m", 1288490188.8),
    ("9223372036854775807", float(2**63 - 1)),  # the largest accepted: int64, as apimachinery
])
def test_valid(text, value):
    assert parse_quantity(text) == pytest.approx(value, rel=1e-12)


def test_finer_than_a_thousandth_rounds_up_and_spellings_agree():
    # lightkube's canonical form: "1500u" and "1.5m" are one quantity, and come out equal.
    assert parse_quantity("1500u") == parse_quantity("1.5m") == 0.002
    assert parse_quantity("250u") == parse_quantity("1n") == 0.001
    assert str(parse_quantity("-0")) == "0.0"  # not -0.0


@pytest.mark.parametrize("text", ["", " ", "abc", "two", "1.2.3", "1KiB", "1 Gi", "Gi", "1e",
                                  ".", "1ki", "0x10", "1e99", "--1", None, True, [1], "u",
                                  "1e3u", "1u5", "1Zi", "0.001Z", "1Y", "NaN", "Infinity",
                                  "inf", "\u0661\u0662", "1_000"])
def test_garbage_raises_value_error(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


# A Node whose capacity was "-4", a 400-digit string or a bare 400-digit JSON
# integer got through (the last as an OverflowError outside the malformed-input path).
@pytest.mark.parametrize("value, words", [
    ("-4", "must not be negative: '-4'"),
    ("-1u", "must not be negative: '-1u'"),
    ("-100Mi", "must not be negative"),
    (-4, "must not be negative: -4"),
    (-0.5, "must not be negative"),
    (float("nan"), "finite number, got nan"),
    (float("inf"), "finite number, got inf"),
    (float("-inf"), "finite number, got -inf"),
    ("9223372036854775808", "out of range .over 2\\^63.: '9223372036854775808'"),
    ("10Ei", "out of range"),
    ("1e30", "out of range"),
    (2**63, "out of range"),
    (1e300, "out of range"),
    ("1" * 400, f"longer than {MAX_LENGTH} characters: '1111"),
    ("1e999999999999", "not a Kubernetes quantity: '1e999999999999'"),
])
def test_no_node_holds_it(value, words):
    with pytest.raises(ValueError, match=words):
        parse_quantity(value)


@pytest.mark.parametrize("digits", [20, 400, 4000])
def test_a_bare_json_integer_of_absurd_size_is_a_value_error_not_overflow(digits):
    # Exactly what the API's JSON decoder hands over for `"cpu": 1000...0` (no quotes).
    value = json.loads('{"cpu": 1%s}' % ("0" * (digits - 1)))["cpu"]
    with pytest.raises(ValueError, match="out of range") as info:
        parse_quantity(value)
    assert len(str(info.value)) < 120  # named without printing every digit


def test_an_integer_too_long_to_print_is_still_a_value_error():
    with pytest.raises(ValueError, match="an integer of 16610 bits"):
        parse_quantity(10**5000)  # repr() of it raises; the message must not


@given(st.integers(min_value=0, max_value=2**40),
       st.sampled_from([("", 1), ("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("k", 10**3),
                        ("M", 10**6), ("m", Decimal("0.001")), ("u", Decimal("1e-6")),
                        ("n", Decimal("1e-9"))]))
def test_integer_with_suffix(n, suffix):
    name, factor = suffix
    with localcontext(prec=80):
        expected = (Decimal(n) * factor).quantize(Decimal("0.001"), rounding=ROUND_UP)
    if expected > 2**63 - 1:
        with pytest.raises(ValueError, match="out of range"):
            parse_quantity(f"{n}{name}")
    else:
        assert parse_quantity(f"{n}{name}") == float(expected)


@given(st.text(max_size=12))
def test_never_anything_but_value_error(text):
    try:
        out = parse_quantity(text)
    except ValueError:
        return
    assert out >= 0 and out == out and out <= 2**63
