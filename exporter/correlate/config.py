"""The correlator's settings, and the one tolerance rule every part of it judges capacity by."""
from __future__ import annotations

from dataclasses import dataclass

from exporter.events import Resource


@dataclass(frozen=True)
class CorrelatorConfig:
    # The four settings are options (--coalesce-window, ...): their defaults live in the option
    # table (exporter/config/options.py) alone; exporter.config.decide.correlator_config
    # builds this.
    coalesce_window: float  # s: same resource+direction transitions join one episode
    resync_deadline: float  # s after kernel done -> resync_timeout
    readmission_settle: float  # s without a pod change after resync -> settled
    memory_tolerance_bytes: float  # KEP-3953's jitter bound for the kubelet
    cpu_tolerance_cores: float = 0.0  # whole cores
    kubernetes: bool = False  # a Node source is configured; False -> episodes end kernel_only
    # Pod status reasons that mean "admission rejected it"; any "OutOf" prefix counts too.
    rejection_reasons: frozenset[str] = frozenset(
        {"OutOfcpu", "OutOfmemory", "UnexpectedAdmissionError", "NodeCapacityExceeded"})

    def within(self, resource: Resource, a: float, b: float) -> bool:
        """Kernel and kubelet agree on `resource` (the 1e-9 absorbs float noise in bytes)."""
        tolerance = (self.cpu_tolerance_cores if resource is Resource.CPU
                     else self.memory_tolerance_bytes)
        return abs(a - b) <= tolerance + 1e-9
