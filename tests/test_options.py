"""One definition per option: the typed Options and the flags cannot drift apart, and the
log formats node_exporter users expect cannot be forged into extra lines."""
from __future__ import annotations

import dataclasses
import logging

import click
import pytest

from exporter import logs, options
from exporter.options import ALL, Options


def test_every_run_option_is_a_field_with_the_definitions_default():
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    assert set(options.RUN) == set(fields)
    for name, opt in ALL.items():
        default = opt.default
        convert = opt.type is not None and default is not None and not isinstance(
            opt.type, click.Choice)
        if convert and opt.multiple:
            default = tuple(opt.type.convert(v, None, None) for v in default)
        elif convert:
            default = opt.type.convert(default, None, None)
        assert fields[name] == default, name


def test_replay_and_check_take_the_same_definitions_as_run():
    assert set(options.REPLAY) <= set(options.RUN)
    assert set(options.CHECK) <= set(options.RUN)


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_a_newline_in_a_message_stays_on_one_line(fmt):
    record = logging.LogRecord("exporter", logging.WARNING, __file__, 1,
                               "node %s", ("evil\nts=forged level=error msg=pwned",), None)
    formatter = logs.JsonFormatter() if fmt == "json" else logs.LogfmtFormatter()
    line = formatter.format(record)
    assert "\n" not in line
    assert ("level=warn" in line) if fmt == "logfmt" else ('"level": "warn"' in line)
