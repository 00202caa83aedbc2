"""One definition per option: the typed Options and the flags cannot drift apart, and the
log formats node_exporter users expect cannot be forged into extra lines."""
from __future__ import annotations

import logging
import sys
import types
import typing

import click
import pytest

from exporter.cli.main import main
from exporter.config import logs, options
from exporter.config.options import (
    COALESCE_WINDOW,
    MEMORY_TOLERANCE,
    TABLE,
    WEB_LISTEN_ADDRESS,
    Opt,
    Options,
    declare,
)
from exporter.sources import registry
from exporter.sources.kernel.bpf.source import RINGBUF_PAGES


def _params(command: str) -> dict[str, click.Parameter]:
    return {p.name: p for p in main.commands[command].params if p.name}


def test_an_unset_option_is_the_tables_default_converted_by_its_own_type():
    opts = Options()
    assert MEMORY_TOLERANCE.of(opts) == 100 * 2**20  # "100Mi" through Bytes
    assert WEB_LISTEN_ADDRESS.of(opts) == ("0.0.0.0", 9862)  # through ListenAddress
    assert RINGBUF_PAGES.of(opts) == registry.spec("bpf").options[0].default
    for name, opt in TABLE.items():
        assert opt.of(opts) == opt.value(), name
    assert COALESCE_WINDOW.of(opts.replace(coalesce_window=5.0)) == 5.0


def _conforms(value: object, hint: object) -> bool:
    """Whether a value is of a type written as an Opt's argument (str, str | None, float,
    tuple[str, int], tuple[str, ...])."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args))
    assert isinstance(hint, type), hint
    return isinstance(value, hint) and not (hint is not bool and isinstance(value, bool))


def _typed_constants() -> dict[str, tuple[str, object]]:
    """Every module-level `NAME: Opt[T]` of the package: the option's dest -> (NAME, T)."""
    registry.load()
    found: dict[str, tuple[str, object]] = {}
    for module in [m for n, m in sorted(sys.modules.items()) if n.startswith("exporter.")]:
        for name, annotation in vars(module).get("__annotations__", {}).items():
            value = vars(module).get(name)
            if isinstance(value, Opt):
                hint = eval(annotation, vars(module)) if isinstance(annotation, str) \
                    else annotation
                assert typing.get_origin(hint) is Opt, f"{module.__name__}.{name}: {hint}"
                found[value.dest] = (f"{module.__name__}.{name}", typing.get_args(hint)[0])
    return found


def test_every_option_is_a_typed_constant_typed_by_what_its_flag_converts_to():
    """mypy takes `X: Opt[T]` at its word: the T must be what the option's own type converts
    its default to (a flag goes through the same conversion), and every option in the table
    has such a constant, named after it."""
    typed = _typed_constants()
    assert set(typed) == set(TABLE)
    for dest, (where, hint) in typed.items():
        opt = TABLE[dest]
        assert _conforms(opt.value(), hint), (where, opt.value(), hint)
        assert where.rpartition(".")[2] == dest.upper(), where  # found by its flag's name


def test_a_source_declares_its_flags_beside_its_registration():
    owners = {o.dest: spec.name for spec in registry.specs() for o in spec.options}
    assert owners["ringbuf_pages"] == "bpf"
    assert owners["sysfs_interval"] == "sysfs"
    assert owners["podresources_socket"] == "podresources"
    assert owners["kubelet_metrics_url"] == "kubelet_metrics"
    assert set(owners) <= set(TABLE)


def test_check_takes_exactly_the_options_run_takes():
    run, check = _params("run"), _params("check")
    run.pop("print_bpf")
    assert set(run) == set(check) == set(TABLE)
    for name in run:
        assert run[name].opts == check[name].opts, name


def test_replay_takes_the_episode_settings_from_the_same_table():
    replay = _params("replay")
    for name in ("coalesce_window", "resync_deadline", "readmission_settle",
                 "memory_tolerance"):
        assert replay[name].opts == list(TABLE[name].flags)


def test_a_flag_or_option_declared_twice_is_refused():
    with pytest.raises(ValueError, match="declared twice"):
        declare(Opt("sysfs_root", ("--other",), "/x", "again"))
    with pytest.raises(ValueError, match="--path.sysfs"):
        declare(Opt("a_new_one", ("--path.sysfs",), "/x", "steals a flag"))
    assert "a_new_one" not in TABLE


def test_options_refuse_names_nobody_declared():
    with pytest.raises(TypeError, match="unknown options"):
        Options(no_such_option=1)
    with pytest.raises(AttributeError):  # read through a typed constant, not by name
        Options().coalesce_window  # noqa: B018
    assert options.REPLAY in TABLE["coalesce_window"].commands


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_a_newline_in_a_message_stays_on_one_line(fmt):
    record = logging.LogRecord("exporter", logging.WARNING, __file__, 1,
                               "node %s", ("evil\nts=forged level=error msg=pwned",), None)
    formatter = logs.JsonFormatter() if fmt == "json" else logs.LogfmtFormatter()
    line = formatter.format(record)
    assert "\n" not in line
    assert ("level=warn" in line) if fmt == "logfmt" else ('"level": "warn"' in line)


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_extra_fields_are_fields_of_their_own_and_cannot_replace_ours(fmt):
    import json

    record = logging.LogRecord("exporter.agent", logging.WARNING, __file__, 1,
                               "source %s down: %s", ("kube_pods", "forbidden"), None)
    for key, value in {"source": "kube_pods", "up": False, "count": 3,
                       "sources": ["bpf", "sysfs"], "level": "forged"}.items():
        setattr(record, key, value)  # what logging does with extra=
    line = (logs.JsonFormatter() if fmt == "json" else logs.LogfmtFormatter()).format(record)
    if fmt == "json":
        out = json.loads(line)
        assert (out["source"], out["up"], out["count"], out["sources"]) == \
            ("kube_pods", False, 3, ["bpf", "sysfs"])
        assert out["level"] == "warn" and out["msg"] == "source kube_pods down: forbidden"
    else:
        assert line.endswith(' source=kube_pods up=false count=3 sources="bpf,sysfs"'), line
        assert line.count("level=") == 1 and "level=warn" in line
