"""The words of counts and amounts (exporter/words.py), and the messages that use them: no
"1 pods", no "5.36871e+08" in an episode's detail."""
from __future__ import annotations

import pytest

from exporter.events import Resource
from exporter.words import amount, cores, count, size


@pytest.mark.parametrize("n, words", [(0, "0 pods"), (1, "1 pod"), (2, "2 pods")])
def test_count(n, words):
    assert count(n, "pod") == words


@pytest.mark.parametrize("value, words", [
    (536870912, "512 MiB"), (24 * 2**30, "24 GiB"), (7680 * 2**20, "7680 MiB"),
    (24684084 * 1024, "24684084 KiB"), (2**40, "1 TiB"), (1000, "1000 bytes"), (1, "1 byte"),
    (0, "0 bytes"), (1.5, "2 bytes"),
])
def test_size_is_exact_in_the_largest_unit_that_divides(value, words):
    assert size(value) == words


def test_cores_and_amount():
    assert (cores(1), cores(2), cores(0.5)) == ("1 core", "2 cores", "0.5 cores")
    assert amount(Resource.CPU, 1) == "1 core"
    assert amount(Resource.MEMORY, 536870912.0) == "512 MiB"
    assert amount(Resource.MEMORY, None) == "unknown"
