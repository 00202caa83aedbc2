"""The postmortem CLI: episodes list/show/export, replay, report, on a journal a live run wrote."""
from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET

import click
import pytest
from click.testing import CliRunner

from exporter import codec
from exporter.cli.main import main
from exporter.cli.postmortem import register, replay_events
from exporter.clock import FakeClock
from exporter.correlate.correlator import Correlator
from exporter.correlate.model import Outcome, PodOutcome, PodVerdict
from exporter.events import (
    Direction,
    KernelSnapshot,
    KubeletProcess,
    NodeStatus,
    PodStatus,
    Resource,
    Result,
    Transition,
)
from exporter.report import figure, lookup, timeline
from exporter.sinks.journal.sink import JournalSink
from testkit.correlator import config as correlator_config
from testkit.postmortem_samples import (
    T0,
    cpu_flapping_superseded_episode,
    cpu_offline_episode,
    cpu_online_open_episode,
    cpu_restart_episode,
    memory_failed_episode,
    memory_uevent_only_episode,
)

GiB = 2**30
CONFIG = correlator_config(resync_deadline=60.0, kubernetes=True)


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
    """cpu1 offline -> resync (by the running kubelet) -> a pod rejected; cpu1 online -> no
    resync; a refused offline; a last snapshot after every window."""
    return [
        snapshot(T0, 2), KubeletProcess(T0 + 0.05, T0 - 3600, 100), node(T0 + 0.1, 2),
        pod(T0 + 0.2, "a"), pod(T0 + 0.3, "b"),
        cpu(T0 + 10, Direction.OFFLINE), snapshot(T0 + 10.01, 1),
        node(T0 + 14, 1), pod(T0 + 14.5, "a", "Failed", "OutOfcpu"),
        cpu(T0 + 40, Direction.ONLINE), snapshot(T0 + 40.01, 2),
        cpu(T0 + 200, Direction.OFFLINE, Result.FAILED, failed_state="85", error="ret=-16"),
        snapshot(T0 + 200.01, 2), snapshot(T0 + 260, 2),
    ]


@pytest.fixture
def live_journal(tmp_path):
    return write_live_journal(tmp_path / "journal.db")


def write_live_journal(path):
    """A journal written the way the agent writes it: event first, then the updates; ticks."""
    clock = FakeClock(T0)
    journal = JournalSink(path, clock=clock)
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
    assert len(lines) == 4  # newest first
    assert "converged" in lines[3] and "resync_timeout" in lines[2]
    assert "kernel_failed" in lines[1]
    assert "30.0 ms" in lines[3] and "4.00 s" in lines[3]  # kernel, resync (14 - 10)
    data = json.loads(run("episodes", "list", "--json", "--journal", str(live_journal)).output)
    assert [d["outcome"] for d in data] == ["kernel_failed", "resync_timeout", "converged"]
    first = codec.decode(data[-1])
    assert first.resource is Resource.CPU and first.kubelet_after == 1.0
    assert data[-1]["resync_seconds"] == pytest.approx(4.0)
    # --since: only what was active after the second episode began.
    since = str(T0 + 100)
    data = json.loads(run("episodes", "list", "--json", "--since", since,
                          "--journal", str(live_journal)).output)
    assert [d["outcome"] for d in data] == ["kernel_failed", "resync_timeout"]

    shown = run("episodes", "show", first.id, "--journal", str(live_journal)).output
    assert f"episode {first.id}: cpu decrease, converged" in shown
    assert "\n  cpu hot-unplug 2 -> 1 cores in 30.0 ms; Node resynced live after 4.00 s; 1 pod " \
        "rejected OutOfcpu\n" in shown
    assert "cpu1 offline started" in shown and "cpu1 offline done in 30.0 ms" in shown
    assert "Node capacity 1" in shown
    assert "pod default/pod-a REJECTED: OutOfcpu" in shown
    assert re.search(r"\+4\.030s .* resync .* Node capacity 1 \(after 4\.00 s, live\)", shown)
    assert "ended: converged" in shown


def test_export_then_replay_reproduces_the_live_episodes(live_journal, tmp_path):
    result = run("episodes", "export", "--journal", str(live_journal), "--progress-every", "5")
    lines = result.stdout.splitlines()
    assert len(lines) == len(live_stream())
    assert [codec.loads(x) for x in lines] == live_stream()
    assert "exported 5/14 events" in result.stderr and "exported 14 events" in result.stderr
    exported = tmp_path / "events.jsonl"
    exported.write_text(result.stdout)
    live = json.loads(run("episodes", "list", "--json", "--journal", str(live_journal)).output)
    replayed = run("replay", str(exported), "--json", "--resync-deadline", "60")
    assert json.loads(replayed.stdout) == live[::-1]  # (list: newest first)
    assert "replayed 14 events: 3 episodes" in replayed.stderr
    # A window of the journal: only the second half of the events.
    part = run("episodes", "export", "--since", str(T0 + 40), "--journal", str(live_journal))
    assert len(part.stdout.splitlines()) == 5


def test_replay_keeps_an_episode_open_until_its_deadline_in_the_exports_own_time(tmp_path):
    """An export that ends a minute into a 600 s resync deadline: the episode was still
    waiting, and the replay says so; only an export that runs past the deadline ends it."""
    events = [snapshot(T0, 1), node(T0 + 0.1, 1), cpu(T0 + 10, Direction.ONLINE),
              snapshot(T0 + 10.01, 2), snapshot(T0 + 70, 2)]
    f = tmp_path / "e.jsonl"
    f.write_text("".join(codec.dumps(e) + "\n" for e in events))
    (ep,) = json.loads(run("replay", str(f), "--json", "--resync-deadline", "600").stdout)
    assert (ep["outcome"], ep["phase"], ep["ended"]) == (None, "resync", None)
    f.write_text("".join(codec.dumps(e) + "\n" for e in [*events, snapshot(T0 + 700, 2)]))
    (ep,) = json.loads(run("replay", str(f), "--json", "--resync-deadline", "600").stdout)
    assert ep["outcome"] == "resync_timeout" and ep["ended"] == pytest.approx(T0 + 610)


def test_replay_skips_malformed_lines(tmp_path):
    events = live_stream()[:6]
    f = tmp_path / "e.jsonl"
    f.write_text("\n".join([codec.dumps(e) for e in events[:3]] + ["{broken", '{"type": "X"}',
                           codec.dumps(cpu_offline_episode())]
                           + [codec.dumps(e) for e in events[3:]]) + "\n")
    result = run("replay", str(f), "--json")
    assert "skipped 3 lines" in result.stderr
    (ep,) = json.loads(result.stdout)
    direct = replay_events(events, correlator_config(kubernetes=True))
    assert [codec.decode(ep)] == direct


def _ids(journal_path) -> list[str]:
    """Oldest first (`episodes list` shows the newest first)."""
    return [d["id"] for d in json.loads(run("episodes", "list", "--json", "--journal",
                                            str(journal_path)).output)][::-1]


def _svg_texts(path) -> dict[str, dict]:
    """Every <text> of a matplotlib SVG (svg.fonttype none keeps them text): text -> attrs."""
    root = ET.fromstring(path.read_text())
    return {"".join(t.itertext()).strip(): {**t.attrib} for t in
            root.iter("{http://www.w3.org/2000/svg}text")}


def test_report_svg_and_png_come_from_one_figure(live_journal, tmp_path):
    ep_id = _ids(live_journal)[0]
    svg, png = tmp_path / "episode.svg", tmp_path / "episode.png"
    run("report", ep_id, "--output", str(svg), "--journal", str(live_journal))
    run("report", ep_id, "--output", str(png), "--journal", str(live_journal))
    texts = _svg_texts(svg)
    # The headline is a sentence with the numbers, broken after a clause when long.
    assert {"cpu hot-unplug 2 -> 1 cores in 30.0 ms;",
            "Node resynced live after 4.00 s; 1 pod rejected OutOfcpu"} <= set(texts), texts
    assert any(t.startswith("node n1  |  cpu hot-unplug  |  episode ") and t.endswith(" UTC")
               for t in texts), texts
    assert {"kernel cpu1", "kubelet.resync", "kubelet.readmission", "cpu1 offline 30.0 ms",
            "resync 4.00 s (live)"} <= set(texts)
    rejected = [t for t in texts if t.startswith("[1] REJECTED: default/pod-a (OutOfcpu)")]
    assert rejected and "#d62728" in texts[rejected[0]].get("style", ""), texts
    assert any(t.startswith("[2] kept: default/pod-b") for t in texts)
    assert "1, 2" in texts  # both pods were judged at one instant: one marker label
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def _episodes_to_draw():
    long_wait = cpu_offline_episode()
    long_wait.resynced, long_wait.readmission_settled = T0 + 1800, T0 + 1810
    long_wait.pods = [PodOutcome(T0 + 1801 + i, "a-namespace-with-a-long-name",
                                 f"statefulset-with-a-long-name-{i}", f"u{i}",
                                 PodVerdict.REJECTED if i % 3 else PodVerdict.KEPT,
                                 "OutOfcpu" if i % 3 else "Running") for i in range(30)]
    long_wait.ended = T0 + 1810
    timeout = cpu_offline_episode()
    timeout.resynced = timeout.readmission_settled = timeout.kubelet_after = None
    timeout.pods, timeout.outcome, timeout.ended = [], Outcome.RESYNC_TIMEOUT, T0 + 600
    return {"converged": cpu_offline_episode(), "refused": memory_failed_episode(),
            "open": cpu_online_open_episode(), "timeout": timeout, "30 pods": long_wait,
            "kubelet restart": cpu_restart_episode(), "uevent only": memory_uevent_only_episode(),
            "flapping": cpu_flapping_superseded_episode()}


@pytest.mark.parametrize("name", list(_episodes_to_draw()))
def test_no_text_leaves_the_figure(name, tmp_path):
    ep = _episodes_to_draw()[name]
    fig = figure.draw(timeline.build(ep, "a-node-with-a-rather-long-name.example.internal"))
    assert figure.texts_outside(fig) == []
    for suffix in (".png", ".svg"):
        figure.save(fig, tmp_path / f"x{suffix}")
        assert (tmp_path / f"x{suffix}").stat().st_size > 5000


def test_the_clipping_check_can_fail():
    fig = figure.draw(timeline.build(cpu_offline_episode(), "n1"))
    fig.text(0.98, 0.5, "a label that runs off the right edge")
    assert [t for t in figure.texts_outside(fig) if "runs off" in t]


def test_milliseconds_and_minutes_are_readable_on_one_axis():
    """A 30 ms kernel step beside a 30 min resync wait: both wide enough to see."""
    ep = _episodes_to_draw()["30 pods"]
    tl = timeline.build(ep, "n1")
    fig = figure.draw(tl)
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog"
    width = ax.bbox.width

    def px(bar):
        return ax.transData.transform((bar.end, 0))[0] - ax.transData.transform((bar.start, 0))[0]

    kernel, resync = tl.bars[0], tl.bars[1]
    assert kernel.end - kernel.start == pytest.approx(0.03)
    assert resync.end - resync.start > 1799
    assert px(kernel) > 0.1 * width  # a linear 30 min axis would give it 0.002 %
    assert ax.transData.transform((tl.length, 0))[0] <= ax.bbox.x1
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert {"10 ms", "1 s", "1 min", "10 min"} <= set(names)


def test_headline_says_what_it_cost():
    ep = cpu_offline_episode()
    sentence = "cpu hot-unplug 2 -> 1 cores in 30.0 ms; Node resynced after 3.97 s"
    assert timeline.headline(ep) == (f"{sentence}; 1 pod rejected OutOfcpu", True)
    ep.pods.append(PodOutcome(T0 + 6, "default", "web-1", "u2", PodVerdict.REJECTED, "OutOfcpu"))
    assert timeline.headline(ep)[0] == f"{sentence}; 2 pods rejected OutOfcpu"
    ep.pods.append(PodOutcome(T0 + 7, "default", "db-0", "u3", PodVerdict.REJECTED,
                              "OutOfmemory"))
    assert timeline.headline(ep)[0] == \
        f"{sentence}; 3 pods rejected (2 OutOfcpu, 1 OutOfmemory)"
    ep.pods = [p for p in ep.pods if p.outcome is PodVerdict.KEPT]
    assert timeline.headline(ep) == (sentence, False)
    ep.resynced_by = "kubelet_live"
    assert timeline.headline(ep)[0] == \
        "cpu hot-unplug 2 -> 1 cores in 30.0 ms; Node resynced live after 3.97 s"
    assert timeline.headline(memory_failed_episode()) == (
        "memory hot-unplug 8 GiB -> 7.88 GiB in 500.0 ms; the kernel refused 1 of 2 "
        "transitions: memory150 offline refused: EBUSY", True)
    assert timeline.headline(cpu_online_open_episode()) == (
        "cpu hot-plug 1 -> 2 cores in 8.0 ms; open: waiting for the kubelet to resync", False)
    assert timeline.headline(cpu_restart_episode()) == (
        "cpu hot-unplug 2 -> 1 cores in 31.9 ms; Node resynced after 3.97 s by a kubelet "
        "restart; 2 pods rejected OutOfcpu", True)
    assert timeline.headline(memory_uevent_only_episode()) == (
        "memory hot-unplug 8 GiB -> 7.75 GiB, kernel time unknown (seen by uevent/sysfs); "
        "Kubernetes not watched", False)
    assert timeline.headline(cpu_flapping_superseded_episode()) == (
        "cpu flapping: 3 offline and 3 online transitions in 1.03 s; superseded by an "
        "opposite change after 1.20 s", False)
    small = memory_uevent_only_episode()
    small.kernel_before, small.kernel_after = 2.0**29, 2.0**29 - 2.0**27
    assert timeline.headline(small)[0].startswith("memory hot-unplug 512 MiB -> 384 MiB,")
    no_capacity = cpu_offline_episode()
    no_capacity.kernel_before = None
    assert timeline.headline(no_capacity)[0].startswith("cpu hot-unplug of cpu1 in 30.0 ms; ")


def _tick_px(ax, name: str) -> float:
    """Where the tick named `name` (major or minor) is drawn, in pixels."""
    for minor in (False, True):
        for label in ax.get_xticklabels(minor=minor):
            if label.get_text() == name:
                return ax.transData.transform((label.get_position()[0], 0))[0]
    raise AssertionError(f"no tick named {name!r}: "
                         f"{[t.get_text() for t in ax.get_xticklabels(minor=True)]}")


def test_a_bar_ends_between_the_ticks_that_name_its_length():
    """A 31.9 ms step is drawn ending between the named 20 ms and 50 ms ticks, on an axis
    that goes on to its end (1 min) and no further than the next named tick."""
    tl = timeline.build(cpu_restart_episode(), "n1")
    fig = figure.draw(tl)
    fig.canvas.draw()
    ax = fig.axes[0]
    kernel = tl.bars[0]
    assert kernel.label == "cpu1 offline 31.9 ms"
    right = ax.transData.transform((kernel.end, 0))[0]
    assert _tick_px(ax, "20 ms") < right < _tick_px(ax, "50 ms")
    # The resync (4.0 s after the start) ends between the 2 s and 5 s ticks.
    resync = ax.transData.transform((tl.bars[1].end, 0))[0]
    assert _tick_px(ax, "2 s") < resync < _tick_px(ax, "5 s")
    # The axis ends on a named tick at or beyond the episode's end (14 s: 1 min).
    assert ax.get_xlim()[1] == 60.0 and _tick_px(ax, "1 min") == pytest.approx(ax.bbox.x1)


@pytest.mark.parametrize("name", list(_episodes_to_draw()))
def test_every_axis_ends_on_a_named_tick(name):
    tl = timeline.build(_episodes_to_draw()[name], "n1")
    ax = figure.draw(tl).axes[0]
    end = ax.get_xlim()[1]
    assert end >= tl.length
    assert end in [t for t, _ in figure.TICKS]
    assert any(label.get_text() and label.get_position()[0] == end
               for label in ax.get_xticklabels())


def test_a_kubelet_restart_is_drawn_at_the_resync():
    ep = cpu_restart_episode()
    tl = timeline.build(ep, "n1")
    assert tl.rows == ["kernel cpu1", "kubelet.resync", "kubelet.readmission"]
    assert tl.bars[1].label == "resynced by a kubelet restart after 3.97 s"
    (restart,) = tl.instants
    assert (restart.label, restart.row, restart.kind) == ("kubelet restarted", 1, "restart")
    assert restart.at == pytest.approx(ep.resynced - ep.opened)
    # The pods keep their own times and numbers (what already worked).
    assert [(m.label, round(m.at, 4)) for m in tl.markers] == [
        ("default/sleeper-2 rejected (OutOfcpu)", 5.0319),
        ("default/sleeper-1 rejected (OutOfcpu)", 6.0319)]
    texts = [t.get_text() for t in figure.draw(tl).findobj(lambda o: hasattr(o, "get_text"))]
    assert "kubelet restarted" in texts
    live = cpu_restart_episode()
    live.resynced_by = "kubelet_live"
    tl = timeline.build(live)
    assert tl.instants == [] and tl.bars[1].label == "resync 3.97 s (live)"


def test_a_uevent_only_episode_draws_instants_and_no_resync_lane():
    tl = timeline.build(memory_uevent_only_episode(), "n1")
    assert tl.rows == ["kernel memory60", "kernel memory61"]  # no kubelet lanes
    assert tl.bars == []
    assert [(m.label, m.row, round(m.at, 3)) for m in tl.instants] == [
        ("memory60 offline: no duration, seen by uevent", 0, 0.0),
        ("memory61 offline: no duration, seen by uevent", 1, 0.2)]
    fig = figure.draw(tl)
    assert len(fig.axes[0].collections) == 2  # one marker each: the frame is not empty
    refused = timeline.build(memory_failed_episode())
    assert [b.label for b in refused.bars] == ["memory7 offline 12.0 ms"]
    assert [m.label for m in refused.instants] == [
        "memory150 offline refused (EBUSY): no duration, seen by sysfs"]


def test_kubernetes_not_watched_draws_no_resync_lane():
    ep = cpu_offline_episode()
    ep.resynced = ep.kubelet_after = ep.readmission_settled = ep.kubelet_before = None
    ep.pods, ep.outcome, ep.ended = [], Outcome.KERNEL_ONLY, ep.kernel_done
    tl = timeline.build(ep)
    assert tl.rows == ["kernel cpu1"]
    assert tl.title == "cpu hot-unplug 2 -> 1 cores in 30.0 ms; Kubernetes not watched"
    # A superseded episode with Kubernetes off: nothing was waited for either.
    flap = cpu_flapping_superseded_episode()
    flap.kubelet_before = None
    assert timeline.build(flap).rows == ["kernel cpu1\n3 offline, 3 online"]


def test_a_flapping_episode_is_one_row_with_its_counts():
    tl = timeline.build(cpu_flapping_superseded_episode(), "n1")
    assert tl.rows == ["kernel cpu1\n3 offline, 3 online", "kubelet.resync"]
    assert [b.row for b in tl.bars] == [0] * 6 + [1]
    assert all(b.label == "" for b in tl.bars[:6])  # close together: the row names the counts
    assert tl.bars[6].label == "no resync (superseded) after 170.0 ms"
    assert not tl.bad


def test_times_are_utc_and_say_so():
    tl = timeline.build(cpu_offline_episode(), "n1")
    assert f"opened {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(T0))}.000 UTC" in tl.subtitle
    assert timeline.seconds(599.97) == "10m00.0s"


def test_timeline_of_a_timeout_and_a_refusal():
    tl = timeline.build(_episodes_to_draw()["timeout"])
    assert [b.kind for b in tl.bars] == ["transition", "waiting"]
    assert tl.bars[1].label == "no resync (resync_timeout) after 10m00.0s"
    assert tl.bars[1].end == 600
    assert tl.title == "cpu hot-unplug 2 -> 1 cores in 30.0 ms; Node did not resync within " \
        "10m00.0s"
    assert tl.bad  # a hot-unplug the Node never caught up with
    assert "(unknown: no Node status recorded)" in tl.subtitle


def test_an_ambiguous_prefix_says_so_with_both_ids(live_journal, tmp_path):
    a, b = cpu_offline_episode(episode_id="cpu-1"), cpu_offline_episode(episode_id="cpu-12")
    c = memory_failed_episode(episode_id="mem-3")
    assert lookup.match([a, b, c], "cpu-1", "j") is a  # an exact id wins over a prefix
    assert lookup.match([a, b, c], "m", "j") is c
    with pytest.raises(lookup.NotFound, match=r"'cpu' is ambiguous in j: it matches 2 "
                                              r"episodes \(cpu-1, cpu-12\)"):
        lookup.match([a, b, c], "cpu", "j")
    with pytest.raises(lookup.NotFound, match="no episode 'x'"):
        lookup.match([a, b, c], "x", "j")
    # Through the CLI, on whatever ids the correlator makes: the longest prefix two share.
    ids = _ids(live_journal)
    prefix = max((os.path.commonprefix([x, y]) for x in ids for y in ids if x != y), key=len)
    sharing = [i for i in ids if i.startswith(prefix)]
    if prefix and prefix not in ids:
        for args in (["report", prefix, "--output", str(tmp_path / "x.svg")],
                     ["episodes", "show", prefix]):
            result = run(*args, "--journal", str(live_journal), ok=False)
            assert result.exit_code == 2, result.output
            assert "is ambiguous" in result.output
            assert all(i in result.output for i in sharing[:lookup.SHOWN])


def test_report_reads_an_exported_jsonl(live_journal, tmp_path):
    exported = tmp_path / "events.jsonl"
    exported.write_text(run("episodes", "export", "--journal", str(live_journal)).stdout)
    ep_id = _ids(live_journal)[0]
    from_journal, from_file = tmp_path / "j.svg", tmp_path / "f.svg"
    run("report", ep_id, "--output", str(from_journal), "--journal", str(live_journal))
    run("report", ep_id, "--output", str(from_file), "--events", str(exported),
        "--journal", str(tmp_path / "no-journal-needed.db"))
    assert set(_svg_texts(from_file)) == set(_svg_texts(from_journal))
    result = run("report", "nothing-like-it", "--output", str(from_file), "--events",
                 str(exported), ok=False)
    assert result.exit_code == 2 and f"no episode 'nothing-like-it' in {exported}" in \
        result.output


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
    import time

    from exporter.cli.postmortem import SINCE
    now = time.time()
    assert abs(SINCE.convert("2h", None, None) - (now - 7200)) < 5
    assert abs(SINCE.convert("30m", None, None) - (now - 1800)) < 5
    assert SINCE.convert("1795000000", None, None) == 1795000000.0
    assert SINCE.convert("2026-11-22T03:00:00+00:00", None, None) == 1795316400.0


def test_register_adds_every_command():
    assert set(standalone.commands) == {"episodes", "replay", "report"}
    assert set(main.commands) >= {"episodes", "replay", "report"}
    assert set(standalone.commands["episodes"].commands) == {"list", "show", "export"}


def test_list_filters_by_outcome_and_time_and_limits_newest_first(live_journal):
    def ids(*args: str) -> list[str]:
        out = run("episodes", "list", "--json", "--journal", str(live_journal), *args).output
        return [d["outcome"] for d in json.loads(out)]

    assert ids() == ["kernel_failed", "resync_timeout", "converged"]
    assert ids("--outcome", "converged") == ["converged"]
    assert ids("--outcome", "converged", "--outcome", "kernel_failed") == [
        "kernel_failed", "converged"]
    assert ids("--outcome", "open") == []
    # --until: opened by then; --since: active since then (RFC 3339 and Unix seconds alike).
    rfc3339 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + 30))
    assert ids("--until", rfc3339) == ["converged"]
    assert ids("--since", str(T0 + 100), "--until", str(T0 + 150)) == ["resync_timeout"]
    # --limit: the newest N, and stderr says how many there were.
    result = run("episodes", "list", "--limit", "2", "--journal", str(live_journal))
    assert len(result.stdout.splitlines()) == 3  # header and two
    assert "kernel_failed" in result.stdout and "converged" not in result.stdout
    assert "the newest 2 of 3 episodes" in result.stderr
    assert ids("--limit", "0") == ids()
    bad = run("episodes", "list", "--outcome", "nope", "--journal", str(live_journal), ok=False)
    assert bad.exit_code == 2
    bad = run("episodes", "list", "--since", "1h", "--until", "2h", "--journal",
              str(live_journal), ok=False)
    assert bad.exit_code == 2 and "--until is before --since" in bad.output


def test_list_defaults_to_the_newest_fifty(tmp_path):
    journal = JournalSink(tmp_path / "j.db", clock=FakeClock(T0))
    for k in range(60):
        ep = cpu_offline_episode()
        ep.id, ep.opened = f"cpu-dec-{k:03d}", T0 + k
        journal.save_episode(ep)
    journal.close()
    out = run("episodes", "list", "--json", "--journal", str(tmp_path / "j.db"))
    assert [d["id"] for d in json.loads(out.stdout)] == [f"cpu-dec-{k:03d}"
                                                        for k in range(59, 9, -1)]
    assert "the newest 50 of 60 episodes" in out.stderr


def test_a_flap_that_never_changed_the_node_says_so():
    """cpu1 offline and online twice within the window: the kernel ends where it began, the
    Node never moved. Not "Node resynced live after 0.0 ms": the Node never changed."""
    from exporter.report import text
    from testkit.correlator_stream import Stream

    s = Stream(kubernetes=True, coalesce_window=1.0, readmission_settle=1.0)
    s.snapshot(0, cpus=2)
    s.node(0.25, cpu=2)
    for k, direction in enumerate([Direction.OFFLINE, Direction.ONLINE] * 2):
        s.transition(1.0 + k * 0.25, Resource.CPU, 1, direction)
        s.snapshot(1.0625 + k * 0.25, cpus=1 if direction is Direction.OFFLINE else 2)
    s.tick(10.0)
    [ep] = s.ended()
    assert ep.flapping and ep.outcome is Outcome.CONVERGED
    words, bad = timeline.headline(ep)
    assert words == ("cpu flapping: 2 offline and 2 online transitions in 757.8 ms; "
                     "the Node never changed (2 cores)"), words
    assert not bad
    shown = text.timeline(ep)
    assert "resynced" not in shown and "Node capacity 2, never changed" in shown
    tl = timeline.build(ep)
    assert [b.label for b in tl.bars if b.kind == "resync"] == ["the Node never changed"]
