"""A plain histogram (cumulative at render time) that pure state can hold, and the bucket
boundaries of each duration the exporter measures.

prometheus_client's Histogram is a global, instrumented object; the correlator must stay pure
and copyable, so it keeps these and the Collector renders them at scrape time. A histogram with
no observation is not rendered (docs/metrics.md: a node that never resized shows no buckets).

Each boundary set has at most 10 buckets (+Inf included), placed around what real kernels and
kubelets were measured to take, so that every bucket separates cases someone tells apart. The
alerts, their tests and the dashboards read some `le` values (noted below): change them there
too (mixin/: its alerts and dashboards, scripts/gen-monitoring.py).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Kernel time of one transition. Measured: CPU online 6-9 ms, CPU offline 17-33 ms (its cpuhp
# steps 6-16 ms), memory block online < 1 ms, offline 7-16 ms; a block whose pages must migrate
# can take seconds (the last two buckets).
KERNEL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 1.0)
# Kernel done -> Node capacity updated: sub-second for a kubelet that resyncs by itself, seconds
# to minutes across a kubelet restart, up to half an hour by hand. 1, 300 and 600 are read by
# alerts/tests (NodeResizeResyncSlow's 300 s threshold).
RESYNC_BUCKETS = (0.1, 1.0, 5.0, 15.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# Kernel done -> pod readmission settled: seconds (the kubelet's pod workers after a resync).
READMISSION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# A balloon's resize, desired requests set -> applied: a kubelet sync (about 1 s) when it fits,
# longer when the kubelet defers it and retries.
BALLOON_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


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
