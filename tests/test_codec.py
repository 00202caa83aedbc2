"""codec: every event type and Episode survive encode -> JSON text -> decode unchanged."""
from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import codec
from exporter import events as ev
from exporter.correlate.model import EpisodeUpdate, Phase, PodOutcome, PodVerdict, UpdateKind
from tests.postmortem_samples import cpu_offline_episode

FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
TEXT = st.text(max_size=12)


def strategy(tp):
    """A hypothesis strategy for any field type the event dataclasses use."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy(a) for a in args))
    if tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if tp is float:
        return FINITE
    if tp is str:
        return TEXT
    if origin in (frozenset, set):
        return st.frozensets(strategy(args[0]), max_size=5)
    if origin is list:
        return st.lists(strategy(args[0]), max_size=3)
    if origin in (Mapping, dict):
        return st.dictionaries(strategy(args[0]), strategy(args[1]), max_size=4)
    if dataclasses.is_dataclass(tp):
        return dataclass_strategy(tp)
    raise AssertionError(f"no strategy for {tp!r}")


def dataclass_strategy(cls):
    hints = typing.get_type_hints(cls, globalns=vars(__import__(cls.__module__, fromlist=["_"])))
    return st.builds(cls, **{f.name: strategy(hints[f.name]) for f in dataclasses.fields(cls)})


ALL_TYPES = [codec.TAGGED[name] for name in sorted(codec.TAGGED)]


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_every_type(cls, data):
    obj = data.draw(dataclass_strategy(cls))
    text = codec.dumps(obj)
    back = codec.loads(text)
    assert back == obj
    assert type(back) is type(obj)
    # Stable: encoding the decoded object gives the same text (journal rows, diffs).
    assert codec.dumps(back) == text


def test_enum_and_set_shapes_are_plain_json():
    t = ev.Transition(source="bpf", resource=ev.Resource.CPU, unit=1,
                      direction=ev.Direction.OFFLINE, result=ev.Result.FAILED, end=2.5, start=2.0,
                      steps=12, failed_state="85", error="ret=-16")
    d = codec.encode(t)
    assert d["type"] == "Transition"
    assert d["resource"] == "cpu" and d["direction"] == "offline" and d["result"] == "failed"
    snap = ev.KernelSnapshot(time=1.0, cpus_online=frozenset({1, 0}), cpus_offline=frozenset(),
                             cpus_present=frozenset({0, 1}), cpus_possible=frozenset({0, 1}),
                             memory_block_size=1 << 27, memory_blocks_online=frozenset({3}),
                             memory_blocks_offline=frozenset(), mem_total_bytes=10,
                             swap_total_bytes=0,
                             hugepages_bytes={ev.Resource.HUGEPAGES_2MI: 4 << 20})
    d = json.loads(codec.dumps(snap))
    assert d["cpus_online"] == [0, 1]
    assert d["hugepages_bytes"] == {"hugepages-2Mi": 4 << 20}
    back = codec.decode(d)
    assert back.hugepages_bytes[ev.Resource.HUGEPAGES_2MI] == 4 << 20
    assert isinstance(back.cpus_online, frozenset)


def test_nested_container_resize_and_episode():
    pod = ev.PodStatus(time=5.0, uid="u", namespace="ns", name="balloon", phase="Running",
                       reason="", ready=True, balloon=True, requests={ev.Resource.CPU: 0.5},
                       resize=ev.ContainerResize(pending_reason="Deferred", in_progress=True,
                                                 desired={ev.Resource.MEMORY: 2.0**30}))
    assert codec.loads(codec.dumps(pod)) == pod
    ep = cpu_offline_episode()
    back = codec.loads(codec.dumps(ep))
    assert back == ep
    assert isinstance(back.transitions[0], ev.Transition)
    assert back.pods[0].outcome is PodVerdict.REJECTED
    upd = EpisodeUpdate(kind=UpdateKind.ENDED, episode=ep, time=ep.ended)
    assert codec.loads(codec.dumps(upd)) == upd


@pytest.mark.parametrize("bad, words", [
    ('{"type": "Nope"}', "unknown type tag"),
    ('[1, 2]', "expected an object"),
    ('not json', "not JSON"),
    ('{"type": "EventsLost", "source": "bpf", "time": 1.0}', "missing field 'count'"),
    ('{"type": "EventsLost", "source": "bpf", "count": "x", "time": 1.0}', "expected an integer"),
    ('{"type": "Transition", "source": "bpf", "resource": "gpu", "unit": 1, '
     '"direction": "online", "result": "success", "end": 1.0}', "is not a Resource"),
])
def test_malformed_input_is_a_clear_codec_error(bad, words):
    with pytest.raises(codec.CodecError, match=words):
        codec.loads(bad)


def test_non_finite_float_is_refused_not_written_as_invalid_json():
    lost = ev.EventsLost(source="bpf", count=1, time=float("nan"))
    with pytest.raises(codec.CodecError):
        codec.dumps(lost)


def test_refuses_foreign_objects():
    with pytest.raises(codec.CodecError):
        codec.encode(Phase.KERNEL)
    with pytest.raises(codec.CodecError):
        codec.encode(PodOutcome(time=1.0, namespace="a", name="b", uid="c",
                                outcome=PodVerdict.KEPT, reason=""))
