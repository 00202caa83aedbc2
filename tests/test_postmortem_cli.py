"""The postmortem CLI: episodes list/show/export, replay, report, on a journal a live run wrote."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import click
import pytest
from click.testing import CliRunner

from exporter import codec
from exporter.clock import FakeClock
from exporter.cli import main
from exporter.cli_postmortem import register, replay_events
from exporter.correlate import Correlator, CorrelatorConfig
from exporter.correlate.model import Outcome
from exporter.events import (Direction, KernelSnapshot, NodeStatus, PodStatus, Resource, Result,
                             Transition)
from exporter.report import timeline
from exporter.sinks.journal import Journal
from tests.postmortem_samples import T0, cpu_offline_episode

GiB = 2**30
CONFIG = CorrelatorConfig(resync_deadline=60.0, kubernetes=True)


@click.group()
def standalone() -> None:
    """A bare group: register() must give it every postmortem command."""


register(standalone)
cli = main  # the real `node-resize-exporter` group, as users run it


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output + result.stderr
    return result


def snapshot(t: float, cpus: int) -> KernelSnapshot:
    online = frozenset(range(cpus))
    return KernelSnapshot(time=t, cpus_online=online, cpus_offline=frozenset({0, 1}) - online,
                          cpus_present=frozenset({0, 1}), cpus_possible=frozenset({0, 1}),
                          memory_block_size=2**27, memory_blocks_online=frozenset(range(192)),
                          memory_blocks_offline=frozenset(), mem_total_bytes=24 * GiB,
                          swap_total_bytes=0)


def node(t: float, cpu: float) -> NodeStatus:
    return NodeStatus(time=t, node="n1", capacity={Resource.CPU: cpu, Resource.MEMORY: 24 * GiB},
                      allocatable={Resource.CPU: cpu, Resource.MEMORY: 24 * GiB})


def pod(t: float, uid: str, phase: str = "Running", reason: str = "") -> PodStatus:
    return PodStatus(time=t, uid=uid, namespace="default", name=f"pod-{uid}", phase=phase,
                     reason=reason, ready=phase == "Running")


def cpu(t: float, direction: Direction, result: Result = Result.SUCCESS, **kw) -> Transition:
    return Transition(source="bpf", resource=Resource.CPU, unit=1, direction=direction,
                      result=result, start=t - 0.03, end=t, steps=95, **kw)


def live_stream() -> list:
    """cpu1 offline -> resync -> a pod rejected; cpu1 online -> no resync; a refused offline."""
    return [
        snapshot(T0, 2), node(T0 + 0.1, 2), pod(T0 + 0.2, "a"), pod(T0 + 0.3, "b"),
        cpu(T0 + 10, Direction.OFFLINE), snapshot(T0 + 10.01, 1),
        node(T0 + 14, 1), pod(T0 + 14.5, "a", "Failed", "OutOfcpu"),
        cpu(T0 + 40, Direction.ONLINE), snapshot(T0 + 40.01, 2),
        cpu(T0 + 200, Direction.OFFLINE, Result.FAILED, failed_state="85", error="ret=-16"),
        snapshot(T0 + 200.01, 2),
    ]


@pytest.fixture
def live_journal(tmp_path):
    return write_live_journal(tmp_path / "journal.db")


def write_live_journal(path):
    """A journal written the way the agent writes it: event first, then the updates; ticks."""
    clock = FakeClock(T0)
    journal = Journal(path, clock=clock)
    correlator = Correlator(CONFIG, clock)
    for event in live_stream():
        t = codec_time(event)
        while clock.t + 0.5 < t:  # the agent ticks about twice a second
            clock.advance(0.5)
            for u in correlator.tick():
                journal.on_update(u)
        clock.t = max(clock.t, t)
        journal.on_event(event)
        for u in correlator.handle(event):
            journal.on_update(u)
    for _ in range(200):  # run on past every window
        clock.advance(0.5)
        for u in correlator.tick():
            journal.on_update(u)
    journal.close()
    return path


def codec_time(event) -> float:
    return getattr(event, "time", None) or event.end


def test_list_show_and_json(live_journal):
    out = run("episodes", "list", "--journal", str(live_journal)).output
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "RESOURCE", "DIRECTION", "START", "KERNEL", "RESYNC",
                                "READMISSION", "OUTCOME"]
    assert len(lines) == 4
    assert "converged" in lines[1] and "resync_timeout" in lines[2]
    assert "kernel_failed" in lines[3]
    assert "30.0 ms" in lines[1] and "4.00 s" in lines[1]  # kernel, resync (14 - 10)
    data = json.loads(run("episodes", "list", "--json", "--journal", str(live_journal)).output)
    assert [d["outcome"] for d in data] == ["converged", "resync_timeout", "kernel_failed"]
    first = codec.decode(data[0])
    assert first.resource is Resource.CPU and first.kubelet_after == 1.0
    assert data[0]["resync_seconds"] == pytest.approx(4.0)
    # --since: only what was active after the second episode began.
    since = str(T0 + 100)
    data = json.loads(run("episodes", "list", "--json", "--since", since,
                          "--journal", str(live_journal)).output)
    assert [d["outcome"] for d in data] == ["resync_timeout", "kernel_failed"]

    shown = run("episodes", "show", first.id, "--journal", str(live_journal)).output
    assert f"episode {first.id}: cpu decrease, converged" in shown
    assert "cpu1 offline started" in shown and "cpu1 offline done in 30.0 ms" in shown
    assert "Node capacity 1" in shown
    assert "pod default/pod-a REJECTED: OutOfcpu" in shown
    assert re.search(r"\+4\.030s .* resync .* Node capacity 1", shown)
    assert "ended: converged" in shown


def test_export_then_replay_reproduces_the_live_episodes(live_journal, tmp_path):
    result = run("episodes", "export", "--journal", str(live_journal), "--progress-every", "5")
    lines = result.stdout.splitlines()
    assert len(lines) == len(live_stream())
    assert [codec.loads(x) for x in lines] == live_stream()
    assert "exported 5/12 events" in result.stderr and "exported 12 events" in result.stderr
    exported = tmp_path / "events.jsonl"
    exported.write_text(result.stdout)
    live = json.loads(run("episodes", "list", "--json", "--journal", str(live_journal)).output)
    replayed = run("replay", str(exported), "--json", "--resync-deadline", "60")
    assert json.loads(replayed.stdout) == live
    assert "replayed 12 events: 3 episodes" in replayed.stderr
    # A window of the journal: only the second half of the events.
    part = run("episodes", "export", "--since", str(T0 + 40), "--journal", str(live_journal))
    assert len(part.stdout.splitlines()) == 4


def test_replay_skips_malformed_lines(tmp_path):
    events = live_stream()[:6]
    f = tmp_path / "e.jsonl"
    f.write_text("\n".join([codec.dumps(e) for e in events[:3]] + ["{broken", '{"type": "X"}',
                           codec.dumps(cpu_offline_episode())]
                           + [codec.dumps(e) for e in events[3:]]) + "\n")
    result = run("replay", str(f), "--json")
    assert "skipped 3 lines" in result.stderr
    (ep,) = json.loads(result.stdout)
    direct = replay_events(events, CorrelatorConfig(kubernetes=True))
    assert [codec.decode(ep)] == direct


def test_report_svg_has_the_phases(live_journal, tmp_path):
    ep_id = json.loads(run("episodes", "list", "--json", "--journal",
                           str(live_journal)).output)[0]["id"]
    out = tmp_path / "episode.svg"
    run("report", ep_id, "--output", str(out), "--journal", str(live_journal))
    root = ET.fromstring(out.read_text())  # well-formed XML
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "kernel cpu1" in texts
    assert "kubelet.resync" in texts and "kubelet.readmission" in texts
    assert "cpu1 offline 30.0 ms" in texts
    assert "resync 4.00 s" in texts
    assert "default/pod-a rejected (OutOfcpu)" in texts
    rects = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if "bar" in
             r.get("class", "")]
    assert [r.get("class") for r in rects] == ["bar transition", "bar resync", "bar readmission"]
    circles = list(root.iter("{http://www.w3.org/2000/svg}circle"))
    assert [c.get("class") for c in circles] == ["marker rejected", "marker kept"]
    assert any(t.startswith("default/pod-b kept") for t in texts), texts


def test_report_png_draws_the_expected_series(tmp_path):
    ep = cpu_offline_episode()
    tl = timeline.build(ep)
    assert tl.rows == ["kernel cpu1", "kubelet.resync", "kubelet.readmission"]
    assert [(b.kind, round(b.start, 3), round(b.end, 3)) for b in tl.bars] == [
        ("transition", 0.0, 0.03), ("resync", 0.03, 4.0), ("readmission", 4.0, 14.0)]
    assert [(m.kind, m.at) for m in tl.markers] == [("rejected", 4.5), ("kept", 5.0)]
    fig = timeline.figure(tl)
    ax = fig.axes[0]
    assert len(ax.collections) == 3 + 2  # three bar series, rejected and kept markers
    assert [t.get_text() for t in ax.get_yticklabels()] == tl.rows
    out = tmp_path / "episode.png"
    timeline.write(ep, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_timeline_of_a_timeout_and_a_refusal():
    ep = cpu_offline_episode()
    ep.resynced = ep.readmission_settled = ep.kubelet_after = None
    ep.pods = []
    ep.outcome, ep.ended = Outcome.RESYNC_TIMEOUT, ep.opened + 600
    tl = timeline.build(ep)
    assert [b.kind for b in tl.bars] == ["transition", "waiting"]
    assert tl.bars[1].label == "no resync (resync_timeout)" and tl.bars[1].end == 600


def test_errors_exit_2(live_journal, tmp_path):
    missing = tmp_path / "nothing.db"
    for args in (["episodes", "list"], ["episodes", "show", "x"], ["episodes", "export"],
                 ["report", "x", "--output", str(tmp_path / "x.svg")]):
        result = run(*args, "--journal", str(missing), ok=False)
        assert result.exit_code == 2, args
        assert f"no journal at {missing}" in result.output
    result = run("episodes", "show", "no-such-episode", "--journal", str(live_journal), ok=False)
    assert result.exit_code == 2 and "no episode 'no-such-episode'" in result.output
    ep_id = json.loads(run("episodes", "list", "--json", "--journal",
                           str(live_journal)).output)[0]["id"]
    result = run("report", ep_id, "--output", str(tmp_path / "x.gif"), "--journal",
                 str(live_journal), ok=False)
    assert result.exit_code == 2 and "use a .svg or .png" in result.output
    result = run("episodes", "list", "--since", "yesterday-ish", "--journal",
                 str(live_journal), ok=False)
    assert result.exit_code == 2 and "is not a time" in result.output
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 200)
    result = run("episodes", "list", "--journal", str(junk), ok=False)
    assert result.exit_code == 2 and "cannot read the journal" in result.output


def test_since_forms():
    from exporter.cli_postmortem import SINCE
    import time
    now = time.time()
    assert abs(SINCE.convert("2h", None, None) - (now - 7200)) < 5
    assert abs(SINCE.convert("30m", None, None) - (now - 1800)) < 5
    assert SINCE.convert("1795000000", None, None) == 1795000000.0
    assert SINCE.convert("2026-11-22T03:00:00+00:00", None, None) == 1795316400.0


def test_register_adds_every_command():
    assert set(standalone.commands) == {"episodes", "replay", "report"}
    assert set(main.commands) >= {"episodes", "replay", "report"}
    assert set(standalone.commands["episodes"].commands) == {"list", "show", "export"}
