"""What the hypervisor gave the VM and holds back, as gauges: virtio-mem devices and the balloon.

A sink and a Collector in one (ViewSink): the paravirt_memory source
(exporter/sources/kernel/paravirt_memory.py) emits a ParavirtMemory event when a device's
region or plugged size, or the balloon, changes; this keeps the latest and renders it at scrape
time. Series exist only for devices the guest has: no virtio-mem device, no virtio-mem series;
no balloon driver bound, no balloon series (a bare-metal node shows none of them; the families
are declared all the same).
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.events import Event, ParavirtMemory
from exporter.sinks import ViewSink


class ParavirtSink(ViewSink):
    def __init__(self) -> None:
        super().__init__()
        self.latest: ParavirtMemory | None = None

    def feed(self, event: Event) -> None:
        if isinstance(event, ParavirtMemory):
            self.latest = event

    def collect(self) -> Iterable[Metric]:
        """Every family always (declared, as the catalogue lists them); samples only for the
        devices the guest has."""
        with self.lock:
            latest = self.latest
        region = GaugeMetricFamily(
            "node_resize_virtio_mem_region_bytes",
            "The memory region of a virtio-mem device: the most the hypervisor can plug.",
            labels=["device"])
        plugged = GaugeMetricFamily(
            "node_resize_virtio_mem_plugged_bytes",
            "Memory of a virtio-mem device the guest has plugged (given to the VM; the rest "
            "of the region is held back by the hypervisor).", labels=["device"])
        requested = GaugeMetricFamily(
            "node_resize_virtio_mem_requested_bytes",
            "What the hypervisor asked the guest to plug, as the guest's driver logged it.",
            labels=["device"])
        lowerable = GaugeMetricFamily(
            "node_resize_virtio_mem_lowerable_bytes",
            "How far the device's requested size can be lowered with the guest honouring it: "
            "its plugged memory in offline and ZONE_MOVABLE blocks (a kernel zone's is counted "
            "as staying).", labels=["device"])
        held = GaugeMetricFamily(
            "node_resize_virtio_balloon_held_bytes",
            "Memory the balloon holds for the host (taken back from the VM by the "
            "hypervisor); deflate_on_oom: the guest takes it back under memory pressure.",
            labels=["deflate_on_oom"])
        if latest is not None:
            for d in sorted(latest.virtio_mem, key=lambda d: d.name):
                region.add_metric([d.name], d.region_bytes)
                plugged.add_metric([d.name], d.plugged_bytes)
                lowerable.add_metric([d.name], d.lowerable_bytes)
                if d.requested_bytes is not None:
                    requested.add_metric([d.name], d.requested_bytes)
            if latest.balloon_bytes is not None:
                oom = latest.balloon_deflate_on_oom
                held.add_metric(["unknown" if oom is None else str(oom).lower()],
                                latest.balloon_bytes)
        yield from (region, plugged, requested, lowerable, held)
