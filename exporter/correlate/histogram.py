"""A plain histogram (cumulative at render time) that pure state can hold.

prometheus_client's Histogram is a global, instrumented object; the correlator must stay pure
and copyable, so it keeps these and the Collector renders them at scrape time.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Kernel transition time: a CPU goes offline in 6-33 ms here, a memory block in 1-16 ms.
KERNEL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Kubelet catch-up: milliseconds (a kubelet with the KEP) to 30 minutes (a restart by hand).
RESYNC_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                  600.0, 1200.0, 1800.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # Prometheus buckets are "less than or equal": bisect_left puts v == bound in that bucket.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count)] ending with +Inf, as HistogramMetricFamily wants."""
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts):
            running += count
            out.append((_fmt(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


def _fmt(bound: float) -> str:
    return repr(float(bound))
