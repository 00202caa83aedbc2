"""The rendering cache of exporter/web/exposition.py is keyed by the format negotiated, not by
what the client wrote: clients each asking a different OpenMetrics `version=` (or Accept
spelling) share one rendering instead of costing one each (5.9-6.4 ms of CPU per answer
measured against 0.13-0.16 ms for a cached one, docs/security.md)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from exporter.web.exposition import CACHED_FORMATS, Exposition


def _exposition() -> Exposition:
    registry = CollectorRegistry()
    Gauge("node_resize_test", "a gauge", registry=registry).set(1)
    # max_age: long, so that only the Accept header can cause a new rendering here.
    return Exposition(registry, runtime_metrics=False, max_age=3600)


def test_forty_openmetrics_versions_share_one_rendering():
    exposition = _exposition()
    types = set()
    for i in range(40):
        rendering = exposition.get(f"application/openmetrics-text; version=1.0.{i}")
        types.add(rendering.content_type)
        assert rendering.body.endswith(b"# EOF\n")
    assert exposition.renderings == 1
    assert types == {"application/openmetrics-text; version=1.0.0; charset=utf-8; "
                     "escaping=underscores"}


def test_spellings_of_the_text_format_share_one_rendering():
    exposition = _exposition()
    for accept in ("", "text/plain", "*/*", "text/plain;version=0.0.4", "text/html",
                   "application/openmetrics-text; version=0.0.1", "garbage;;;=",
                   "application/openmetrics-text; version=1.a"):
        assert exposition.get(accept).content_type.startswith("text/plain; version=0.0.4")
    assert exposition.renderings == 1


def test_every_negotiable_format_fits_in_the_cache():
    """Whatever Accept and Accept-Encoding headers clients rotate through, each format is
    rendered once: none can evict another."""
    exposition = _exposition()
    accepts = [""]
    for kind in ("text/plain", "application/openmetrics-text"):
        for version in ("1.0.0", "1.9.9", "2.0.0", "3.1.4", ""):
            for escaping in ("", "underscores", "dots", "values", "allow-utf-8", "bogus"):
                accept = kind + (f"; version={version}" if version else "")
                accepts.append(accept + (f"; escaping={escaping}" if escaping else ""))
    for _ in range(2):
        for accept in accepts:
            for encoding in ("", "gzip"):
                exposition.get(accept, encoding)
    formats = {(exposition.get(a).content_type) for a in accepts}
    assert 2 * len(formats) <= CACHED_FORMATS
    assert exposition.renderings == 2 * len(formats)


def test_a_higher_openmetrics_version_keeps_what_it_means():
    exposition = _exposition()
    assert "version=2.0.0" in exposition.get(
        "application/openmetrics-text; version=2.7.1").content_type
    assert "escaping=values" in exposition.get(
        "application/openmetrics-text; version=1.0.3; escaping=values").content_type
