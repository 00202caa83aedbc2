"""Scrape cost: /metrics latency with 1 and 50 concurrent clients.

One asyncio process drives every client, each on its own kept-alive HTTP/1.1 connection as
Prometheus scrapes. Two shapes of load:
- closed loop: each client sends its next request as soon as the last one is answered (the
  usual load-test meaning of "N concurrent clients"; latency then includes queueing);
- open loop: each client scrapes once per `interval` from a random phase (N Prometheus
  servers scraping one target).
"""
from __future__ import annotations

import asyncio
import random
import time

from bench.procs import NodeExporter, ResizeExporter
from bench.stats import Summary

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: nre-bench\r\n\r\n"


async def _read_response(reader: asyncio.StreamReader) -> bool:
    """Read one response; True when the server keeps the connection open."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    status = head.split(" ", 2)[1]
    if status != "200":
        raise OSError(f"HTTP {status}")
    headers = dict(line.split(":", 1) for line in head.split("\r\n")[1:] if ":" in line)
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                break
    return headers.get("connection") != "close"


async def _client(port: int, deadline: float, interval: float | None, rng: random.Random,
                  latencies: list[float], errors: list[str]) -> None:
    reader = writer = None
    next_at = time.monotonic() + (rng.uniform(0, interval) if interval else 0.0)
    try:
        while True:
            if interval:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at += interval
            if time.monotonic() >= deadline:
                return
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            t0 = time.perf_counter()
            try:
                writer.write(REQUEST)
                keep = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError) as e:
                errors.append(str(e))
                writer.close()
                reader = writer = None
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)
            if not keep:
                writer.close()
                reader = writer = None
    finally:
        if writer is not None:
            writer.close()


async def _load(port: int, clients: int, seconds: float, interval: float | None,
                seed: int) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    rng = random.Random(seed)
    await asyncio.gather(*(_client(port, deadline, interval, random.Random(rng.random()),
                                   latencies, errors) for _ in range(clients)))
    return latencies, errors


def load(port: int, clients: int, seconds: float, interval: float | None = None,
         seed: int = 3) -> dict:
    t0 = time.monotonic()
    latencies, errors = asyncio.run(_load(port, clients, seconds, interval, seed))
    wall = time.monotonic() - t0
    return {"clients": clients, "seconds": seconds, "interval_s": interval,
            "requests": len(latencies), "errors": len(errors),
            "requests_per_s": len(latencies) / wall if wall else 0.0,
            "latency_ms": Summary.of(latencies).as_dict()}


# (label, clients, interval): closed loop with 1 and 50 clients, open loop with 50 scrapers.
SHAPES = (("1 client, back to back", 1, None),
          ("50 clients, back to back", 50, None),
          ("50 scrapers, each every 1 s", 50, 1.0))


def scrape_cost(seconds: float = 30.0, peer: bool = True) -> dict:
    kinds = [("node-resize-exporter", lambda: ResizeExporter("auto"))]
    if peer:
        kinds.append(("node_exporter", NodeExporter))
    out: dict = {}
    for name, make in kinds:
        with make() as exporter:
            out[name] = {label: load(exporter.port, clients, seconds, interval)
                         for label, clients, interval in SHAPES}
    return out
