"""`python -m lab` (`make lab`): boot the guest, run every scenario, print what happened.

Artifacts land in lab/out/<timestamp>-<pid>/ (or --out): serial.log (the guest kernel's console),
qemu.log, qemu-command.txt, scratch/ (the guest's writable share: exporter.log, agent.log,
episodes.json), summary.txt and outcomes.json. Exit status 0 only when every step passed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from lab.scenarios import BUDGET_SECONDS, Outcome, run_all

DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def line(o: Outcome) -> str:
    mark = "PASS" if o.passed else "FAIL"
    text = f"[{mark}] {o.name} ({o.seconds:.1f}s)\n"
    if o.kernel:
        text += f"       kernel:   {o.kernel}\n"
    if o.exporter:
        text += f"       exporter: {o.exporter}\n"
    if o.detail:
        text += "       why:      " + o.detail.replace("\n", "\n                 ") + "\n"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="artifact folder (default lab/out/<timestamp>-<pid>)")
    parser.add_argument("--only", default="", metavar="NAME[,NAME...]",
                        help="run only these scenarios (their function names in "
                             "lab/scenarios*.py), in the lab's order, after the plumbing checks; "
                             "one that builds on an earlier scenario says what it misses")
    args = parser.parse_args(argv)
    from lab.scenarios_orchestrator import LAB_ORDER
    only = frozenset(n for n in args.only.split(",") if n)
    unknown = sorted(only - {step.fn.__name__ for step in LAB_ORDER})
    if unknown:
        parser.error(f"--only: no scenario {', '.join(unknown)}; the scenarios: "
                     + ", ".join(step.fn.__name__ for step in LAB_ORDER))
    out = args.out or DEFAULT_OUT / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"lab: QEMU TCG guest, artifacts in {out} (budget {BUDGET_SECONDS:.0f}s)", flush=True)
    t0 = time.monotonic()
    outcomes = run_all(out, report=lambda o: print(line(o), end="", flush=True), only=only)
    passed = sum(o.passed for o in outcomes)
    verdict = "PASS" if outcomes and passed == len(outcomes) else "FAIL"
    tail = f"lab: {verdict}: {passed}/{len(outcomes)} steps passed in {time.monotonic() - t0:.0f}s"
    print(tail)
    (out / "summary.txt").write_text("".join(line(o) for o in outcomes) + tail + "\n")
    (out / "outcomes.json").write_text(json.dumps([dataclasses.asdict(o) for o in outcomes],
                                                  indent=2))
    if verdict != "PASS":
        print(f"lab: diagnose from {out}/serial.log and {out}/scratch/exporter.log")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
