"""/sys/devices/system/memory/auto_online_blocks: does a hot-added memory block come online?

"offline" (the kernel default without CONFIG_MEMORY_HOTPLUG_DEFAULT_ONLINE) means a hot-added
DIMM stays offline until a udev rule or an agent onlines it: present, but not capacity. Read at
start, after every memory-block event (the kubelet sink pokes this source) and on a slow timer:
sysfs gives no notification when root changes the policy.
"""
from __future__ import annotations

from pathlib import Path

from exporter.clock import Clock
from exporter.config.options import SYSFS_ROOT
from exporter.events import MalformedInput, MemoryAutoOnline, Resource
from exporter.sources.base import Emit
from exporter.sources.registry import KERNEL, SourceSpec, register
from exporter.sources.wake import STATE_INTERVAL, PokedSource
from exporter.untrusted import read_text

POLICIES = frozenset({"offline", "online", "online_kernel", "online_movable"})


def parse_auto_online(text: str, now: float) -> MemoryAutoOnline:
    policy = text.strip()
    if policy not in POLICIES:
        raise ValueError(f"unknown auto_online_blocks policy {policy[:40]!r}")
    return MemoryAutoOnline(now, policy)


class MemoryAutoOnlineSource(PokedSource):
    name = "memory_auto_online"

    def __init__(self, clock: Clock, sysfs: str = "/sys",
                 interval: float = STATE_INTERVAL):
        super().__init__(clock)
        self.path = Path(sysfs) / "devices/system/memory/auto_online_blocks"
        self.interval = interval
        self._last = ""

    def up_reason(self) -> str:
        # Up even without the file (no memory hotplug in this kernel): then there is no policy.
        return str(self.path)

    def read(self, emit: Emit) -> None:
        now = self.clock.now()
        try:
            event = parse_auto_online(read_text(self.path, 64), now)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            emit(MalformedInput(self.name, f"{self.path}: {e}", now))
            return
        if event.policy != self._last:
            self._last = event.policy
            emit(event)


register(SourceSpec(
    "memory_auto_online", KERNEL, "sysfs auto_online_blocks (hot-added memory policy)",
    lambda ctx: MemoryAutoOnlineSource(ctx.clock, SYSFS_ROOT.of(ctx.options)), order=70,
    selectable=False, poked_by=frozenset({Resource.MEMORY})))
