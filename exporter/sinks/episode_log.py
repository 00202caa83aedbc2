"""The episode lines in the log, what an operator reads at 3 a.m.: one info line when an episode
opens, one when it starts flapping, one when it ends (id, resource, direction, outcome,
duration, and the detail that says why). Bounded: past LINES_PER_MINUTE lines in a minute, the
rest are counted and told in one summary line (at the next episode update after the minute, or
at shutdown); a flap storm is one episode anyway (README, "Flap storms").

Not a sink in the agent's list (that list is what node_resize_exporter_sink_errors_total shows):
the agent hands it every update itself.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable

from exporter.correlate.model import Episode, EpisodeUpdate, UpdateKind

log = logging.getLogger(__name__)

LINES_PER_MINUTE = 10
WINDOW_SECONDS = 60.0


def _what(ep: Episode) -> str:
    units = sorted({t.unit for t in ep.transitions if t.mechanism is None})
    name = "cpu" if ep.resource.value == "cpu" else "memory block "
    # Memory no block moved (virtio-mem, a balloon) is named by what moved it.
    mechanisms = sorted({t.mechanism for t in ep.transitions if t.mechanism is not None})
    shown = ", ".join([f"{name}{u}" for u in units[:4]] + mechanisms) + \
        (" ..." if len(units) > 4 else "")
    return f"{ep.resource.value} {ep.change.value} ({shown})"


def _began_flapping(ep: Episode) -> bool:
    """The update of the transition that made the episode flap (the first the other way)."""
    if not ep.flapping or not ep.transitions:
        return False
    last = ep.transitions[-1].direction.value
    return (ep.offline_transitions if last == "offline" else ep.online_transitions) == 1


class EpisodeLog:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 per_minute: int = LINES_PER_MINUTE) -> None:
        self._clock = clock
        self._per_minute = per_minute
        self._window_start = -float("inf")
        self._lines = 0  # lines written in this window
        self._held: Counter[str] = Counter()  # what was not written one by one, by kind

    def on_update(self, update: EpisodeUpdate) -> None:
        ep = update.episode
        # The fields a log index searches on, the same on every line of an episode.
        fields: dict[str, object] = {"episode": ep.id, "resource": ep.resource.value,
                                     "direction": ep.change.value}
        if update.kind is UpdateKind.OPENED:
            self._line("opened", fields, "episode %s opened: %s", ep.id, _what(ep))
        elif update.kind is UpdateKind.RESUMED:
            self._line("resumed", {**fields, "phase": ep.phase.value},
                       "episode %s resumed from the journal: %s (%s phase)", ep.id,
                       _what(ep), ep.phase.value)
        elif update.kind is UpdateKind.TRANSITION and _began_flapping(ep):
            self._line("flapping", {**fields, "flapping": True},
                       "episode %s flapping: %s went offline and online within the "
                       "coalescing window; one episode until the window passes quietly",
                       ep.id, ep.resource.value)
        elif update.kind is UpdateKind.ENDED and ep.outcome is not None:
            took = (ep.ended if ep.ended is not None else update.time) - ep.opened
            self._line(f"ended {ep.outcome.value}",
                       {**fields, "outcome": ep.outcome.value,
                        "duration_seconds": round(took, 3)},
                       "episode %s ended %s after %.1f s: %s%s",
                       ep.id, ep.outcome.value, took, _what(ep),
                       f"; {ep.detail}" if ep.detail else "")

    def _line(self, kind: str, fields: dict[str, object], msg: str, *args: object) -> None:
        now = self._clock()
        if now - self._window_start >= WINDOW_SECONDS:
            self.flush()
            self._window_start, self._lines = now, 0
        if self._lines < self._per_minute:
            self._lines += 1
            log.info(msg, *args, extra=fields)
        else:
            self._held[kind] += 1

    def flush(self) -> None:
        """The summary of what this window did not write one by one, if anything."""
        if not self._held:
            return
        held, self._held = self._held, Counter()
        log.info("episodes: %d more updates in the last minute, not logged one by one (%s); "
                 "`node-resize-exporter episodes list` has them all", sum(held.values()),
                 ", ".join(f"{n} {kind}" for kind, n in sorted(held.items())))

    def close(self) -> None:
        self.flush()
