"""The README's flag table lists every flag `run` takes, and nothing it does not."""
from __future__ import annotations

import re
from pathlib import Path

from exporter.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_flags() -> set[str]:
    text = README.read_text()
    table = text[text.index("| flag | default | meaning |"):]
    table = table[:table.index("\n\n")]
    first_cells = [row.split("|")[1] for row in table.splitlines()[2:]]
    return {flag for cell in first_cells for flag in re.findall(r"`(--[a-z][a-z0-9.-]*)", cell)}


def _run_flags() -> set[str]:
    flags: set[str] = set()
    for param in main.commands["run"].params:
        flags.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return flags - {"--help"}


def test_the_table_is_read():
    assert {"--web.listen-address", "--source", "--journal"} <= _readme_flags()


def test_the_readme_lists_every_flag_of_run_and_no_other():
    # an old spelling that still parses need not have its own row
    aliases = {"--listen", "--log-level", "--sysfs-root", "--procfs-root"}
    assert _run_flags() - aliases - _readme_flags() == set(), "flags missing from README.md"
    assert _readme_flags() - _run_flags() == set(), "README.md names flags run does not take"
