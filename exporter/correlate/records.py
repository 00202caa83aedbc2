"""The objects the episode tracker hands out, built on the path every new episode and every
update takes: episodes made and copied without their generated __init__, updates made, the
words for failed transitions."""
from __future__ import annotations

from enum import Enum

from exporter.correlate.model import Episode, EpisodeUpdate, UpdateKind
from exporter.events import Change, Resource, Result, Transition

# Every other field's default, for new_episode: all immutable (checked here), so sharing
# them is safe; the two lists are given anew each time.
_DEFAULTS = {k: v for k, v in Episode(id="", resource=Resource.CPU, change=Change.INCREASE,
                                      opened=0.0).__dict__.items()
             if k not in ("transitions", "pods")}
assert all(isinstance(v, (str, float, int, Enum, type(None))) for v in _DEFAULTS.values())


def new_episode(**fields: object) -> Episode:
    """Episode(**fields) without its generated __init__ (18 fields, two default factories),
    which costs more than a plain dict update, on the path every new episode takes."""
    ep = object.__new__(Episode)
    attrs = ep.__dict__
    attrs.update(_DEFAULTS)  # two updates: cheaper than one that also takes keywords
    attrs.update(fields)
    attrs["pods"] = []
    return ep


def copy_episode(ep: Episode) -> Episode:
    """A copy sinks may keep: the two lists are the only mutable parts. (dataclasses.replace
    re-runs __init__ field by field and was a fifth of the correlator's time.)"""
    new = object.__new__(Episode)
    new.__dict__.update(ep.__dict__)
    new.transitions = list(ep.transitions)
    new.pods = list(ep.pods)
    return new


def make_update(kind: UpdateKind, episode: Episode, when: float) -> EpisodeUpdate:
    # EpisodeUpdate is frozen; its generated __init__ sets each field through
    # object.__setattr__, twice the cost of this (one update for every other event).
    update = object.__new__(EpisodeUpdate)
    update.__dict__.update(kind=kind, episode=episode, time=when)
    return update


def describe_failures(transitions: list[Transition]) -> str:
    failed = [t for t in transitions if t.result is Result.FAILED]
    words = []
    for t in failed[:4]:
        what = f"{'cpu' if t.resource is Resource.CPU else 'memory block '}{t.unit} " \
               f"{t.direction.value} failed"
        why = " ".join(x for x in (
            f"cpuhp state {t.failed_state}" if t.failed_state else "", t.error or "") if x)
        words.append(f"{what}: {why}" if why else what)
    if len(failed) > 4:
        words.append(f"and {len(failed) - 4} more")
    return "; ".join(words)
