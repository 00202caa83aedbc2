#!/usr/bin/env python3
"""deploy/prometheusrule.yaml, as scripts/gen-monitoring.py generates it (kept for callers of
this older entry point: tests/e2e/test_deploy.py and habits).

Usage: scripts/gen-prometheusrule.py           rewrite deploy/prometheusrule.yaml
       scripts/gen-prometheusrule.py --check   exit 1 (with a diff) if it is out of date
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "deploy" / "prometheusrule.yaml"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_monitoring", Path(__file__).resolve().parent / "gen-monitoring.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def render() -> str:
    gen = _generator()
    return gen.render()[gen.PROMETHEUSRULE_OUT]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args(argv)
    wanted = render()
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current == wanted:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(keepends=True), wanted.splitlines(keepends=True),
            str(TARGET.relative_to(REPO)), "generated"))
        print(f"\n{TARGET.relative_to(REPO)} is stale: run scripts/gen-monitoring.py",
              file=sys.stderr)
        return 1
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
