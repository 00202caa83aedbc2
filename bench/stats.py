"""Summaries of repeated measurements: percentiles, median and spread."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not samples:
        return math.nan
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> "Summary":
        xs = [float(x) for x in samples if x is not None and math.isfinite(x)]
        if not xs:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        return cls(len(xs), statistics.median(xs), percentile(xs, 99), min(xs), max(xs))

    def as_dict(self) -> dict:
        return asdict(self)
