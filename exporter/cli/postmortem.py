"""Postmortem commands: `episodes list|show|export`, `replay FILE.jsonl`, `report ID`.

They read the journal the agent writes (every command takes --journal PATH) and never write to
it. Registered on the main group with `register(main)`. Errors a user can fix (no such episode,
no journal there, a bad --since) exit 2 with one line saying what is wrong.
"""
from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import click

from exporter import codec
from exporter.clock import FakeClock
from exporter.config import options
from exporter.config.decide import correlator_config, default_journal_path
from exporter.config.options import Options
from exporter.config.types import ParamType
from exporter.correlate.config import CorrelatorConfig
from exporter.correlate.correlator import Correlator
from exporter.correlate.model import Episode, EpisodeUpdate, Outcome
from exporter.events import NodeStatus, PodsRelisted, PodStatus
from exporter.report import figure, lookup, text, timeline
from exporter.sinks.journal.reader import JournalReader
from exporter.sinks.journal.schema import JournalError, event_time

PROGRESS_EVERY = 10_000
LIST_LIMIT = 50  # `episodes list` shows the newest this many unless --limit says otherwise
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class PostmortemError(click.ClickException):
    exit_code = 2


class SinceType(ParamType):
    """A point in time: 90s / 30m / 2h / 7d / 1w ago, an ISO or RFC 3339 time (local unless it
    says; `Z` is UTC), or Unix seconds."""

    name = "TIME"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        s = str(value).strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", s)
        if m:
            return time.time() - float(m.group(1)) * _UNITS[m.group(2)]
        if re.fullmatch(r"\d{9,}(?:\.\d+)?", s):
            return float(s)
        try:
            # (Python 3.11's fromisoformat takes RFC 3339's Z and offsets.)
            return datetime.fromisoformat(s).timestamp()  # naive -> local time
        except ValueError:
            self.fail(f"{s!r} is not a time: use e.g. 2h, 30m, 7d, 2026-11-22T03:00 or "
                      "Unix seconds", param, ctx)


SINCE = SinceType()


def journal_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--journal", "journal_path", type=click.Path(dir_okay=False, path_type=Path),
        default=None, show_default=False,
        help=f"the journal to read [default: {default_journal_path()}]")(f)


def open_journal(path: Path | None) -> JournalReader:
    try:
        return JournalReader(path if path is not None else default_journal_path())
    except JournalError as e:
        raise PostmortemError(str(e)) from None


def find_episode(journal: JournalReader, episode_id: str) -> Episode:
    try:
        return lookup.match(journal.episodes(), episode_id, str(journal.path))
    except JournalError as e:
        raise PostmortemError(str(e)) from None
    except lookup.NotFound as e:
        raise PostmortemError(str(e)) from None


def print_episodes(episodes: list[Episode], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([text.as_json(ep) for ep in episodes], indent=2))
    else:
        click.echo(text.table(episodes))


# ---------------------------------------------------------------- episodes


@click.group()
def episodes() -> None:
    """Episodes recorded in the journal: list, show, export."""


@episodes.command("list")
@journal_option
@click.option("--since", type=SINCE, default=None,
              help="only episodes active since (2h, 30m, RFC 3339, Unix seconds)")
@click.option("--until", type=SINCE, default=None, help="only episodes opened by (same forms)")
@click.option("--outcome", "outcomes", multiple=True,
              type=click.Choice([o.value for o in Outcome] + ["open"]),
              help="only episodes that ended so (repeatable; `open`: not ended yet)")
@click.option("--limit", type=click.IntRange(min=0), default=LIST_LIMIT, show_default=True,
              help="the newest N episodes (0: all)")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table")
def list_episodes(journal_path: Path | None, since: float | None, until: float | None,
                  outcomes: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Table of episodes, newest first: id, resource, direction, start, phase times, outcome."""
    if since is not None and until is not None and until < since:
        raise PostmortemError("--until is before --since: nothing can match")
    journal = open_journal(journal_path)
    try:
        found = journal.episodes(since=since, until=until)
    except JournalError as e:
        raise PostmortemError(str(e)) from None
    finally:
        journal.close()
    if outcomes:
        wanted = set(outcomes)
        found = [ep for ep in found
                 if (ep.outcome.value if ep.outcome is not None else "open") in wanted]
    found.sort(key=lambda ep: (ep.opened, ep.id), reverse=True)
    shown = found[:limit] if limit else found
    print_episodes(shown, as_json)
    if len(shown) < len(found):
        click.echo(f"the newest {len(shown)} of {len(found)} episodes; --limit 0 shows all",
                   err=True)


@episodes.command("show")
@journal_option
@click.argument("episode_id")
@click.option("--json", "as_json", is_flag=True, help="the stored episode as JSON")
def show_episode(journal_path: Path | None, episode_id: str, as_json: bool) -> None:
    """One episode as a timeline in text."""
    journal = open_journal(journal_path)
    try:
        ep = find_episode(journal, episode_id)
    finally:
        journal.close()
    click.echo(json.dumps(text.as_json(ep), indent=2) if as_json else text.timeline(ep))


@episodes.command("export")
@journal_option
@click.option("--since", type=SINCE, default=None, help="first event time (2h, ISO, ...)")
@click.option("--until", type=SINCE, default=None, help="last event time")
@click.option("--progress-every", type=click.IntRange(min=1), default=PROGRESS_EVERY,
              hidden=True)
def export_events(journal_path: Path | None, since: float | None, until: float | None,
                  progress_every: int) -> None:
    """The raw events as JSON lines on stdout (for `replay`); progress goes to stderr."""
    journal = open_journal(journal_path)
    out = sys.stdout
    try:
        total = journal.count_events(since, until)
        n = 0
        for event in journal.events(since, until):
            out.write(codec.dumps(event) + "\n")
            n += 1
            if n % progress_every == 0:
                click.echo(f"exported {n}/{total} events", err=True)
        out.flush()
    except JournalError as e:
        raise PostmortemError(str(e)) from None
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        sys.stderr.close()
        return
    finally:
        journal.close()
    skipped = f" ({journal.malformed} unreadable rows skipped)" if journal.malformed else ""
    click.echo(f"exported {n} events from {journal.path}{skipped}", err=True)


# ---------------------------------------------------------------- replay


def replay_events(events: list[Any], config: CorrelatorConfig) -> list[Episode]:
    """Feed recorded events through the correlator with a clock set to each event's time.

    The clock never runs backwards (sources deliver slightly out of order). It stops at the
    latest event: that is the export's own "now", so an episode still waiting then (its
    deadline not yet come) is shown open, as the live agent had it, not decided in advance.
    """
    clock = FakeClock(event_time(events[0]) if events else 0.0)
    correlator = Correlator(config, clock)
    found: dict[str, Episode] = {}

    def take(updates: list[EpisodeUpdate]) -> None:
        for u in updates:
            found[u.episode.id] = u.episode

    for event in events:
        clock.t = max(clock.t, event_time(event))
        take(correlator.tick())  # what the live agent's tick did before this event arrived
        take(correlator.handle(event))
    take(correlator.tick())  # what falls due at the latest event's own instant
    return sorted(found.values(), key=lambda ep: (ep.opened, ep.id))


def read_jsonl(path: Path) -> tuple[list[Any], int]:
    """Events from a JSON-lines file; malformed lines are counted and skipped."""
    events, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = codec.loads(line)
            except codec.CodecError as e:
                bad += 1
                click.echo(f"{path}:{lineno}: skipped: {e}", err=True)
                continue
            if type(obj).__name__ in codec.EVENT_TYPES:
                events.append(obj)
            else:
                bad += 1
                click.echo(f"{path}:{lineno}: skipped: a {type(obj).__name__}, not an event",
                           err=True)
    return events, bad


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table")
@options.apply(options.REPLAY)
@click.option("--kubernetes/--no-kubernetes", default=None,
              help="judge resync and readmission [default: when the file has Kubernetes "
                   "events]")
def replay(file: Path, as_json: bool, kubernetes: bool | None, **values: Any) -> None:
    """Replay exported events (FILE.jsonl) through the correlator and print the episodes."""
    try:
        events, bad = read_jsonl(file)
    except (OSError, UnicodeDecodeError) as e:
        raise PostmortemError(f"cannot read {file}: {e}") from None
    if kubernetes is None:
        kubernetes = any(isinstance(e, (NodeStatus, PodStatus, PodsRelisted)) for e in events)
    config = correlator_config(Options.from_cli(values), kubernetes)
    found = replay_events(events, config)
    print_episodes(found, as_json)
    click.echo(f"replayed {len(events)} events{f', skipped {bad} lines' if bad else ''}: "
               f"{len(found)} episodes", err=True)


# ---------------------------------------------------------------- report


@click.command()
@journal_option
@click.argument("episode_id")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="FILE.svg or FILE.png (needs the `report` extra: matplotlib)")
@click.option("--events", "events_file", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="read the episode from exported events (FILE.jsonl, replayed with the "
                   "default settings) instead of the journal")
def report(journal_path: Path | None, episode_id: str, output: Path,
           events_file: Path | None) -> None:
    """Draw one episode: kernel transitions, resync, readmission with pod outcomes."""
    if events_file is not None:
        ep, node = _from_jsonl(events_file, episode_id)
    else:
        journal = open_journal(journal_path)
        try:
            ep = find_episode(journal, episode_id)
            node = lookup.node_name(journal.events(ep.opened - 86400, ep.ended), ep)
        except JournalError as e:
            raise PostmortemError(str(e)) from None
        finally:
            journal.close()
    try:
        figure.write(ep, output, node)
    except timeline.ReportError as e:
        raise PostmortemError(str(e)) from None
    except OSError as e:
        raise PostmortemError(f"cannot write {output}: {e}") from None
    click.echo(f"wrote {output}", err=True)


def _from_jsonl(path: Path, episode_id: str) -> tuple[Episode, str | None]:
    try:
        events, _ = read_jsonl(path)
    except (OSError, UnicodeDecodeError) as e:
        raise PostmortemError(f"cannot read {path}: {e}") from None
    kubernetes = any(isinstance(e, (NodeStatus, PodStatus, PodsRelisted)) for e in events)
    found = replay_events(events, correlator_config(Options(), kubernetes))
    try:
        ep = lookup.match(found, episode_id, str(path))
    except lookup.NotFound as e:
        raise PostmortemError(str(e)) from None
    return ep, lookup.node_name(events, ep)


def register(main: click.Group) -> None:
    """Add the postmortem commands to the main CLI group."""
    main.add_command(episodes)
    main.add_command(replay)
    main.add_command(report)
