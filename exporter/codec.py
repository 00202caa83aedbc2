"""Events and episodes <-> JSON-safe dicts, losslessly, with a "type" tag.

The journal stores these dicts, `episodes export` writes them one per line and `replay` reads
them back, so decode(encode(x)) == x must hold for every type: enums become their values,
frozensets sorted lists, Mapping[Resource, float] an object keyed by the resource's value.
The conversion is driven by the dataclasses' own type hints, so a field added to events.py is
carried without touching this file (as long as its type is one of the shapes handled below).
"""
from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from exporter import events as ev
from exporter.correlate import model

# Every type that may be the top level of an encoded dict, by its "type" tag: each member of
# the Event union (so an event type added to events.py is carried without a change here), and
# the episode types.
TAGGED: dict[str, type] = {
    cls.__name__: cls
    for cls in (*typing.get_args(ev.Event), model.Episode, model.EpisodeUpdate)
}
EVENT_TYPES = frozenset(TAGGED) - {"Episode", "EpisodeUpdate"}


class CodecError(ValueError):
    """A dict (or JSON line) that is not an encoding of a known type."""


_hints_cache: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _hints_cache.get(cls)
    if hints is None:
        module = vars(__import__(cls.__module__, fromlist=["_"]))
        hints = typing.get_type_hints(cls, globalns=module)
        _hints_cache[cls] = hints
    return hints


# ---------------------------------------------------------------- encode


def encode(obj: Any) -> dict[str, Any]:
    """A tagged, JSON-safe dict for an event, Episode or EpisodeUpdate."""
    name = type(obj).__name__
    if TAGGED.get(name) is not type(obj):
        raise CodecError(f"cannot encode {type(obj).__qualname__}: not an event or episode")
    out = _encode_dataclass(obj)
    return {"type": name, **out}


def _encode_dataclass(obj: Any) -> dict[str, Any]:
    return {f.name: _encode_value(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _encode_value(v: Any) -> Any:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (int, float, str)):
        return v
    if isinstance(v, (frozenset, set)):
        # Sorted so the same set always encodes to the same text (stable journal rows, diffs).
        return sorted((_encode_value(x) for x in v), key=lambda x: (str(type(x)), x))
    if isinstance(v, Mapping):
        return {_encode_key(k): _encode_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode_value(x) for x in v]
    if dataclasses.is_dataclass(v):
        return _encode_dataclass(v)
    raise CodecError(f"cannot encode a value of type {type(v).__qualname__}")


def _encode_key(k: Any) -> str:
    if isinstance(k, enum.Enum):
        return str(k.value)
    if isinstance(k, str):
        return k
    raise CodecError(f"cannot encode a mapping key of type {type(k).__qualname__}")


# ---------------------------------------------------------------- decode


def decode(d: Mapping[str, Any]) -> Any:
    """The object a dict from `encode` stands for; CodecError if it is not one."""
    if not isinstance(d, Mapping):
        raise CodecError(f"expected an object, got {type(d).__name__}")
    tag = d.get("type")
    cls = TAGGED.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise CodecError(f"unknown type tag {tag!r}")
    return _decode_dataclass(cls, d, path=tag)


def _decode_dataclass(cls: type, d: Any, path: str) -> Any:
    if not isinstance(d, Mapping):
        raise CodecError(f"{path}: expected an object, got {type(d).__name__}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            kwargs[f.name] = _decode_value(hints[f.name], d[f.name], f"{path}.{f.name}")
        elif (f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING):  # type: ignore[misc]
            raise CodecError(f"{path}: missing field {f.name!r}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CodecError(f"{path}: {e}") from e


def _decode_value(tp: Any, v: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _decode_value(option, v, path)
            except CodecError as e:
                errors.append(str(e))
        raise CodecError("; ".join(errors) or f"{path}: null not allowed")
    if tp is Any:
        return v
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(v)
        except ValueError:
            raise CodecError(f"{path}: {v!r} is not a {tp.__name__}") from None
    if tp is bool:
        if not isinstance(v, bool):
            raise CodecError(f"{path}: expected a boolean, got {v!r}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise CodecError(f"{path}: expected an integer, got {v!r}")
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CodecError(f"{path}: expected a number, got {v!r}")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise CodecError(f"{path}: expected a string, got {v!r}")
        return v
    if origin in (frozenset, set):
        if not isinstance(v, list):
            raise CodecError(f"{path}: expected a list, got {type(v).__name__}")
        return frozenset(_decode_value(args[0], x, path) for x in v)
    if origin in (list, tuple):
        if not isinstance(v, list):
            raise CodecError(f"{path}: expected a list, got {type(v).__name__}")
        return [_decode_value(args[0], x, f"{path}[{i}]") for i, x in enumerate(v)]
    if origin in (Mapping, dict, typing.Mapping):
        if not isinstance(v, Mapping):
            raise CodecError(f"{path}: expected an object, got {type(v).__name__}")
        kt, vt = args
        return {_decode_value(kt, k, path): _decode_value(vt, x, f"{path}[{k}]")
                for k, x in v.items()}
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, v, path)
    raise CodecError(f"{path}: no decoder for type {tp!r}")


# ---------------------------------------------------------------- JSON text


def dumps(obj: Any) -> str:
    """One compact JSON line. Non-finite floats are refused: they are not JSON."""
    try:
        return json.dumps(encode(obj), separators=(",", ":"), allow_nan=False)
    except ValueError as e:
        raise CodecError(f"cannot encode {type(obj).__name__}: {e}") from None


def loads(text: str) -> Any:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise CodecError(f"not JSON: {e}") from None
    return decode(d)
