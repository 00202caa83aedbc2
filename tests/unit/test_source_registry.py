"""A new source is one file: this module registers a toy source, with an option and its roles,
and the exporter opens it, pokes it after another source's kernel events, counts its events
(and its losses from 0, since it says it is lossy) and lists it in `check`; nothing else names
it. The agent, metrics and privileges read the registry's traits, never a source's name."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from exporter import app
from exporter.cli.check import render, run_checks
from exporter.clock import MonotonicWallClock
from exporter.config import options as option_table
from exporter.config.options import Opt, Options
from exporter.events import Resource, SourceStatus
from exporter.sources import registry
from exporter.sources.base import Emit, Source
from exporter.sources.registry import KERNEL, SourceSpec
from testkit.exporter_proc import poll_until

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "small-node"


class ToySource(Source):
    """Says it is up, then once more each time it is poked."""

    name = "toy"

    def __init__(self, clock: MonotonicWallClock, greeting: str) -> None:
        super().__init__(clock)
        self.greeting = greeting
        self.pokes: list[Resource] = []
        self._poked = threading.Event()

    def poke(self, resource: Resource) -> None:
        self.pokes.append(resource)
        self._poked.set()

    def loop(self, emit: Emit) -> None:
        emit(SourceStatus(self.name, True, self.clock.now(), self.greeting))
        while not self.stopping.is_set():
            if self._poked.wait(0.05):
                self._poked.clear()
                emit(SourceStatus(self.name, True, self.clock.now(), "poked"))

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        super().stop(timeout)


TOY_GREETING: Opt[str] = Opt("toy_greeting", ("--toy.greeting",), "hello",
                              "What the toy says first.")
TOY = SourceSpec(
    "toy", KERNEL, "a toy source", lambda ctx: ToySource(ctx.clock, TOY_GREETING.of(ctx.options)),
    order=40, options=(TOY_GREETING,),
    poked_by=frozenset({Resource.CPU}), lossy=True,
    capabilities_after_start=lambda: frozenset({"CAP_BPF"}))


@pytest.fixture
def toy(monkeypatch):
    """TOY registered as its module would register itself, taken out again afterwards."""
    registry.load()
    monkeypatch.setattr(option_table, "TABLE", dict(option_table.TABLE))
    monkeypatch.setattr(option_table, "_FLAGS", dict(option_table._FLAGS))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register(TOY)
    return TOY


def wait(condition, what: str) -> None:
    poll_until(condition, bool, 30, 0.02, lambda _: AssertionError(f"never: {what}"))


@pytest.fixture
def node(tmp_path):
    """A sysfs and procfs copy with cpu3 offline."""
    shutil.copytree(FIXTURE, tmp_path / "node")
    return tmp_path / "node"


def test_the_toy_is_a_choice_with_its_option(toy):
    assert "toy" in registry.kernel_source_names()
    assert registry.SourceList().convert("sysfs,toy", None, None) == ("sysfs", "toy")
    assert TOY_GREETING.of(Options(toy_greeting="hi")) == "hi"
    assert "toy" in registry.lossy_names()


def test_the_toy_is_opened_poked_counted_and_keeps_what_it_declares(toy, node):
    # sysfs chosen too: its reads report the transitions they see
    options = Options(sources=("sysfs", "toy"), kubernetes="off", no_journal=True,
                      sysfs_root=str(node / "sys"), procfs_root=str(node / "proc"),
                      sysfs_interval=0.05)
    built = app.build_agent(options, MonotonicWallClock())
    agent = built.agent
    assert [s.name for s in agent.sources] == ["sysfs", "toy", "memory_auto_online"]
    assert built.keep == {"CAP_BPF"}  # its capabilities_after_start
    toy_source = next(s for s in agent.sources if s.name == "toy")
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        assert agent.alive.wait(30)
        # The kernel onlines cpu3; the reconciler's next read reports it: a CPU event of
        # another source, so the toy is poked, and says so.
        (node / "sys/devices/system/cpu/online").write_text("0-3\n")
        (node / "sys/devices/system/cpu/offline").write_text("\n")
        wait(lambda: toy_source.pokes, "the toy poked")
        assert set(toy_source.pokes) == {Resource.CPU}
        wait(lambda: built.metrics.ledger.events.get("toy", 0) >= 2, "its event counted")
    finally:
        stop.set()
        agent.wake()
        runner.join(30)
    families = {f.name: f for f in built.metrics.collect()}
    events = {s.labels["source"]: s.value for s in families["node_resize_exporter_events"].samples
              if s.name.endswith("_total")}
    lost = {s.labels["source"]: s.value
            for s in families["node_resize_exporter_events_lost"].samples
            if s.name.endswith("_total")}
    assert events["toy"] >= 2 and lost == {"toy": 0}  # lossy: its losses exist from 0


def test_check_lists_the_toy_only_when_asked(toy, node):
    common = dict(kubernetes="off", no_journal=True, web_listen_address=("127.0.0.1", 0),
                  sysfs_root=str(node / "sys"), procfs_root=str(node / "proc"))
    text, status = render(run_checks(Options(sources=("toy",), **common)))
    assert "OK   toy source: opens (a toy source)" in text and status == 0, text
    assert "bpf source" not in text and "BPF source" not in text  # not asked for
    text, _ = render(run_checks(Options(sources=("sysfs",), **common)))
    assert "toy source" not in text


def test_the_registry_names_the_source_and_refuses_a_source_named_otherwise():
    """Issue 34: a source's `name` was declared beside its spec's and nothing checked they
    match: its series, pokes and log lines would name a source nobody registered."""
    class Unnamed(ToySource):
        name = Source.name  # the base's default: the registry gives it the spec's

    class Misnamed(ToySource):
        name = "toy2"

    ctx = registry.SourceContext(Options(), MonotonicWallClock(), "n1")
    built = SourceSpec("toy", KERNEL, "toy", lambda c: Unnamed(c.clock, "hi")).build(ctx)
    assert built.name == "toy"
    with pytest.raises(ValueError, match="named 'toy2'.*name = 'toy'"):
        SourceSpec("toy", KERNEL, "toy", lambda c: Misnamed(c.clock, "hi")).build(ctx)
