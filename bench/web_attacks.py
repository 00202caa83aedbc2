"""Round 16 items 2 and 10, measured: a legitimate scraper's latency while the HTTP endpoint is
attacked, and the exporter's peak threads, descriptors and RSS. Prints one line per scenario
(the figures in docs/reliability.md and docs/security.md). Loopback only.

    python bench/web_attacks.py [--seconds 20]
"""
from __future__ import annotations

import argparse
import base64
import http.client
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bcrypt  # noqa: E402

from testkit.exporter_proc import RunningExporter  # noqa: E402
from testkit.web_attacks import (  # noqa: E402
    AcceptVariants,
    BigHeaders,
    Peak,
    Scraper,
    Slowloris,
    proc_status,
    raise_fd_limit,
)

QUICK = ("--source", "uevent", "--kubernetes", "off")


class KeepAliveFlood:
    """`n` clients scraping back to back, each on one kept-alive connection."""

    def __init__(self, port: int, n: int):
        self.port, self.n, self.done = port, n, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._one, daemon=True) for _ in range(n)]

    def _one(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self._stop.is_set():
            try:
                conn.request("GET", "/metrics")
                conn.getresponse().read()
                self.done += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self._stop.wait(0.1)

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(35)


def report(name: str, scraper: Scraper, base: dict, peak: Peak, extra: str = "") -> None:
    ok = sum(1 for r in scraper.results if r[0] == 200)
    print(f"{name}: legit scraper {ok}/{len(scraper.results)} answered 200, "
          f"p50 {scraper.quantile(0.5) * 1000:.1f} ms, p99 {scraper.quantile(0.99) * 1000:.1f} ms,"
          f" max {max(t for _, t in scraper.results) * 1000:.1f} ms; exporter peak threads "
          f"{base['threads']}->{peak.max['threads']}, fds {base['fds']}->{peak.max['fds']}, "
          f"RSS {base['rss'] / 2**20:.0f}->{peak.max['rss'] / 2**20:.0f} MiB {extra}", flush=True)


ATTACKS = {
    "baseline (no attack)": None,
    "slowloris 1500 connections": lambda port: Slowloris(port, 1500),
    "100 unfinished requests x 99 headers x 64 KB": lambda port: BigHeaders(port, 100, 99,
                                                                            64 * 1024 - 64),
    "1000 keep-alive scrapers back to back": lambda port: KeepAliveFlood(port, 1000),
}


def _attack(name: str, port: int, seconds: float) -> None:
    """In a child process: the attacker's threads must not share a GIL with the scraper."""
    raise_fd_limit(8192)
    with ATTACKS[name](port):
        time.sleep(seconds)


def attacked(seconds: float, only: str | None = None) -> None:
    for name, make in ATTACKS.items():
        if only and not name.startswith(only) and make is not None:
            continue
        with RunningExporter(*QUICK) as exp:
            exp.scrape()
            base = proc_status(exp.proc.pid)
            with Peak(exp.proc.pid) as peak:
                child = None
                if make is not None:
                    child = multiprocessing.get_context("fork").Process(
                        target=_attack, args=(name, exp.port, seconds + 3))
                    child.start()
                time.sleep(2)
                with Scraper(exp.port, interval=0.05, timeout=10) as scraper:
                    time.sleep(seconds)
                if child is not None:
                    child.join(60)
                    if child.is_alive():
                        child.kill()
            cpu = _cpu(exp.proc.pid)
            report(name, scraper, base, peak, f"; exporter CPU {cpu:.1f} s in all")


def password_guessing(seconds: float, tmp: Path) -> None:
    """16 clients guessing passwords (cost 12) while a scraper with the right one scrapes."""
    password = "correct horse battery staple"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=12)).decode()
    config = tmp / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    good = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}".encode())
            .decode()}
    with RunningExporter(*QUICK, "--web.config.file", str(config)) as exp:
        def basic(user: str, pw: str) -> dict:
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode())
                    .decode()}

        # Known and unknown user, one at a time: equal cost?
        for user in ("prometheus", "nobody"):
            s = Scraper(exp.port, headers=basic(user, "wrong"))
            times = sorted(s.once()[1] for _ in range(7))
            print(f"wrong password for {'known' if user == 'prometheus' else 'unknown'} user: "
                  f"median {times[3] * 1000:.0f} ms", flush=True)
        Scraper(exp.port, headers=good).once()  # into the cache
        base = proc_status(exp.proc.pid)
        cpu0 = _cpu(exp.proc.pid)
        codes = multiprocessing.get_context("fork").Manager().dict()
        child = multiprocessing.get_context("fork").Process(
            target=_guess, args=(exp.port, seconds + 2, codes))
        with Peak(exp.proc.pid) as peak:
            child.start()
            time.sleep(1)
            start = time.monotonic()
            with Scraper(exp.port, headers=good, interval=0.05, timeout=10) as scraper:
                time.sleep(seconds)
            used = (_cpu(exp.proc.pid) - cpu0) / (time.monotonic() - start)
            child.join(60)
        codes = dict(codes)
        report("16 password guessers (cost 12)", scraper, base, peak,
               f"; exporter CPU {used * 100:.0f}% of a core; guessers got {codes}")


def _guess(port: int, seconds: float, codes) -> None:
    """In a child process: 16 threads guessing passwords back to back."""
    guessers = [Scraper(port, interval=0, timeout=10, headers={
        "Authorization": "Basic " + base64.b64encode(f"prometheus:guess{i}".encode()).decode()})
        for i in range(16)]
    for g in guessers:
        g.__enter__()
    time.sleep(seconds)
    for g in guessers:
        g.__exit__()
    for g in guessers:
        for code, _ in g.results:
            codes[code] = codes.get(code, 0) + 1


def accept_versions(seconds: float, clients: int = 40) -> None:
    """`clients` scrapers each asking for its own OpenMetrics `version=`: the exporter's CPU
    per answer, and a legitimate scraper's latency meanwhile."""
    with RunningExporter(*QUICK) as exp:
        exp.scrape()
        base = proc_status(exp.proc.pid)
        with Peak(exp.proc.pid) as peak:
            with AcceptVariants(exp.port, clients) as flood:
                time.sleep(2)
                cpu0, answered0 = _cpu(exp.proc.pid), flood.answered
                with Scraper(exp.port, interval=0.05, timeout=10) as scraper:
                    time.sleep(seconds)
                cpu, answered = _cpu(exp.proc.pid) - cpu0, flood.answered - answered0
        report(f"{clients} scrapers, each its own OpenMetrics version", scraper, base, peak,
               f"; exporter CPU {cpu:.1f} s for {answered} answers: "
               f"{cpu / max(answered, 1) * 1000:.2f} ms per answer")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--only", help="one scenario: a prefix of its name, 'passwords' or "
                        "'accept'")
    args = parser.parse_args()
    raise_fd_limit(8192)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "accept"):
            accept_versions(args.seconds)
        if args.only not in ("passwords", "accept"):
            attacked(args.seconds, args.only)
        if args.only in (None, "passwords"):
            password_guessing(args.seconds, Path(tmp))


if __name__ == "__main__":
    main()
