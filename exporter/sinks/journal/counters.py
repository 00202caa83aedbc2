"""The hotplug counters carried across restarts within one boot (issue 36 M6).

A process killed with SIGKILL takes with it whatever it counted after the last scrape a
Prometheus made: the next process starts its counters at 0, Prometheus sees a reset, and
increase() never shows those transitions, though the journal holds them. So the journal keeps
one row per boot (table `counters`, keyed by the kernel's boot_id): the counts of every
transition committed to the journal in this boot, by every process, plus the changes each
start found while down. The journal's writer updates the row in the same transaction as the
events it counts (a count is in the row exactly when its event is in the journal); a new
process starts its counters from the row plus its own changes while down, and writes that
back before its first scrape. A reboot (another boot_id) starts at 0: what Prometheus expects
of a restarted node. The design, and what it does not cover, is in docs/reliability.md.

The row is a file's content: hostile or broken rows are refused whole (counted, logged once,
the counters start at 0), never raised.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.events import Direction, Resource, Result

TransitionKey = tuple[Resource, Direction, Result]
DownKey = tuple[Resource, Direction]
MAX_ROW_BYTES = 64 * 1024  # a real row is a few hundred bytes
MAX_COUNT = 2**53  # beyond a float's integers: Prometheus could not show it exactly anyway
# The boot id the kernel gives (/proc/sys/kernel/random/boot_id): a UUID.
BOOT_ID_PATH = "sys/kernel/random/boot_id"


class BadRow(ValueError):
    """A `counters` row that is not one this code writes."""


@dataclass
class Carried:
    """What the counters start from: transitions by (resource, direction, result), and the
    changes found while down by (resource, direction)."""

    transitions: dict[TransitionKey, int] = field(default_factory=dict)
    down_changes: dict[DownKey, int] = field(default_factory=dict)

    def plus_down(self, changes: Mapping[DownKey, int]) -> Carried:
        """This plus the changes a start found while down: each is a successful transition
        of its direction too (the kernel made it; no process saw it)."""
        out = Carried(dict(self.transitions), dict(self.down_changes))
        for (resource, direction), n in changes.items():
            if n > 0:
                out.down_changes[(resource, direction)] = \
                    out.down_changes.get((resource, direction), 0) + n
                key = (resource, direction, Result.SUCCESS)
                out.transitions[key] = out.transitions.get(key, 0) + n
        return out


def encode(transitions: Mapping[TransitionKey, int], down: Mapping[DownKey, int]) -> str:
    return json.dumps({
        "transitions": sorted([r.value, d.value, res.value, n]
                              for (r, d, res), n in transitions.items() if n),
        "down_changes": sorted([r.value, d.value, n] for (r, d), n in down.items() if n),
    }, separators=(",", ":"))


def _count(value: object) -> int:
    if type(value) is not int or not 0 <= value < MAX_COUNT:
        raise BadRow(f"count {str(value)[:40]!r} is not a whole number 0..2^53")
    return value


def decode(text: object) -> Carried:
    """The row's counts; BadRow for anything this code would not have written."""
    if not isinstance(text, str) or len(text) > MAX_ROW_BYTES:
        raise BadRow("not a text of at most 64 KiB")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise BadRow(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("transitions"), list) \
            or not isinstance(obj.get("down_changes", []), list):
        raise BadRow("not an object with a list of transitions")
    out = Carried()
    try:
        for item in obj["transitions"]:
            if not isinstance(item, list) or len(item) != 4:
                raise BadRow("a transition entry is not [resource, direction, result, n]")
            key = (Resource(item[0]), Direction(item[1]), Result(item[2]))
            if key in out.transitions:
                raise BadRow(f"{item[:3]} twice")
            out.transitions[key] = _count(item[3])
        for item in obj.get("down_changes", []):
            if not isinstance(item, list) or len(item) != 3:
                raise BadRow("a down-change entry is not [resource, direction, n]")
            dkey = (Resource(item[0]), Direction(item[1]))
            if dkey in out.down_changes:
                raise BadRow(f"{item[:2]} twice")
            out.down_changes[dkey] = _count(item[2])
    except (ValueError, TypeError) as e:  # an enum value we do not have (BadRow is one too)
        raise BadRow(str(e)[:120]) from None
    return out


def valid_boot_id(text: str) -> str | None:
    """The kernel's boot id (a UUID, 36 characters), or None for anything else."""
    boot = text.strip()
    if len(boot) == 36 and all(c in "0123456789abcdef-" for c in boot) \
            and [len(p) for p in boot.split("-")] == [8, 4, 4, 4, 12]:
        return boot
    return None
