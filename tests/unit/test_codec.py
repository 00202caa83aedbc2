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
from testkit.postmortem_samples import cpu_offline_episode

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
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(strategy(args[0]), max_size=3).map(tuple)
    if origin is tuple:  # a fixed shape: VirtioMemDevice.blocks' (block, plugged bytes)
        return st.tuples(*(strategy(a) for a in args))
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
    ('{"type": "Nope"}', "unknown type tag 'Nope'"),
    ('{"source": "bpf"}', "unknown type tag None"),
    ('[1, 2]', "not an event or episode: Expected `object`, got `array`"),
    ('not json', "not JSON"),
    ('{"type": "EventsLost", "source": "bpf", "count": 1, "time": 1.0} trailing', "not JSON"),
    ('{"type": "EventsLost", "source": "bpf", "time": 1.0}',
     "EventsLost: Object missing required field `count`"),
    ('{"type": "EventsLost", "source": "bpf", "count": "x", "time": 1.0}',
     r"Expected `int`, got `str` - at `\$.count`"),
    ('{"type": "EventsLost", "source": "bpf", "count": true, "time": 1.0}',
     r"Expected `int`, got `bool`"),
    ('{"type": "EventsLost", "source": "bpf", "count": 1, "time": null}',
     r"Expected `float`, got `null` - at `\$.time`"),
    ('{"type": "Transition", "source": "bpf", "resource": "gpu", "unit": 1, '
     '"direction": "online", "result": "success", "end": 1.0}',
     r"Invalid enum value 'gpu' - at `\$.resource`"),
    ("[" * 100_000, "not"),
])
def test_malformed_input_is_a_clear_codec_error(bad, words):
    with pytest.raises(codec.CodecError, match=words):
        codec.loads(bad)


# msgspec writes NaN and infinities as null: each place a float can sit must still refuse one,
# not write a null that reads back as None (optional fields) or as an unreadable row.
NON_FINITE = [
    ev.EventsLost(source="bpf", count=1, time=float("nan")),
    ev.Transition(source="bpf", resource=ev.Resource.CPU, unit=1, direction=ev.Direction.ONLINE,
                  result=ev.Result.SUCCESS, end=1.0, start=float("inf")),  # an optional float
    ev.NodeStatus(time=1.0, node="n", capacity={ev.Resource.CPU: float("-inf")},
                  allocatable={}),  # a mapping's value
    dataclasses.replace(cpu_offline_episode(), kubelet_after=float("nan")),
]


@pytest.mark.parametrize("obj", NON_FINITE, ids=lambda o: type(o).__name__)
def test_non_finite_float_is_refused_not_written_as_null(obj):
    with pytest.raises(codec.CodecError, match="NaN or infinity is not JSON"):
        codec.dumps(obj)


def test_none_is_written_as_null_and_read_back():
    t = ev.Transition(source="uevent", resource=ev.Resource.MEMORY, unit=150,
                      direction=ev.Direction.ONLINE, result=ev.Result.SUCCESS, end=1.0)
    text = codec.dumps(t)
    assert '"start":null' in text
    assert codec.loads(text) == t


def test_a_string_that_is_not_unicode_is_a_codec_error():
    bad = ev.MalformedInput(source="uevent", detail="ACTION=\udcff", time=1.0)
    with pytest.raises(codec.CodecError, match="MalformedInput"):
        codec.dumps(bad)


# Lines the hand-written codec this module replaced wrote (json.dumps: ASCII escapes, "1e+16",
# mapping keys in insertion order), and one edited by hand (spaces, an int for a float): journals
# and JSONL files written before the switch to msgspec must still read.
EARLIER_LINES = [
    ('{"type":"PodStatus","time":1e+16,"uid":"u-1","namespace":"d\\u00e9fault",'
     '"name":"balloon-\\u2603","phase":"Running","reason":"","ready":true,"deleted":false,'
     '"balloon":true,"requests":{"memory":1.5e-05,"cpu":0.5},"resize":{"pending_reason":'
     '"Deferred","in_progress":true,"in_progress_error":false,"desired":{"cpu":2.0},'
     '"applied":{}},"resource_version":""}',
     ev.PodStatus(time=1e16, uid="u-1", namespace="d\u00e9fault", name="balloon-\u2603",
                  phase="Running", reason="", ready=True, balloon=True,
                  requests={ev.Resource.CPU: 0.5, ev.Resource.MEMORY: 1.5e-05},
                  resize=ev.ContainerResize(pending_reason="Deferred", in_progress=True,
                                            desired={ev.Resource.CPU: 2.0}))),
    ('{"type":"KubeletFeatures","time":1795000000.5,"gates":{"InPlacePodVerticalScaling":true,'
     '"A":false},"native_metrics":["a","b"]}',
     ev.KubeletFeatures(time=1795000000.5, gates={"A": False, "InPlacePodVerticalScaling": True},
                        native_metrics=frozenset({"a", "b"}))),
    ('{"type":"PodResourcesAllocatable","time":1795000000.25,"cpu_ids":null,'
     '"memory_bytes":{"memory":1073741824}}',
     ev.PodResourcesAllocatable(time=1795000000.25, cpu_ids=None,
                                memory_bytes={"memory": 1 << 30})),
    ('{"type":"KernelSnapshot","time":1795000000.0,"cpus_online":[0,1,3],"cpus_offline":[2],'
     '"cpus_present":[0,1,2,3],"cpus_possible":[0,1,2,3],"memory_block_size":134217728,'
     '"memory_blocks_online":[1,5],"memory_blocks_offline":[],"mem_total_bytes":8589934592,'
     '"swap_total_bytes":0,"hugepages_bytes":{"hugepages-1Gi":1073741824,"hugepages-2Mi":0}}',
     ev.KernelSnapshot(time=1795000000.0, cpus_online=frozenset({0, 1, 3}),
                       cpus_offline=frozenset({2}), cpus_present=frozenset(range(4)),
                       cpus_possible=frozenset(range(4)), memory_block_size=1 << 27,
                       memory_blocks_online=frozenset({1, 5}), memory_blocks_offline=frozenset(),
                       mem_total_bytes=8 << 30, swap_total_bytes=0,
                       hugepages_bytes={ev.Resource.HUGEPAGES_1GI: 1 << 30,
                                        ev.Resource.HUGEPAGES_2MI: 0})),
    ('{ "type": "Transition", "source": "uevent", "resource": "cpu", "unit": 1,\n'
     '  "direction": "offline", "result": "success", "end": 1795000000 }',
     ev.Transition(source="uevent", resource=ev.Resource.CPU, unit=1,
                   direction=ev.Direction.OFFLINE, result=ev.Result.SUCCESS, end=1795000000.0)),
]


@pytest.mark.parametrize("line, obj", EARLIER_LINES,
                         ids=[type(obj).__name__ for _, obj in EARLIER_LINES])
def test_earlier_encodings_still_decode(line, obj):
    back = codec.loads(line)
    assert back == obj and type(back) is type(obj)
    assert codec.decode(json.loads(line)) == obj
    when = back.end if isinstance(back, ev.Transition) else back.time
    assert type(when) is float  # an int in the text is still a float field's float


def test_same_text_as_the_earlier_codec_for_ascii_objects():
    # The KernelSnapshot line above is what the earlier codec wrote: msgspec writes it unchanged.
    line, obj = EARLIER_LINES[3]
    assert codec.dumps(obj) == line


def test_refuses_foreign_objects():
    with pytest.raises(codec.CodecError):
        codec.encode(Phase.KERNEL)
    with pytest.raises(codec.CodecError):
        codec.encode(PodOutcome(time=1.0, namespace="a", name="b", uid="c",
                                outcome=PodVerdict.KEPT, reason=""))
