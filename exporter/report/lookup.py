"""Finding the episode a user named, and the node it happened on, in a journal or a replay.

IDs are whatever the correlator makes (short human ones, or older long ones): an exact ID wins,
otherwise a prefix must name exactly one episode, and a prefix that names several says which.
"""
from __future__ import annotations

from typing import Any, Iterable

from exporter.correlate.model import Episode
from exporter.events import NodeStatus

SHOWN = 5  # candidates named in an "ambiguous" message


class NotFound(Exception):
    """No episode, or more than one, answers to the ID given; the message says which."""


def match(episodes: Iterable[Episode], wanted: str, where: str) -> Episode:
    episodes = list(episodes)
    exact = [ep for ep in episodes if ep.id == wanted]
    if exact:
        return exact[-1]
    found = [ep for ep in episodes if wanted and ep.id.startswith(wanted)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFound(f"no episode {wanted!r} in {where} (an unambiguous prefix of an id also "
                       "works; see `episodes list`)")
    names = ", ".join(ep.id for ep in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    raise NotFound(f"{wanted!r} is ambiguous in {where}: it matches {len(found)} episodes "
                   f"({names}{more}); give more of the id")


def node_name(events: Iterable[Any], ep: Episode) -> str | None:
    """The node of the last Node status seen up to the episode's end (the agent watches only
    its own Node, so any of them names it)."""
    end = ep.ended if ep.ended is not None else float("inf")
    node = None
    for event in events:
        if isinstance(event, NodeStatus) and event.node:
            if event.time <= end or node is None:
                node = event.node
    return node
