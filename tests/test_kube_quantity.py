"""Kubernetes quantity parsing: the forms the API server and manifests use."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from exporter.kube.quantity import parse_quantity


@pytest.mark.parametrize("text, value", [
    ("2", 2.0), ("1500m", 1.5), ("100m", 0.1), ("0.1", 0.1), ("128974848", 128974848.0),
    ("129e6", 129e6), ("129E6", 129e6), ("123Mi", 123 * 2**20), ("1Gi", 2**30),
    ("8148504Ki", 8148504 * 1024), ("1k", 1000.0), ("1M", 1e6), ("1G", 1e9), ("1E", 1e18),
    ("1.5Gi", 1.5 * 2**30), (".5", 0.5), ("5.", 5.0), ("+3", 3.0), ("-1", -1.0),
    ("250u", 250e-6), ("1e-3", 0.001), ("0", 0.0), (4, 4.0),
])
def test_valid(text, value):
    assert parse_quantity(text) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("text", ["", " ", "abc", "two", "1.2.3", "1KiB", "1 Gi", "Gi", "1e",
                                  ".", "1ki", "0x10", "1e99", "--1", None, True, [1]])
def test_garbage_raises_value_error(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=2**40),
       st.sampled_from([("", 1), ("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("k", 10**3),
                        ("M", 10**6), ("m", 10**-3)]))
def test_integer_with_suffix(n, suffix):
    name, factor = suffix
    assert parse_quantity(f"{n}{name}") == pytest.approx(n * factor, rel=1e-12)


@given(st.text(max_size=12))
def test_never_anything_but_value_error(text):
    try:
        parse_quantity(text)
    except ValueError:
        pass
