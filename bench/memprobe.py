"""Run `node-resize-exporter` in this process with tracemalloc on, and write where its memory
went when asked: `python -m bench.memprobe REPORT.json -- run ARGS...`.

The report is written each time the file REPORT.json.trigger appears (then removed): the
allocations still live (tracemalloc: by line, by package, and apart those made while importing
a module from those made at run time), the modules imported (by top-level package), and every
thread with the function it waits in.
tracemalloc costs memory of its own (a trace per block), so bench/memory.py measures RSS in a
separate run without it; this run only says what the anonymous part is made of.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

FRAMES = 25
IMPORT_MACHINERY = ("<frozen importlib", "importlib/__init__", "<frozen zipimport")


def _where(trace: tracemalloc.Statistic) -> str:
    """The innermost frame that is not the import system (for the code objects of a module
    being imported, that is the line importing it)."""
    frames = list(trace.traceback)  # oldest first
    for frame in reversed(frames):
        if not frame.filename.startswith(IMPORT_MACHINERY):
            return f"{frame.filename}:{frame.lineno}"
    return frames[-1].filename if frames else "?"


def _package(filename: str) -> str:
    """site-packages/<pkg>/... -> pkg; the standard library -> stdlib:<module>."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return parts[parts.index(marker) + 1].removesuffix(".py")
    if "exporter" in parts:
        return "exporter." + ".".join(parts[parts.index("exporter") + 1:-1] or ["(top)"])
    if "lib" in parts and any(p.startswith("python3") for p in parts):
        return "stdlib"
    return filename


def report() -> dict:
    snapshot = tracemalloc.take_snapshot()
    traced, peak = tracemalloc.get_traced_memory()
    by_line: Counter[str] = Counter()
    by_import: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    runtime: Counter[str] = Counter()
    for trace in snapshot.statistics("traceback"):  # identical tracebacks grouped (fast)
        where = _where(trace)
        by_line[where] += trace.size
        package = _package(where.rsplit(":", 1)[0])
        if any(f.filename.startswith("<frozen importlib") for f in trace.traceback):
            by_import[package] += trace.size  # made while importing: code, classes, tables
        else:
            runtime[where] += trace.size
        by_package[package] += trace.size
    modules: Counter[str] = Counter(name.split(".")[0] for name in list(sys.modules))
    frames = sys._current_frames()
    threads = []
    for t in threading.enumerate():
        frame = frames.get(t.ident or -1)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}" \
            if frame else "?"
        threads.append({"name": t.name, "daemon": t.daemon, "native_id": t.native_id,
                        "where": where})
    return {
        "traced_bytes": traced, "traced_peak_bytes": peak,
        "top_lines": by_line.most_common(30),
        "by_package": by_package.most_common(40),
        "import_by_package": by_import.most_common(40),
        "import_total_bytes": sum(by_import.values()),
        "runtime_top_lines": runtime.most_common(30),
        "runtime_total_bytes": sum(runtime.values()),
        "modules_total": len(sys.modules),
        "modules_by_package": modules.most_common(),
        "threads": threads,
    }


def _watch(path: Path) -> None:
    trigger = path.with_name(path.name + ".trigger")
    while True:
        if trigger.exists():
            trigger.unlink()
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(report(), indent=1))
            os.replace(tmp, path)
        time.sleep(0.2)


def main() -> None:
    out = Path(sys.argv[1])
    assert sys.argv[2] == "--"
    tracemalloc.start(FRAMES)
    threading.Thread(target=_watch, args=(out,), daemon=True, name="memprobe").start()
    sys.argv = ["node-resize-exporter", *sys.argv[3:]]
    from exporter.cli.main import main as exporter_main
    exporter_main()


if __name__ == "__main__":
    main()
