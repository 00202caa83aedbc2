"""Property-based tests of every parser of outside input: none may fail with anything but its
documented error, and well-formed input must come out right.

Examples per test: 10,000 under CI=true, a few hundred locally. The profiles are
applied per test (not loaded globally) so other hypothesis tests keep their own settings.
Deadlines are off: a slow machine must not turn into a failure (no timed assertions).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import re

import click
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exporter import codec
from exporter.clock import MonotonicWallClock
from exporter.config.types import ListenAddress
from exporter.events import DeviceChange, Direction, MalformedInput, PodStatus, Resource, Transition
from exporter.kube.convert import (
    Converted,
    LabelSelector,
    node_status,
    pdb_status,
    pod_status,
    selects,
)
from exporter.kube.quantity import parse_quantity
from exporter.sources import registry
from exporter.sources.kernel.bpf.record import HotplugRecord, RecordDecoder
from exporter.sources.kernel.sysfs import (
    MAX_CPUS,
    parse_cpu_list,
    parse_hotplug_states,
    parse_meminfo,
)
from exporter.sources.kernel.uevent import parse_uevent, to_event
from exporter.sources.kubelet import podresources_child
from exporter.sources.kubelet.podresources import MAX_MEMORY_ENTRIES, PodResourcesSource
from exporter.sources.kubelet.proto import podresources_pb2
from exporter.sources.registry import SourceList

CI = os.environ.get("CI") == "true"
_COMMON = dict(deadline=None, derandomize=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("fuzz-ci", max_examples=10_000, **_COMMON)
settings.register_profile("fuzz-dev", max_examples=300, **_COMMON)
FUZZ = settings(settings.get_profile("fuzz-ci" if CI else "fuzz-dev"))
# NRE_FUZZ_EXAMPLES: `make test`'s unprivileged pass of tests/unit proves they need no root;
# the 10,000 examples a test run again as root right after it, so that pass asks for fewer.
if os.environ.get("NRE_FUZZ_EXAMPLES", "").isdigit():
    FUZZ = settings(FUZZ, max_examples=max(1, int(os.environ["NRE_FUZZ_EXAMPLES"])))

NOW = 1_700_000_000.0


# ------------------------------------------------------------------ CPU lists


def _cpu_list_text(cpus: set[int]) -> str:
    """The kernel's own formatting: runs as a-b, singles as n."""
    parts, run = [], []
    for n in sorted(cpus):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts) + "\n"


@FUZZ
@given(st.sets(st.integers(0, 8191), max_size=64))
def test_cpu_list_round_trips(cpus):
    assert parse_cpu_list(_cpu_list_text(cpus)) == cpus


@FUZZ
@given(st.one_of(st.text(), st.from_regex(r"[0-9,\- \n]{0,30}", fullmatch=True),
                 st.builds(lambda a, b: f"{a}-{b}", st.integers(-2**70, 2**70),
                           st.integers(-2**70, 2**70))))
def test_cpu_list_garbage_is_value_error(text):
    try:
        cpus = parse_cpu_list(text)
    except ValueError:
        return
    assert all(isinstance(n, int) and 0 <= n < MAX_CPUS for n in cpus)


# ------------------------------------------------------------------ /proc/meminfo


@FUZZ
@given(st.dictionaries(st.builds(lambda a, b: a + b, st.sampled_from("AHMSa"),
                                 st.text("AHMSTabfhiklmortu_()0123456789", max_size=16)),
                       st.tuples(st.integers(0, 2**50), st.booleans()), max_size=12))
def test_meminfo_round_trips(fields):
    text = "".join(f"{k}:{' ' * 8}{v} kB\n" if kb else f"{k}: {v}\n"
                   for k, (v, kb) in fields.items())
    assert parse_meminfo(text) == {k: v * 1024 if kb else v for k, (v, kb) in fields.items()}


@FUZZ
@given(st.text())
def test_meminfo_garbage_is_value_error(text):
    try:
        out = parse_meminfo(text)
    except ValueError:
        return
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in out.items())


# ------------------------------------------------------------------ cpuhp states


@FUZZ
@given(st.dictionaries(st.integers(0, 300),
                       st.builds(lambda a, b: f"{a}:{b}", st.text("abcpux", min_size=1,
                                                                   max_size=8),
                                 st.text("abdeo_", min_size=1, max_size=10)), max_size=16))
def test_hotplug_states_round_trip(states):
    text = "".join(f"{n:3d}: {name}\n" for n, name in sorted(states.items()))
    assert parse_hotplug_states(text) == states


@FUZZ
@given(st.text())
def test_hotplug_states_garbage_is_value_error(text):
    try:
        states = parse_hotplug_states(text)
    except ValueError:
        return
    assert all(isinstance(n, int) and isinstance(v, str) for n, v in states.items())


# ------------------------------------------------------------------ uevent datagrams


_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")
_ACTIONS = st.sampled_from(["online", "offline", "add", "remove", "change", "bind", ""])
_DEVPATHS = st.one_of(
    st.builds(lambda kind, n: f"/devices/system/{kind}/{kind}{n}",
              st.sampled_from(["cpu", "memory"]), st.integers(0, 10**6)),
    st.sampled_from(["/devices/system/cpu/memory3", "/devices/system/cpu/cpu",
                     "/devices/virtual/net/lo", "/devices/system/memory/memory1/x",
                     "/devices/system/cpu/cpufreq"]),
    st.text(_CHARS, max_size=40),
)


@FUZZ
@given(_ACTIONS, _DEVPATHS, st.dictionaries(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0="),
            min_size=1, max_size=12),
    st.text(_CHARS, max_size=20), max_size=6))
def test_uevent_structured(action, devpath, extra):
    env = {**extra, "ACTION": action, "DEVPATH": devpath, "SUBSYSTEM": "x"}
    datagram = f"{action}@{devpath}".encode() + b"".join(
        b"\0" + f"{k}={v}".encode() for k, v in env.items())
    try:
        ev = parse_uevent(datagram)
    except ValueError:
        assert not action or not devpath
        return
    event = to_event(ev, NOW)
    m = re.fullmatch(r"/devices/system/(cpu|memory)/\1(\d+)", devpath, re.ASCII)
    if m is None or action not in ("online", "offline", "add", "remove"):
        assert event is None or not devpath.isascii()
        return
    resource = Resource.CPU if m.group(1) == "cpu" else Resource.MEMORY
    if action in ("online", "offline"):
        assert isinstance(event, Transition)
        assert (event.resource, event.unit, event.direction) == (
            resource, int(m.group(2)), Direction(action))
    else:
        assert isinstance(event, DeviceChange) and event.unit == int(m.group(2))


@FUZZ
@given(st.one_of(st.binary(max_size=512),
                 st.builds(lambda h, rest: h + b"\0" + rest,
                           st.sampled_from([b"offline@/devices/system/cpu/cpu1",
                                            b"online@/devices/system/memory/memory7", b"@",
                                            b"add@", b"\xff@\xfe"]),
                           st.binary(max_size=256))))
def test_uevent_random_bytes(datagram):
    # UnicodeDecodeError is a ValueError: the source counts both as MalformedInput.
    try:
        ev = parse_uevent(datagram)
    except ValueError:
        return
    event = to_event(ev, NOW)  # must never raise: the source does not guard it
    assert event is None or isinstance(event, (Transition, DeviceChange))


# ------------------------------------------------------------------ BPF ring buffer records


@FUZZ
@given(st.binary(min_size=ctypes.sizeof(HotplugRecord), max_size=ctypes.sizeof(HotplugRecord)),
       st.sampled_from([0, 128 << 20]), st.dictionaries(st.integers(-5, 300), st.text()))
def test_bpf_record_decoder(raw, block_size, states):
    rec = HotplugRecord.from_buffer_copy(raw)
    decoder = RecordDecoder(MonotonicWallClock(), states, block_size, page_size=4096)
    try:
        t = decoder.decode(rec)
    except ValueError:
        assert rec.kind not in (1, 2)
        return
    assert t.resource in (Resource.CPU, Resource.MEMORY) and t.unit >= 0


# ------------------------------------------------------------------ Kubernetes quantities


_SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P",
             "E", "e3", "E-2", "e+9"]


@FUZZ
@given(st.integers(0, 10**12), st.sampled_from(_SUFFIXES))
def test_quantity_integer_suffix(n, suffix):
    from decimal import ROUND_UP, Decimal, localcontext
    scale = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             "e3": 10**3, "E-2": Decimal("1e-2"), "e+9": 10**9}[suffix]
    # lightkube rounds up to thousandths; past 2^63 no node holds it.
    with localcontext(prec=80):
        expected = (Decimal(n) * scale).quantize(Decimal("0.001"), rounding=ROUND_UP)
    if expected > 2**63 - 1:
        with pytest.raises(ValueError, match="out of range"):
            parse_quantity(f"{n}{suffix}")
    else:
        assert parse_quantity(f"{n}{suffix}") == float(expected)


@FUZZ
@given(st.one_of(
    st.text(),
    st.from_regex(r"[+-]?[0-9]{0,8}\.?[0-9]{0,8}([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,6})?",
                  fullmatch=True),
    st.none(), st.booleans(), st.integers(), st.floats(), st.lists(st.integers(), max_size=2),
    st.integers(min_value=10**18, max_value=10**400), st.from_regex(r"-?[0-9]{18,400}",
                                                                      fullmatch=True),
))
def test_quantity_garbage_is_value_error(value):
    try:
        out = parse_quantity(value)
    except ValueError:
        return
    assert isinstance(out, float)
    assert math.isfinite(out) and 0 <= out <= 2**63  # No node holds anything else


# ------------------------------------------------------------------ Node and Pod JSON


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)
_QUANTITY = st.one_of(st.sampled_from(["2", "1500m", "8Gi", "129e6", "0.5", "", "-1", "1e99",
                                       "10Qi", "NaN", "-4", "1" * 400]), _JSON,
                      st.integers(min_value=10**18, max_value=10**400))
_RESOURCE_LIST = st.one_of(_JSON, st.dictionaries(
    st.sampled_from(["cpu", "memory", "hugepages-2Mi", "hugepages-1Gi", "pods", "x"]),
    _QUANTITY, max_size=5))


def _maybe(strategy):
    return st.one_of(strategy, _JSON)


_NODE = st.one_of(_JSON, st.fixed_dictionaries({}, optional={
    "metadata": _maybe(st.fixed_dictionaries({}, optional={
        "name": _maybe(st.text(min_size=1, max_size=10)),
        "resourceVersion": _maybe(st.text(max_size=5))})),
    "status": _maybe(st.fixed_dictionaries({}, optional={
        "capacity": _RESOURCE_LIST, "allocatable": _RESOURCE_LIST})),
}))

_CONDITION = _maybe(st.fixed_dictionaries({}, optional={
    "type": _maybe(st.sampled_from(["Ready", "PodResizePending", "PodResizeInProgress"])),
    "status": _maybe(st.sampled_from(["True", "False", "Unknown"])),
    "reason": _maybe(st.sampled_from(["", "Deferred", "Infeasible", "Error", "OutOfcpu"])),
}))
_CONTAINER = _maybe(st.fixed_dictionaries({}, optional={
    "name": _maybe(st.text(max_size=5)),
    "resources": _maybe(st.fixed_dictionaries({}, optional={"requests": _RESOURCE_LIST})),
    "allocatedResources": _RESOURCE_LIST,
}))
_POD = st.one_of(_JSON, st.fixed_dictionaries({}, optional={
    "metadata": _maybe(st.fixed_dictionaries({}, optional={
        "uid": _maybe(st.text(min_size=1, max_size=8)),
        "name": _maybe(st.text(max_size=8)), "namespace": _maybe(st.text(max_size=8)),
        "labels": _maybe(st.dictionaries(st.sampled_from(["node-resize-exporter.io/balloon",
                                                          "app"]),
                                         _maybe(st.sampled_from(["true", "x"])))),
        "resourceVersion": _maybe(st.text(max_size=5))})),
    "spec": _maybe(st.fixed_dictionaries({}, optional={
        "priorityClassName": _maybe(st.sampled_from(["system-balloon", "high"])),
        "containers": _maybe(st.lists(_CONTAINER, max_size=3))})),
    "status": _maybe(st.fixed_dictionaries({}, optional={
        "phase": _maybe(st.sampled_from(["Running", "Failed", "Pending"])),
        "reason": _maybe(st.sampled_from(["OutOfcpu", "UnexpectedAdmissionError"])),
        "resize": _maybe(st.sampled_from(["Deferred", "Infeasible", "InProgress", ""])),
        "conditions": _maybe(st.lists(_CONDITION, max_size=4)),
        "containerStatuses": _maybe(st.lists(_CONTAINER, max_size=3))})),
}))


@FUZZ
@given(_NODE)
def test_node_json_never_raises(obj):
    out = node_status(obj, NOW)  # problems are reported, never raised
    assert isinstance(out, Converted) and all(isinstance(p, str) for p in out.problems)
    if out.event is not None:
        assert out.event.node and all(isinstance(v, float) for v in out.event.capacity.values())


@FUZZ
@given(_POD, st.booleans(), st.booleans())
def test_pod_json_never_raises(obj, with_selector, deleted):
    selector = LabelSelector("node-resize-exporter.io/balloon=true") if with_selector else None
    out = pod_status(obj, NOW, selector, deleted=deleted)
    assert isinstance(out, Converted) and all(isinstance(p, str) for p in out.problems)
    if out.event is not None:
        assert isinstance(out.event, PodStatus) and out.event.uid
        assert out.event.deleted is deleted


_EXPRESSION = _maybe(st.fixed_dictionaries({}, optional={
    "key": _maybe(st.sampled_from(["app", "tier", ""])),
    "operator": _maybe(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "in"])),
    "values": _maybe(st.lists(_maybe(st.sampled_from(["web", "a"])), max_size=3))}))
_PDB = st.one_of(_JSON, st.fixed_dictionaries({}, optional={
    "metadata": _maybe(st.fixed_dictionaries({}, optional={
        "name": _maybe(st.text(max_size=8)), "namespace": _maybe(st.text(max_size=8)),
        "generation": _maybe(st.one_of(st.integers(), st.text(max_size=3), st.booleans()))})),
    "spec": _maybe(st.fixed_dictionaries({}, optional={
        "selector": _maybe(st.one_of(_JSON, st.fixed_dictionaries({}, optional={
            "matchLabels": _maybe(st.dictionaries(st.sampled_from(["app", "tier"]),
                                                  _maybe(st.sampled_from(["web", "a"])))),
            "matchExpressions": _maybe(st.lists(_EXPRESSION, max_size=3))}))),
        "unhealthyPodEvictionPolicy": _maybe(st.sampled_from(["AlwaysAllow", "x"]))})),
    "status": _maybe(st.fixed_dictionaries({}, optional={
        "disruptionsAllowed": _maybe(st.one_of(st.integers(), st.floats(), st.text(max_size=3))),
        "observedGeneration": _maybe(st.integers()),
        "disruptedPods": _maybe(_JSON)})),
}))


@FUZZ
@given(_PDB, st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["web", "a"])))
def test_pdb_json_never_raises_and_its_selector_always_answers(obj, labels):
    out = pdb_status(obj, NOW)
    assert isinstance(out, Converted) and all(isinstance(p, str) for p in out.problems)
    if out.event is not None:
        assert isinstance(out.event.disruptions_allowed, int)
        assert selects(out.event, labels) in (True, False, None)


@FUZZ
@given(st.text(max_size=40), st.dictionaries(st.text(max_size=5), st.text(max_size=5)))
def test_label_selector_garbage_is_value_error(text, labels):
    try:
        selector = LabelSelector(text)
    except ValueError:
        return
    assert selector.matches(labels) in (True, False)


# ------------------------------------------------------------------ JSONL lines (replay, journal)


_TAGS = st.sampled_from(sorted(codec.TAGGED) + ["Nope", ""])
_LINE = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.builds(lambda tag, body: json.dumps({"type": tag, **body}), _TAGS,
              st.dictionaries(st.sampled_from(["source", "time", "end", "unit", "count",
                                               "resource", "direction", "result", "cpus_online",
                                               "capacity", "episode", "kind", "transitions"]),
                              _JSON, max_size=6)),
)


@FUZZ
@given(_LINE)
def test_codec_line_is_an_event_or_a_codec_error(line):
    # `replay` and the journal read lines someone else may have written: CodecError only.
    try:
        obj = codec.loads(line)
    except codec.CodecError:
        return
    assert type(obj).__name__ in codec.TAGGED
    assert codec.loads(codec.dumps(obj)) == obj


# ------------------------------------------------------------------ podresources answers


def _emitted() -> tuple[list, callable]:
    events: list = []
    return events, events.append


@FUZZ
@given(st.one_of(
    st.binary(max_size=256),
    # Valid answers, re-encoded with random tails: the decoder must still cope.
    st.builds(lambda cpus, mem, tail: podresources_pb2.AllocatableResourcesResponse(
        cpu_ids=cpus, memory=[podresources_pb2.ContainerMemory(memory_type=t, size=s)
                              for t, s in mem]).SerializeToString() + tail,
              st.lists(st.integers(-2**63, 2**63 - 1), max_size=8),
              st.lists(st.tuples(st.sampled_from(["memory", "hugepages-2Mi", ""]),
                                 st.integers(0, 2**64 - 1)), max_size=3),
              st.binary(max_size=16)),
))
def test_podresources_answer_bytes(raw):
    # The source's decode path: in the poll's child process grpc hands the bytes to FromString
    # (DecodeError becomes an INTERNAL RpcError the source reports as MalformedInput) and
    # reduce() makes the reply, which crosses the pipe as JSON; then _convert.
    try:
        answer = podresources_pb2.AllocatableResourcesResponse.FromString(raw)
    except DecodeError:
        return
    source = PodResourcesSource(MonotonicWallClock(), socket_path="/nonexistent")
    reply = json.loads(json.dumps(podresources_child.reduce(
        answer, source._possible_cpus(), MAX_MEMORY_ENTRIES)))
    events, emit = _emitted()
    event = source._convert(reply, NOW, emit)
    assert all(isinstance(e, MalformedInput) for e in events)
    assert event.cpu_ids is None or all(n >= 0 for n in event.cpu_ids)
    assert all(v >= 0 for v in event.memory_bytes.values())


# ------------------------------------------------------------------ CLI values


@FUZZ
@given(st.one_of(st.text(max_size=30),
                 st.builds(lambda h, p: f"{h}:{p}",
                           st.sampled_from(["", "0.0.0.0", "[::]", "::1", "localhost", "x"]),
                           st.integers(-5, 70000))))
def test_listen_garbage_is_config_error(value):
    try:
        host, port = ListenAddress().convert(value, None, None)
    except click.BadParameter:
        return
    assert 0 < port < 65536 and isinstance(host, str)


@FUZZ
@given(st.text(max_size=30))
@example("MANAGED_PAGES")  # a source's name in capitals: a source (found by CI's 10,000 examples)
def test_sources_garbage_is_config_error(value):
    try:
        names = SourceList().convert(value, None, None)
    except click.BadParameter:
        return
    # Accepted: "auto", or only registered sources' names, each one the value names
    # (any case: "MANAGED_PAGES" is managed_pages).
    registered = {spec.name for spec in registry.specs()}
    assert names == ("auto",) or (set(names) <= registered and all(
        n in value.lower() for n in names)), (value, names)
