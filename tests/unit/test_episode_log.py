"""The episode lines in the log: one per open and end (and the start of a flap), bounded to
LINES_PER_MINUTE a minute with one summary line for the rest."""
from __future__ import annotations

import logging

from exporter.events import Direction, Resource
from exporter.sinks.episode_log import LINES_PER_MINUTE, EpisodeLog
from testkit.correlator_stream import Stream

CPU = Resource.CPU


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "exporter.sinks.episode_log"]


def test_single_episodes_say_when_they_open_and_end(caplog):
    caplog.set_level(logging.INFO, logger="exporter.sinks.episode_log")
    s = Stream(kubernetes=False)
    now = [0.0]
    log = EpisodeLog(clock=lambda: now[0])
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 1, Direction.OFFLINE)
    s.tick(5.0)
    for u in s.updates:
        log.on_update(u)
    [opened, ended] = _lines(caplog)
    ep = s.ended()[0]
    assert opened == f"episode {ep.id} opened: cpu decrease (cpu1)"
    assert ended.startswith(f"episode {ep.id} ended kernel_only after 0.0 s: cpu decrease "
                            "(cpu1); no Kubernetes source configured")


def test_many_episodes_in_a_minute_are_summed_up_in_one_line(caplog):
    caplog.set_level(logging.INFO, logger="exporter.sinks.episode_log")
    # No coalescing window: every transition is an episode of its own.
    s = Stream(kubernetes=False, coalesce_window=0.0)
    s.snapshot(0, cpus=2)
    for k in range(100):
        s.transition(1.0 + k * 0.125, CPU, 1, Direction.OFFLINE if k % 2 == 0 else
                     Direction.ONLINE)
    now = [0.0]
    log = EpisodeLog(clock=lambda: now[0])
    for u in s.updates:
        log.on_update(u)
    assert len(_lines(caplog)) == LINES_PER_MINUTE
    now[0] = 61.0  # the next update after the minute brings the summary first
    s.tick(100.0)
    for u in s.updates[-1:]:
        log.on_update(u)
    lines = _lines(caplog)
    assert len(lines) == LINES_PER_MINUTE + 2
    summary = lines[LINES_PER_MINUTE]
    held = 2 * 100 - 1 - LINES_PER_MINUTE  # 100 opened, 99 ended before the tick
    assert summary.startswith(f"episodes: {held} more updates in the last minute"), summary
    assert "95 opened" in summary and "94 ended kernel_only" in summary


def test_a_storm_says_opened_flapping_ended(caplog):
    caplog.set_level(logging.INFO, logger="exporter.sinks.episode_log")
    s = Stream(kubernetes=False)
    s.snapshot(0, cpus=2)
    for k in range(400):
        s.transition(1.0 + k * 0.0625, CPU, 1, Direction.OFFLINE if k % 2 == 0 else
                     Direction.ONLINE)
    s.tick(60.0)
    log = EpisodeLog()
    for u in s.updates:
        log.on_update(u)
    lines = _lines(caplog)
    assert len(lines) == 3, lines
    assert "opened" in lines[0] and "flapping" in lines[1]
    assert "ended kernel_only" in lines[2]
    assert "flapping: 200 offline and 200 online transitions" in lines[2]


def _formatted(caplog, formatter) -> list[str]:
    return [formatter.format(r) for r in caplog.records if r.name == "exporter.sinks.episode_log"]


def test_json_episode_lines_carry_the_fields_an_index_searches_on(caplog):
    """--log.format json: episode, resource, direction on every line of an episode; outcome and
    duration_seconds (a number) on its end; the message is the same text as in logfmt."""
    import json

    from exporter.config import logs

    caplog.set_level(logging.INFO, logger="exporter.sinks.episode_log")
    s = Stream(kubernetes=False)
    log = EpisodeLog(clock=lambda: 0.0)
    s.snapshot(0, cpus=2)
    s.transition(1.0, CPU, 1, Direction.OFFLINE)
    s.tick(5.0)
    for u in s.updates:
        log.on_update(u)
    ep = s.ended()[0]
    opened, ended = map(json.loads, _formatted(caplog, logs.JsonFormatter()))
    assert {k: opened[k] for k in ("episode", "resource", "direction")} == \
        {"episode": ep.id, "resource": "cpu", "direction": "decrease"}
    assert "outcome" not in opened and opened["msg"].startswith(f"episode {ep.id} opened")
    assert ended["outcome"] == "kernel_only" and ended["episode"] == ep.id
    assert isinstance(ended["duration_seconds"], float) and ended["duration_seconds"] >= 0
    # logfmt: the same fields, as key=value pairs after the message.
    logfmt = _formatted(caplog, logs.LogfmtFormatter())[1]
    assert f" episode={ep.id} resource=cpu direction=decrease outcome=kernel_only " \
        "duration_seconds=" in logfmt, logfmt
