"""Rejection reasons spelled exactly as the kubelet spells them (the pod's status.reason, the
`reason` of kubelet_admission_rejections_total): the forecast's reasons, the catalogue's, the
runbooks' and the alert tests'. tests/fixtures/kubelet-admission/reasons.txt is the kubelet's
list, transcribed from its source."""
from __future__ import annotations

import re
from pathlib import Path

from exporter.correlate import readmission_forecast

REPO = Path(__file__).resolve().parents[2]
EXPORTERS_OWN = {"NotReady", "Running"}  # readiness lost after a resync; kept pods


def _kubelet_reasons() -> set[str]:
    lines = (REPO / "tests/fixtures/kubelet-admission/reasons.txt").read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def _is_kubelets(reason: str) -> bool:
    known = _kubelet_reasons()
    # "OutOf" + a resource name, as the kubelet formats every resource it has no constant for.
    return reason in known or re.fullmatch(r"OutOf(hugepages-\d+[KMG]i|[a-z0-9.-]+/[\w.-]+)",
                                           reason) is not None


def test_the_forecasts_reasons_are_the_kubelets():
    names = [v for k, v in vars(readmission_forecast).items()
             if k.isupper() and isinstance(v, str) and (v.startswith("OutOf")
                                                         or v.endswith("Error"))]
    assert names
    assert [n for n in names if not _is_kubelets(n)] == []


def test_every_reason_the_docs_and_alert_tests_name_is_the_kubelets_or_ours():
    texts = [REPO / "docs" / "metrics.md", REPO / "docs" / "runbooks.md",
             *sorted((REPO / "alerts" / "tests").glob("*.yml"))]
    found = set()
    for path in texts:
        found |= set(re.findall(r"\b(OutOf[\w.-]*|\w+AdmissionError|NodeCapacityExceeded)\b",
                                path.read_text()))
    found.discard("OutOf")
    wrong = sorted(r for r in found if not _is_kubelets(r) and r not in EXPORTERS_OWN)
    assert wrong == [], f"reasons no kubelet gives: {wrong}"
