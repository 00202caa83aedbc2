"""The DaemonSet's memory request and limit against what the exporter really uses.

A real `run` with the DaemonSet's own args (deploy/daemonset.yaml: --web.auth=kubernetes over
TLS, the journal, every default source) against the test API server (the node's Node and Lease,
30 pods, podresources answering), scraped with a bearer token as the ServiceMonitor does: its
RSS is the steady state. Then the hostile rounds in the same process: 20,000 pods on the node,
first through the watch (which keeps them), then in the relist after the watch expired, refused
at its 10,000-object bound after holding that many raw objects; then a flood of new bearer
tokens on /metrics. VmHWM (the peak RSS the kernel saw) is the peak. The request must not be
more than 2x the steady state (a DaemonSet's request is reserved on every node), and the limit
must be at least 1.5x the peak (an OOM kill loses the node's episodes in flight).

The machine-wide hotplug lock is held: a resize meanwhile would be a different steady state.
"""
from __future__ import annotations

import secrets

from bench.memory import NODE, PodExporter, PodShaped, status
from testkit.deploy import container_of, load_manifest
from testkit.exporter_proc import poll_until
from testkit.kernel import hotplug_lock
from testkit.kubeauth import BearerFlood

MiB = 2**20
HOSTILE_PODS = 20_000
FLOOD_REQUESTS = 2_000


def _scrape_alive(world: PodShaped, exp: PodExporter) -> str:
    """A scrape's text; an exporter that died fails the test now, not at the wait's end (a
    crash left a 300 s wait to run out in CI)."""
    if exp.proc.poll() is not None:
        raise AssertionError(f"the exporter died{exp.tail()}")
    return world.scrape(exp.port)[1]


def quantity_mib(text: str) -> float:
    units = {"Mi": 1, "Gi": 1024, "Ki": 1 / 1024}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    raise AssertionError(f"write the DaemonSet's memory in Mi or Gi: {text!r}")


def resources() -> tuple[float, float]:
    res = container_of(load_manifest("daemonset.yaml"))["resources"]
    return quantity_mib(res["requests"]["memory"]), quantity_mib(res["limits"]["memory"])


def test_the_request_fits_the_steady_state_and_the_limit_the_hostile_peak():
    request, limit = resources()
    with hotplug_lock(), PodShaped() as world, PodExporter(world) as exp:
        for _ in range(3):  # a few scrapes, as Prometheus makes them
            code, text = world.scrape(exp.port)
            assert code == 200, text[-300:]
        steady = status(exp.pid)["VmRSS"] / MiB

        # Round 1: 20,000 pods on the node: the watch delivers them one by one, then (the
        # watch expired) the relist of 20,030 is refused at its object bound.
        for i in range(HOSTILE_PODS):
            world.api.put_pod(f"many-{i}", node=NODE, requests={"cpu": "1m", "memory": "1Mi"})
        poll_until(lambda: _scrape_alive(world, exp),
                   lambda text: f"node_resize_readmission_forecast_pods {HOSTILE_PODS + 30}"
                   in text, 300, 1.0,
                   lambda text: AssertionError(f"the watch never delivered them:\n{text[-2000:]}"
                                               f"{exp.tail()}"))
        world.api.compact()
        poll_until(lambda: _scrape_alive(world, exp),
                   lambda text: 'node_resize_exporter_source_up{source="kube_pods"} 0' in text,
                   300, 1.0,
                   lambda text: AssertionError(f"the relist was not refused:\n{text[-2000:]}"
                                               f"{exp.tail()}"))

        # Round 2: a flood of new tokens (each one a TokenReview or a 429).
        with BearerFlood(exp.port, lambda i: f"flood-{i}-{secrets.token_hex(8)}") as flood:
            poll_until(lambda: flood.sent, lambda n: n >= FLOOD_REQUESTS, 120, 0.2,
                       lambda n: AssertionError(f"only {n} flood requests"))
        assert world.scrape(exp.port)[0] == 200  # still serving
        peak = status(exp.pid)["VmHWM"] / MiB

    figures = (f"steady {steady:.0f} MiB, peak {peak:.0f} MiB; request {request:.0f} Mi, "
               f"limit {limit:.0f} Mi")
    print(figures)
    assert request <= 2 * steady, f"the request reserves more than twice the use: {figures}"
    assert request >= steady, f"the request is below the steady state: {figures}"
    assert limit >= 1.5 * peak, f"the limit leaves less than 1.5x the peak: {figures}"
