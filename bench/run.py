"""Benchmarks against peers. Run as root from the repository:

    .venv/bin/python bench/run.py all [--quick] [--out bench/results/latest.json]
    .venv/bin/python bench/run.py latency|storm|overhead|memory|scrape|correlator|fleet [--quick]

Each subcommand prints its results as JSON; `all` also writes them to --out and prints the
Markdown table bench/README.md quotes (bench/table.py renders it from a results file).
Real-kernel benchmarks hold the machine-wide hotplug lock of testkit/kernel.py while they flap.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/run.py` puts bench/ first, not the repository
    sys.path.insert(0, str(REPO))

from bench import correlator, fleet, latency, memory, overhead, scrape_load, storm  # noqa: E402
from bench.procs import node_exporter_path  # noqa: E402
from bench.table import render  # noqa: E402

# (full, quick) sizes for each benchmark
SIZES = {
    "cpu_transitions": (200, 10), "memory_transitions": (60, 4), "hold": ((0.1, 1.0), (0.02, 0.1)),
    "storm_cycles": (100, 5), "storm_repeats": (3, 1), "startup_repeats": (5, 1),
    "idle_seconds": (60.0, 2.0), "scrape_seconds": (30.0, 2.0),
    "correlator_events": (1_000_000, 20_000), "correlator_repeats": (3, 1),
    "storm_transitions": (10_000, 2_000),
    "open_episodes": (10_000, 200),
}


def size(name: str, quick: bool):
    return SIZES[name][1 if quick else 0]


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    # Configured, not online: a benchmark may start while another test holds cpu1 offline.
    return {"nproc": os.sysconf("SC_NPROCESSORS_CONF"), "kernel": platform.release(),
            "cpu_model": model,
            "mem_gib": round(mem_kb / 2**20, 1), "python": platform.python_version(),
            # Other work on the machine moves every number here: say how busy it was.
            "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "node_exporter": node_exporter_path() or "not installed"}


def run_latency(quick: bool, peer: bool) -> dict:
    hold = size("hold", quick)
    return {"cpu": latency.cpu_latency(size("cpu_transitions", quick), hold, peer=peer),
            "memory": latency.memory_latency(size("memory_transitions", quick), hold, peer=peer)}


def run_storm(quick: bool, peer: bool) -> dict:
    return storm.flap_storm(size("storm_cycles", quick), size("storm_repeats", quick), peer=peer)


def run_overhead(quick: bool, peer: bool) -> dict:
    return {"startup_s": overhead.startup(size("startup_repeats", quick), peer=peer),
            "idle": overhead.idle(size("idle_seconds", quick), peer=peer)}


def run_memory(quick: bool, peer: bool) -> dict:
    return memory.bill(size("idle_seconds", quick), peer=peer,
                       breakdown_window=size("scrape_seconds", quick))


def run_scrape(quick: bool, peer: bool) -> dict:
    return scrape_load.scrape_cost(size("scrape_seconds", quick), peer=peer)


def run_correlator(quick: bool, peer: bool) -> dict:
    return {"throughput": correlator.throughput(size("correlator_events", quick),
                                                repeats=size("correlator_repeats", quick)),
            "memory": correlator.episode_memory(size("open_episodes", quick)),
            "storm": correlator.storm_state(size("storm_transitions", quick))}


def run_fleet(quick: bool, peer: bool) -> dict:
    i = 1 if quick else 0
    return fleet.fleet_cost(*(fleet.SIZES[k][i] for k in ("nodes", "interval", "window",
                                                           "repeats")), peer=peer, parallel=quick)


BENCHMARKS = {"latency": run_latency, "storm": run_storm, "overhead": run_overhead,
              "memory": run_memory, "scrape": run_scrape, "correlator": run_correlator,
              "fleet": run_fleet}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--quick", action="store_true",
                        help="a few iterations of each (the smoke test's sizes)")
    parser.add_argument("--no-peer", action="store_true",
                        help="skip node_exporter (when prometheus-node-exporter is missing)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    peer = not args.no_peer
    if peer and node_exporter_path() is None:
        parser.error("prometheus-node-exporter is not installed: run scripts/setup.sh bench "
                     "(or pass --no-peer)")
    names = list(BENCHMARKS) if args.benchmark == "all" else [args.benchmark]
    results: dict = {"machine": machine(), "quick": args.quick,
                     "command": " ".join(["bench/run.py", *sys.argv[1:]] if argv is None
                                         else ["bench/run.py", *argv]),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    t0 = time.monotonic()
    for name in names:
        t = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        results[name] = BENCHMARKS[name](args.quick, peer)
        results.setdefault("wall_s", {})[name] = round(time.monotonic() - t, 1)
    results["wall_s"]["total"] = round(time.monotonic() - t0, 1)
    text = json.dumps(results, indent=1, default=str)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.benchmark == "all":
        print(render(results))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
