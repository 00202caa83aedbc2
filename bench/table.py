"""Render a results file as the Markdown tables of bench/README.md.

    .venv/bin/python bench/table.py bench/results/latest.json
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

NRE, NE = "node-resize-exporter", "node_exporter"
# round 14's targets (round 7's before them: detection 5 ms, idle 0.2% of a core, anon 50 MB)
TARGETS = {"state_ms": 1.0, "metrics_ms": 5.0, "fidelity": 1.0, "rss_mib": 60.0,
           "ms_per_transition": 1.0, "storm_vs_peer": 1.5, "vs_python_listener": 2.5,
           "scrape_ms": 5.0, "events_per_s": 300_000.0, "startup_s": 2.0}


def f(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def spread(s: dict, digits: int = 1, unit: str = "") -> str:
    """median [min-max] (n) of a stats.Summary dict."""
    if not s or not s.get("n"):
        return "-"
    if s["n"] == 1:
        return f"{f(s['median'], digits)}{unit}"
    return (f"{f(s['median'], digits)}{unit} [{f(s['min'], digits)}-{f(s['max'], digits)}] "
            f"(n={s['n']})")


def p50_p99(s: dict, digits: int = 1) -> str:
    if not s or not s.get("n"):
        return "-"
    return f"{f(s['median'], digits)} / {f(s['p99'], digits)} / {f(s['max'], digits)} (n={s['n']})"


def met(ok: bool | None, how: str = "") -> str:
    if ok is None:
        return "-"
    return ("met" if ok else "**missed**") + (f" ({how})" if how else "")


def _target(p99: float, limit: float) -> str:
    how = f"{p99 / limit:.1f}x" if p99 > limit else ""
    return f"p99 <= {limit:g} ms: " + met(p99 <= limit, how)


def _latency(r: dict) -> list[str]:
    rows = ["### Detection latency (ms: p50 / p99 / max)", "",
            "| transitions | observer | latency | shown | target |", "|---|---|---|---|---|"]
    for key in ("cpu", "memory"):
        x = r.get(key)
        if not x:
            continue
        what = (f"cpu1 x{x['transitions']} (BPF)" if key == "cpu"
                else f"memory{x.get('block', '?')} x{x['transitions']} (uevent)")
        # The state target is from the write's return: for memory that is the hook's own end.
        state = x["hook_after_write_ms"] if key == "cpu" else x["hook_ms"]
        if key == "cpu":
            rows.append(f"| {what} | {NRE}: BPF record end -> correlator state | "
                        f"{p50_p99(x['hook_ms'])} | {x['hook_ms']['n']}/{x['transitions']} | |")
        rows.append(f"| {what} | {NRE}: sysfs write returned -> correlator state "
                    f"(negative: before it returned) | {p50_p99(state)} | "
                    f"{state['n']}/{x['transitions']} | "
                    f"{_target(state['p99'], TARGETS['state_ms'])} |")
        rows.append(f"| {what} | {NRE}: sysfs write returned -> /metrics shows it (poll, "
                    f"resolution {f(x['scrape_resolution_ms']['median'])} ms) | "
                    f"{p50_p99(x['scrape_ms'])} | {x['scrape_ms']['n']}/{x['transitions']} | "
                    f"{_target(x['scrape_ms']['p99'], TARGETS['metrics_ms'])} |")
        for iv, peer in x.get("node_exporter", {}).items():
            rows.append(f"| {what} | {NE} scraped every {iv} | {p50_p99(peer['latency_ms'], 0)} "
                        f"| {peer['shown']}/{peer['transitions']} "
                        f"({peer['shown_fraction']:.0%}) | |")
    rows.append("| any | kubelet (KEP-3953 text) | machine info cached at start-up: never, "
                "until the kubelet restarts; cAdvisor's own copy refreshes every 5 min | - | |")
    return rows


def _storm(r: dict) -> list[str]:
    rows = ["### Fidelity under a flap storm", "",
            "| | counted / true | target |", "|---|---|---|"]
    fid = r["fidelity"]
    runs = r["runs"]
    counted = ", ".join(f"{x['counted']:.0f}/{x['true']}" for x in runs)
    ok = fid["n"] and fid["min"] >= TARGETS["fidelity"]
    how = "" if ok else f"min {fid['min']:.1%}"
    rows.append(f"| {NRE} (`--source auto`), {r['cycles']} cycles x{r['repeats']}, "
                f"storm {spread(r['storm_s'], 2, ' s')} | {counted} | 100%: "
                f"{met(bool(ok), how)} |")
    by_source = "; ".join(", ".join(f"{k} {v:.0f}" for k, v in x["events_by_source"].items())
                          for x in runs)
    rows.append(f"| ... events per source (each transition counted once) | {by_source} | |")
    for iv, s in r.get("node_exporter_fraction", {}).items():
        seen = ", ".join(f"{x['node_exporter_seen'][iv]}/{x['true']}" for x in runs)
        rows.append(f"| {NE} scraped every {iv}: state changes its scrapes show | {seen} | |")
    return rows + [""] + _per_transition(r)


def _per_transition(r: dict) -> list[str]:
    """CPU and wake-ups per transition of every process in the same storms: the exporter,
    node_exporter and the minimal listeners (bench/listeners.py)."""
    per = r.get("cpu_ms_per_transition", {})
    if "python_listener" not in per:
        return []
    rows = ["### Per-transition CPU, same storms", "",
            "| process | CPU per transition | wake-ups per transition | target |",
            "|---|---|---|---|"]
    names = {"ours": f"{NRE} (scraped every 1 s)", "node_exporter": f"{NE} (scraped every 1 s "
             "and 15 s)", "python_listener": "minimal Python uevent listener",
             "c_listener": "minimal C uevent listener"}
    ratio = r.get("vs_python_listener", {})
    for key, name in names.items():
        if key not in per:
            continue
        woken = [x["wakeups_per_transition"][key] for x in r["runs"]
                 if key in x.get("wakeups_per_transition", {})]
        wakes = ", ".join(f"{w:.1f}" for w in woken) or "-"
        target = ""
        if key == "ours" and ratio.get("n"):
            worst = ratio["max"]
            target = (f"<= 2.5x the Python listener's, per run: "
                      f"{', '.join(f'{x:.2f}x' for x in _ratios(r))}: "
                      f"{met(worst <= TARGETS['vs_python_listener'])}")
        rows.append(f"| {name} | {spread(per[key], 2, ' ms')} | {wakes} | {target} |")
    return rows


def _ratios(r: dict) -> list[float]:
    return [x["cpu_ms_per_transition"]["ours"] / x["cpu_ms_per_transition"]["python_listener"]
            for x in r["runs"] if x["cpu_ms_per_transition"].get("python_listener")]


def _overhead(o: dict, storm: dict | None) -> list[str]:
    rows = ["### Overhead", "", f"| | {NRE} | {NE} | target |", "|---|---|---|---|"]
    idle, start = o["idle"], o["startup_s"]

    def both(fn) -> tuple[str, str]:
        return fn(idle.get(NRE)), fn(idle.get(NE)) if NE in idle else "-"

    # The schedstat figure (ns) when the run has it; /proc/stat's 10 ms ticks otherwise.
    key = ("cpu_s_per_min_schedstat" if "cpu_s_per_min_schedstat" in idle[NRE]
           else "cpu_s_per_min")
    cpu = idle[NRE][key]
    peer_cpu = idle[NE][key] if NE in idle else None
    a, b = both(lambda x: f"{f(x[key], 3)} s/min ({f(x[key] / 60 * 100, 3)}%)")
    how = "schedstat" if key.endswith("schedstat") else "/proc/stat ticks"
    rows.append(f"| idle CPU, both scraped every 15 s ({f(idle[NRE]['window_s'], 0)} s window, "
                f"{how}) | {a} | {b} | <= {NE}'s: "
                f"{met(None if peer_cpu is None else cpu <= peer_cpu)} |")
    if storm:
        cs = storm["cpu_s_per_min"]
        ours, peer = cs.get("ours", {}), cs.get("node_exporter", {})
        ratio = (ours["median"] / peer["median"]) if ours.get("n") and peer.get("n") else None
        ok = None if ratio is None else ratio <= TARGETS["storm_vs_peer"]
        rows.append(f"| CPU in the flap storm, both scraped every 1 s (s/min) | "
                    f"{spread(ours, 2)} | {spread(peer, 2)} | <= 1.5x {NE}'s: "
                    f"{met(ok, f'{ratio:.1f}x' if ratio else '')} |")
        per = storm.get("cpu_ms_per_transition", {})
        if per.get("ours"):
            p = per["ours"]["median"]
            rows.append(f"| CPU per CPU transition in the storm | "
                        f"{spread(per['ours'], 2, ' ms')} | "
                        f"{spread(per.get('node_exporter'), 2, ' ms')} | <= 1 ms: "
                        f"{met(p <= TARGETS['ms_per_transition'], f'{p:.1f}x' if p > 1 else '')} |")
    rss = idle[NRE]["rss_mib"]
    a, b = both(lambda x: f"{f(x['rss_mib'])} MiB")
    rows.append(f"| RSS | {a} | {b} | <= 60 MiB: {met(rss <= TARGETS['rss_mib'])} |")
    a, b = both(lambda x: f"{f(x['anon_mib'])} MiB")
    rows.append(f"| anonymous | {a} | {b} | |")
    a, b = both(lambda x: f"{f(x['file_backed_mib'])} MiB")
    rows.append(f"| file-backed (RSS - anonymous) | {a} | {b} | |")
    s = start[NRE]
    rows.append(f"| start-up to first valid scrape (ours: BPF attached) | {spread(s, 2, ' s')} | "
                f"{spread(start.get(NE), 3, ' s')} | <= 2 s: "
                f"{met(s['max'] <= TARGETS['startup_s'])} |")
    return rows


def _scrape(r: dict) -> list[str]:
    rows = ["### Scrape cost (/metrics latency, ms: p50 / p99 / max; kept-alive connections)", "",
            f"| load | {NRE} | {NE} | target |", "|---|---|---|---|"]
    shapes = [k for k in r[NRE] if isinstance(r[NRE][k], dict)]
    for shape in shapes:
        cells = []
        for name in (NRE, NE):
            x = r.get(name, {}).get(shape)
            cells.append("-" if not x else
                         f"{p50_p99(x['latency_ms'])}, {f(x['requests_per_s'], 0)} req/s"
                         + (f", {x['errors']} errors" if x["errors"] else ""))
        target = ""
        if shape.startswith("50"):
            p99 = r[NRE][shape]["latency_ms"]["p99"]
            target = f"p99 <= 5 ms: {met(p99 <= TARGETS['scrape_ms'], f'{p99 / 5:.1f}x')}"
        rows.append(f"| {shape} ({r[NRE][shape]['seconds']:g} s) | {cells[0]} | {cells[1]} | "
                    f"{target} |")
    return rows


def _correlator(r: dict) -> list[str]:
    t, m = r["throughput"], r["memory"]
    rate = t["events_per_s"]["median"]
    ratio = rate / TARGETS["events_per_s"]
    short = f"{ratio:.2f}x the target" if ratio >= 1 else f"{1 / ratio:.1f}x short"
    return ["### Correlator (replay, no I/O)", "", "| | result | target |", "|---|---|---|",
            f"| throughput, {t['events']:,} synthetic events x{t['repeats']} | "
            f"{spread(t['events_per_s'], 0, ' ev/s')} | >= 300k ev/s: "
            f"{met(rate >= TARGETS['events_per_s'], short)} |",
            f"| episode state, {m['open_episodes']:,} open episodes | "
            f"{m['bytes'] / 2**20:.1f} MiB ({m['bytes_per_episode']:.0f} B each) | |",
            f"| cost of one event while {m['open_episodes']:,} are open | "
            + (f"{m['us_per_event_while_open']:.1f} us | <= 20 us: "
               f"{met(m['us_per_event_while_open'] <= 20)} |"
               if "us_per_event_while_open" in m else
               f"{m['ms_per_event_while_open']:.1f} ms | |")]


def _ms(s: dict | None) -> str:
    if not s or not s.get("n"):
        return "-"
    return f"{s['n']}: {f(s['p50_ms'], 1)} / {f(s['max_ms'], 1)}"


def _fleet(r: dict) -> list[str]:
    """What 1,000 nodes cost the monitoring (bench/fleet.py)."""
    z, ex, fl = r["sizes"], r["exposition"], r["fleets"]

    def row(label: str, fn) -> str | None:
        """One row; None when neither fleet has the number (a results file from before it
        was measured)."""
        cells = []
        for j in (NRE, NE):
            try:
                cells.append(fn(j) if j in fl else "-")
            except (KeyError, TypeError):
                cells.append("-")
        return None if set(cells) == {"-"} else f"| {label} | " + " | ".join(cells) + " |"

    def mib(x) -> str:
        return f"{x / 2**20:,.0f} MiB"

    nre = fl.get(NRE, {})
    rows = [f"### What {z['nodes']:,} nodes cost the monitoring (Prometheus: ms, MiB)", "",
            f"{r.get('prometheus', 'prometheus')}; {z['nodes']:,} simulated targets per "
            f"exporter, scraped every {z['scrape_interval_s']:g} s (rules evaluated every "
            f"{z['evaluation_interval_s']:g} s) for {z['window_s']:g} s after every target was "
            f"up; node-resize-exporter with Kubernetes {ex[NRE]['kubernetes']}.", "",
            "| | node-resize-exporter | node_exporter |", "|---|---|---|",
            row("series per scrape (one node)", lambda j: f"{ex[j]['series']}" + (
                f" (Kubernetes off: {ex[j]['series_kubernetes_off']})"
                if "series_kubernetes_off" in ex[j] else "")),
            row("exposition bytes, plain / gzip", lambda j:
                f"{ex[j]['bytes']:,} / {ex[j]['gzip_bytes']:,}"),
            row("machine's 1-min load average, window start / end", lambda j:
                " / ".join(f"{x:.1f}" for x in fl[j]["loadavg_1m"])),
            row("targets up at least once", lambda j:
                f"{fl[j]['up_ever']:.0f}/{fl[j]['targets']}"),
            row("targets up at the end", lambda j: f"{fl[j]['up']:.0f}/{fl[j]['targets']}"),
            row("scrapes failed / made in the window", lambda j:
                f"{fl[j]['scrapes_failed']:,.0f} / {fl[j]['scrapes']:,.0f}"),
            row("head series (prometheus_tsdb_head_series)", lambda j:
                f"{fl[j]['head_series']:,}"),
            row("... of which no longer live (by name)", lambda j: ", ".join(
                f"{k} {v}" for k, v in fl[j]["series_gone_by_name"].items()) or "0"),
            row("... of which recording rules and ALERTS", lambda j:
                f"{fl[j]['rule_series']:,}" if "rule_series" in fl[j] else "- (no rules)"),
            row("Prometheus RSS at the end (peak)", lambda j:
                f"{mib(fl[j]['rss_bytes'])} ({mib(fl[j]['rss_peak_bytes'])})"),
            row("Prometheus RSS per 1,000 head series", lambda j:
                f"{fl[j]['rss_bytes'] / fl[j]['head_series'] * 1000 / 2**20:.2f} MiB"),
            row("Prometheus CPU over the window (cores)", lambda j: f"{fl[j]['cpu_cores']:.2f}"),
            row("scrape duration p50 / max (ms; the replay server)", lambda j:
                f"{fl[j]['scrape_duration_p50_s'] * 1000:.1f} / "
                f"{fl[j]['scrape_duration_max_s'] * 1000:.1f}")]
    for group in sorted(nre.get("rule_groups", {})):
        rows.append(row(f"rule group `{group}`: last / max evaluation (ms)", lambda j:
                        f"{fl[j]['rule_groups'][group]['last_ms']:,.1f} / "
                        f"{fl[j]['rule_groups'][group]['max_ms']:,.1f}"))
    if nre.get("rss_peak_after_queries_bytes"):
        rows.append(row("Prometheus peak RSS after the dashboard queries", lambda j:
                        mib(fl[j]["rss_peak_after_queries_bytes"])))
    q = nre.get("queries")
    if q:
        rows += [row(f"dashboard queries as Grafana sends them ({q['expressions']} "
                     f"expressions; n: p50 / max ms)", lambda j: _ms(fl[j]["queries"][
                         "as_grafana_sends_them"])),
                 row("... every expression as an instant query", lambda j:
                     _ms(fl[j]["queries"]["instant"])),
                 row("... every expression as a range query over the window", lambda j:
                     _ms(fl[j]["queries"]["range"])),
                 row("... variables (label values)", lambda j: _ms(fl[j]["queries"]["labels"])),
                 row("... errors / empty answers", lambda j:
                     f"{len(fl[j]['queries']['errors'])} / {fl[j]['queries']['empty']}")]
        rows += ["", "Slowest dashboard queries (node-resize-exporter fleet):", "",
                 "| dashboard | panel | query | ms | series |", "|---|---|---|---|---|"]
        rows += [f"| {s['dashboard']} | {s['where']} | {s['shape']} | {s['ms']:,.1f} | "
                 f"{s['series']} |" for s in q["slowest"]]
    if nre.get("slowest_rules"):
        rows += ["", "Slowest rules, last evaluation (node-resize-exporter fleet):", "",
                 "| group | rule | ms |", "|---|---|---|"]
        rows += [f"| {r['group']} | {r['rule']} | {r['ms']:,.1f} |"
                 for r in nre["slowest_rules"]]
    return [r for r in rows if r is not None]


def render(results: dict) -> str:
    m = results["machine"]
    out = [f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB, kernel "
           f"{m['kernel']}, Python {m['python']}; peer: {m['node_exporter']}. "
           f"Command: `{results['command']}` ({results.get('wall_s', {}).get('total', '?')} s"
           f"{', quick sizes' if results.get('quick') else ''})"
           + (f"; load average {m['loadavg']} at the start" if m.get("loadavg") else "")
           + ".", ""]
    out += [f"Note: {note}." for note in results.get("notes", [])] + [""] * bool(
        results.get("notes"))
    if "latency" in results:
        out += _latency(results["latency"]) + [""]
    if "storm" in results:
        out += _storm(results["storm"]) + [""]
    if "overhead" in results:
        out += _overhead(results["overhead"], results.get("storm")) + [""]
    if "scrape" in results:
        out += _scrape(results["scrape"]) + [""]
    if "correlator" in results:
        out += _correlator(results["correlator"]) + [""]
    if "fleet" in results:
        out += _fleet(results["fleet"]) + [""]
    return "\n".join(out)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
