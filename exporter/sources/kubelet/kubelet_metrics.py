"""Optional: the kubelet's own /metrics, to learn whether it resyncs capacity natively.

Two questions, answered from one scrape every `interval` seconds:
- which resize-related feature gates are on (kubernetes_feature_enabled{name=...});
- whether the kubelet already exports the KEP-3953/5578 metrics under either proposed name
  set (node_resize_resync_*, kubelet_node_resize_requests_total,
  kubelet_node_resize_errors_total). If it does, our numbers can be compared with its own.
The kubelet's /metrics usually needs a bearer token with get on nodes/metrics; the service
account token is used when present.

The URL is hostile territory for that token: only https://, or http:// to a
loopback address (the read-only port on this host), is accepted, checked at start-up (exit 2);
no file:// or other scheme (urllib followed them and logged /etc/shadow's first line); no
credentials inside the URL; redirects are never followed (a 302 to another host took the
token along), a redirect is "down" with where it pointed. The answer is bounded in size
(MAX_BYTES) and in time as a whole (`timeout`, so one trickled byte a second cannot wedge the
source), through httpx2 (installed with lightkube) instead of urllib.
"""
from __future__ import annotations

import ipaddress
import os
import ssl
import time
import urllib.parse
from typing import Any

import httpx2 as httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.checks import FAIL, OK, Check
from exporter.clock import Clock
from exporter.config.options import Opt
from exporter.config.types import ParamType
from exporter.events import KubeletFeatures, KubeletProcess, MalformedInput, SourceStatus
from exporter.kube.client import SERVICE_ACCOUNT_DIR
from exporter.sources.base import Emit, Source
from exporter.sources.kubelet.kubelet_process import start_time_from_metrics
from exporter.sources.registry import KUBERNETES, SourceSpec, register

GATES = ("InPlaceNodeResourceResize", "NodeResourceHotPlug", "NodeResourceHotUnPlug",
         "BalloonPod")
NATIVE_PREFIXES = ("node_resize_resync_", "kubelet_node_resize_requests_total",
                   "kubelet_node_resize_errors_total")
MAX_BYTES = 32 * 1024 * 1024  # a kubelet's /metrics is a few MB; refuse anything absurd


def check_url(url: str) -> str:
    """The URL if a token may be sent to it; ValueError saying why not and what to use."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    fix = ("use https://NODE:10250/metrics (the kubelet's authenticated port), or "
           "http://127.0.0.1:10255/metrics (its read-only port on this host)")
    if scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"{url[:100]!r} is not an http(s) URL with a host; {fix}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{scheme}://...@{parts.hostname}: credentials in the URL are not "
                         f"accepted (they would be logged); the service account token is sent "
                         f"as a bearer token instead")
    if scheme == "http" and not _loopback(parts.hostname):
        raise ValueError(f"{url[:100]!r}: plain http is only accepted to a loopback address "
                         f"(the service account token would cross the network in clear); {fix}")
    return url


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Refused(Exception):
    """The kubelet's answer was not taken (a redirect, too large, too slow): down, with why."""


def parse_features(text: str, now: float) -> KubeletFeatures:
    """Exposition text -> KubeletFeatures. Raises ValueError when the text does not parse."""
    gates: dict[str, bool] = {}
    native: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kubernetes_feature_enabled":
                gate = sample.labels.get("name", "")
                if gate in GATES:
                    gates[gate] = sample.value >= 1
            elif sample.name.startswith(NATIVE_PREFIXES) and not sample.name.endswith(
                    "_created"):
                # Name histograms by family (not _bucket/_sum/_count), counters by sample.
                histogram = family.type in ("histogram", "summary", "gaugehistogram")
                native.add(family.name if histogram else sample.name)
    return KubeletFeatures(now, gates, frozenset(native))


class KubeletMetricsSource(Source):
    name = "kubelet_metrics"

    def __init__(self, clock: Clock, *, url: str, interval: float = 60.0,
                 timeout: float = 5.0, token_file: str | None = None,
                 ca_file: str | None = None, insecure_skip_verify: bool = False) -> None:
        super().__init__(clock)
        self.url = url
        self.interval = interval
        self.timeout = timeout
        default_token = os.path.join(SERVICE_ACCOUNT_DIR, "token")
        self.token_file = token_file if token_file is not None else (
            default_token if os.path.isfile(default_token) else None)
        self.ca_file = ca_file
        self.insecure_skip_verify = insecure_skip_verify
        self._up: bool | None = None
        self._last: KubeletFeatures | None = None
        self._last_start: float | None = None
        self._client: httpx.Client | None = None

    def loop(self, emit: Emit) -> None:
        while not self.stopping.is_set():
            self.poll(emit)
            self.stopping.wait(self.interval)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def poll(self, emit: Emit) -> None:
        try:
            body = self._fetch()
        except httpx.HTTPStatusError as e:
            code = e.response.status_code
            hint = ("; RBAC: grant get on nodes/metrics (or nodes/proxy) to the exporter"
                    if code in (401, 403) else "")
            self._down(emit, f"kubelet metrics {self.url} answered {code}{hint}")
            return
        except Refused as e:
            self._down(emit, f"kubelet metrics {self.url}: {e}")
            return
        except (httpx.HTTPError, OSError, ValueError) as e:
            self._down(emit, f"kubelet metrics {self.url} unreachable: {e or type(e).__name__}")
            return
        now = self.clock.now()
        try:
            features = parse_features(body.decode("utf-8", errors="replace"), now)
        except (ValueError, IndexError, KeyError, TypeError) as e:
            emit(MalformedInput(self.name, f"{self.url} is not Prometheus text: {e}", now))
            return
        self._set_up(emit, True, f"scraping {self.url}")
        # The kubelet's start time, for restarts where /proc does not show it (no hostPID)
        start = start_time_from_metrics(body)
        if start is not None and start != self._last_start:
            self._last_start = start
            emit(KubeletProcess(now, start))
        if self._last is None or (features.gates, features.native_metrics) != (
                self._last.gates, self._last.native_metrics):
            self._last = features
            emit(features)

    def _http(self) -> httpx.Client:
        if self._client is None:
            check_url(self.url)  # also at start-up (options.py): never send to anything else
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.insecure_skip_verify:  # kubelet serving certs are often self-signed
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._client = httpx.Client(verify=context, follow_redirects=False,
                                        trust_env=False, timeout=self.timeout)
        return self._client

    def _fetch(self) -> bytes:
        headers = {"Accept": "text/plain;version=0.0.4"}
        if self.token_file:
            with open(self.token_file) as f:
                headers["Authorization"] = f"Bearer {f.read().strip()}"
        deadline = time.monotonic() + self.timeout
        with self._http().stream("GET", self.url, headers=headers) as resp:
            if resp.is_redirect:
                where = resp.headers.get("location", "")[:200]
                raise Refused(f"redirected ({resp.status_code}) to {where!r}: not followed, "
                              "the token is only sent to the configured URL; point "
                              "--kubelet-metrics-url at the final address")
            resp.raise_for_status()
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    raise Refused(f"answer larger than {MAX_BYTES} bytes; not read further")
                if time.monotonic() > deadline:
                    raise Refused(f"answer not complete after {self.timeout:.0f} s (read "
                                  f"{len(body)} bytes): too slow, dropped")
        return bytes(body)

    def _down(self, emit: Emit, reason: str) -> None:
        # Down, it no longer vouches for the kubelet: back up, it states both again.
        self._last, self._last_start = None, None
        if self._up is not False:
            self._up = False  # the agent logs the change
            emit(SourceStatus(self.name, False, self.clock.now(), reason))

    def _set_up(self, emit: Emit, up: bool, reason: str) -> None:
        if self._up is not up:
            self._up = up
            emit(SourceStatus(self.name, up, self.clock.now(), reason))



INTERVAL = 60.0


class KubeletMetricsURL(ParamType):
    """https://, or http:// to a loopback address: the service account token goes there."""

    name = "url"

    def convert(self, value: Any, param: Any, ctx: Any) -> str | None:
        if value is None or str(value) == "":
            return None
        try:
            return check_url(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _check(source: Source) -> list[Check]:
    """One poll, as the running source polls."""
    assert isinstance(source, KubeletMetricsSource)
    seen: list[object] = []
    source.poll(seen.append)
    down = [e for e in seen if isinstance(e, SourceStatus) and not e.up]
    if down:
        return [Check("kubelet metrics", FAIL, down[-1].reason,
                      "check --kubelet-metrics-url and get on nodes/metrics")]
    return [Check("kubelet metrics", OK, f"{source.url} answers with Prometheus text")]


KUBELET_METRICS_URL: Opt[str | None] = Opt(
    "kubelet_metrics_url",
    ("--kubelet-metrics-url",),
    None,
    "Scrape the kubelet's /metrics for resize feature gates (optional; https, or "
    "http to a loopback address).",
    KubeletMetricsURL(),
)

register(
    SourceSpec(
        "kubelet_metrics",
        KUBERNETES,
        "the kubelet's own /metrics (feature gates)",
        lambda ctx: KubeletMetricsSource(
            ctx.clock, url=str(KUBELET_METRICS_URL.of(ctx.options)), interval=INTERVAL
        ),
        wanted=lambda options: bool(KUBELET_METRICS_URL.of(options)),
        order=71,
        options=(KUBELET_METRICS_URL,),
        check=_check,
    )
)
