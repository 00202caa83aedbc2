"""Events and episodes <-> JSON, losslessly, with a "type" tag, through msgspec.

The journal stores one JSON object per event or episode, `episodes export` writes them one per
line and `replay` reads them back, so decode(encode(x)) == x must hold for every type. msgspec
converts the dataclasses by their own type hints (enums as their values, frozensets as sorted
lists, Mapping[Resource, float] as an object keyed by the resource's value), so a field added to
events.py is carried without touching this file.

The format is `{"type": "<class name>", <the dataclass's fields>}`, the one journals and JSONL
files already hold. msgspec's own tagged unions are for msgspec.Struct types only, and the
events are stdlib dataclasses every module shares, so the tag is written here ahead of msgspec's
encoding of the dataclass and read back by a Struct that looks at the tag alone; msgspec then
decodes the same text straight into the tagged class.
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import msgspec

from exporter import events as ev
from exporter.correlate import model

# Every type that may be the top level of an encoded object, by its "type" tag: each member of
# the Event union (so an event type added to events.py is carried without a change here), and
# the episode types.
TAGGED: dict[str, type] = {
    cls.__name__: cls
    for cls in (*typing.get_args(ev.Event), model.Episode, model.EpisodeUpdate)
}
EVENT_TYPES = frozenset(TAGGED) - {"Episode", "EpisodeUpdate"}

# The tag is spliced in front of msgspec's `{...}`: that needs at least one field to follow it.
assert all(dataclasses.fields(cls) for cls in TAGGED.values())

# "deterministic": set elements and mapping keys sorted, so equal objects give equal text
# (stable journal rows, diffs); dataclass fields keep their declared order.
_ENCODER = msgspec.json.Encoder(order="deterministic")
_PREFIX = {cls: b'{"type":' + msgspec.json.encode(name) + b"," for name, cls in TAGGED.items()}
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    name: msgspec.json.Decoder(cls) for name, cls in TAGGED.items()}


class _Tag(msgspec.Struct):
    """Reads only the "type" member of an encoded object (msgspec skips the others)."""

    type: Any = None


_TAG_DECODER = msgspec.json.Decoder(_Tag)


class CodecError(ValueError):
    """An object that cannot be encoded, or text that is not an encoding of a known type."""


def _tagged_class(obj: Any) -> type:
    cls = type(obj)
    if TAGGED.get(cls.__name__) is not cls:
        raise CodecError(f"cannot encode {cls.__qualname__}: not an event or episode")
    return cls


def _class_for_tag(tag: Any) -> type:
    cls = TAGGED.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise CodecError(f"unknown type tag {tag!r}")
    return cls


# ---------------------------------------------------------------- dicts


def encode(obj: Any) -> dict[str, Any]:
    """A tagged, JSON-safe dict for an event, Episode or EpisodeUpdate."""
    cls = _tagged_class(obj)
    try:
        body = msgspec.to_builtins(obj, order="deterministic")
    except (TypeError, ValueError) as e:
        raise CodecError(f"cannot encode {cls.__name__}: {e}") from None
    return {"type": cls.__name__, **body}


def decode(d: Mapping[str, Any]) -> Any:
    """The object a dict from `encode` stands for; CodecError if it is not one."""
    if not isinstance(d, Mapping):
        raise CodecError(f"expected an object, got {type(d).__name__}")
    cls = _class_for_tag(d.get("type"))
    try:
        return msgspec.convert(d, cls)  # the "type" member is not a field: ignored
    except msgspec.ValidationError as e:
        raise CodecError(f"{cls.__name__}: {e}") from None


# ---------------------------------------------------------------- JSON text


def dumps(obj: Any) -> str:
    """One compact JSON line. Non-finite floats are refused: they are not JSON."""
    cls = _tagged_class(obj)
    try:
        body = _ENCODER.encode(obj)
    except (TypeError, ValueError) as e:  # UnicodeEncodeError (a lone surrogate) included
        raise CodecError(f"cannot encode {cls.__name__}: {e}") from None
    # msgspec writes NaN and infinities as null, and has no switch to refuse them. A null that
    # stands for None decodes back to an equal object; one that stood for a non-finite float
    # does not (or does not decode at all). Only objects with a null pay for the check.
    if b"null" in body and not _survives(cls, body, obj):
        raise CodecError(f"cannot encode {cls.__name__}: NaN or infinity is not JSON")
    return (_PREFIX[cls] + body[1:]).decode()


def _survives(cls: type, body: bytes, obj: Any) -> bool:
    try:
        return bool(_DECODERS[cls.__name__].decode(body) == obj)
    except msgspec.ValidationError:
        return False


def loads(text: str | bytes) -> Any:
    """The object one JSON line from `dumps` stands for; CodecError if it is not one."""
    try:
        tag = _TAG_DECODER.decode(text).type
    except msgspec.ValidationError as e:  # JSON, but not an object
        raise CodecError(f"not an event or episode: {e}") from None
    except msgspec.DecodeError as e:
        raise CodecError(f"not JSON: {e}") from None
    cls = _class_for_tag(tag)
    try:
        return _DECODERS[cls.__name__].decode(text)
    except msgspec.DecodeError as e:  # ValidationError included: names the field ("$.count")
        raise CodecError(f"{cls.__name__}: {e}") from None
