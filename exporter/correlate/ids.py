"""Episode ids: short enough to read out and type, unique, the same on every replay.

    cpu-dec-20261123-103700-0k3m
    |   |   |        |      '- the microsecond within that second: 4 Crockford base32 digits
    |   |   |        '- UTC time of day the episode opened (its first transition's start)
    |   |   '- UTC date
    |   '- inc (hot-plug) or dec (hot-unplug)
    '- resource

The id is a function of (resource, change, opening microsecond) alone, as the old
`cpu-decrease-1795420060000000` was (the same information, so just as unique), and a replay of
the same events gives the same ids. The tracker adds "-2", "-3" for a second episode of the
same kind opened within the same microsecond (a flap). A prefix (`cpu-dec-20261123-1037`)
names the episodes of a minute.

Ids are opaque strings everywhere they are kept (the journal's key, the trace attribute, the
CLI's prefix match), so episodes from journals written with the old form keep their ids;
parse_id() reads both forms.
"""
from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass

from exporter.events import Change, Resource

# Crockford's base32, lower case: no i, l, o, u (nothing to misread between 1, l and 0, o).
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_CHANGE_WORD = {Change.INCREASE: "inc", Change.DECREASE: "dec"}
_WORD_CHANGE = {"inc": Change.INCREASE, "dec": Change.DECREASE,
                "increase": Change.INCREASE, "decrease": Change.DECREASE}
_RESOURCE = {r.value: r for r in Resource}
_KIND = {(r, c): f"{r.value}-{word}" for r in Resource for c, word in _CHANGE_WORD.items()}
# gmtime's range where %Y stays four digits; outside it (a hostile timestamp) the id falls
# back to the old form, which any finite time has.
_FIRST_SECOND, _END_SECOND = -62135596800, 253402300800  # 0001-01-01, 10000-01-01
_ID = re.compile(r"^(?P<res>[A-Za-z0-9-]+?)-(?P<change>inc|dec|increase|decrease)-"
                 r"(?:(?P<date>\d{8})-(?P<clock>\d{6})-(?P<micro>[0-9a-hjkmnp-tv-z]{4})"
                 r"|(?P<us>-?\d+))(?:-(?P<n>\d+))?$")


@dataclass(frozen=True)
class ParsedId:
    resource: Resource
    change: Change
    opened_us: int  # the microsecond the episode opened (exact: no float in between)
    n: int = 1  # 2, 3, ...: the collision guard's suffix

    @property
    def opened(self) -> float:
        return self.opened_us / 1e6


# Every pair of digits (10 bits): a microsecond (< 2**20) is two lookups, on the path every
# new episode takes.
_PAIRS = [a + b for a in ALPHABET for b in ALPHABET]


class IdMaker:
    """Formats ids; remembers the last second formatted (episodes come in bursts)."""

    def __init__(self) -> None:
        self._second = 0
        self._stamp = ""

    def make(self, resource: Resource, change: Change, began: float) -> str:
        us = int(began * 1e6)
        kind = _KIND[(resource, change)]
        second, micro = divmod(us, 1_000_000)
        if not _FIRST_SECOND <= second < _END_SECOND:
            return f"{kind}-{us}"
        if second != self._second or not self._stamp:
            self._second = second
            self._stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(second))
        return f"{kind}-{self._stamp}-{_PAIRS[micro >> 10]}{_PAIRS[micro & 1023]}"


def episode_id(resource: Resource, change: Change, began: float) -> str:
    return IdMaker().make(resource, change, began)


def parse_id(episode_id: str) -> ParsedId | None:
    """What an id says (new or old form), or None for a string that is neither."""
    m = _ID.match(episode_id)
    if m is None or m["res"] not in _RESOURCE:
        return None
    n = int(m["n"]) if m["n"] else 1
    if m["us"] is not None:
        opened_us = int(m["us"])
    else:
        try:
            second = time.strptime(m["date"] + m["clock"], "%Y%m%d%H%M%S")
        except ValueError:
            return None
        micro = 0
        for ch in m["micro"]:
            micro = micro * 32 + ALPHABET.index(ch)
        if micro >= 1_000_000:
            return None
        opened_us = calendar.timegm(second) * 1_000_000 + micro
    return ParsedId(_RESOURCE[m["res"]], _WORD_CHANGE[m["change"]], opened_us, n)
