"""The PodDisruptionBudget watch (policy/v1, every namespace) against the test API server over
real HTTP: listed and watched as the plan needs them, 403 and a list past its bound are down
with the reason (then recover), a malformed budget is counted and the others flow."""
from __future__ import annotations

import pytest

from exporter.clock import MonotonicWallClock
from exporter.events import MalformedInput, PdbsRelisted, PdbStatus, SourceStatus
from exporter.sources.apiserver.kube_pdbs import KubePdbsSource
from testkit.event_log import started_sources, wait_until
from testkit.fakes.apiserver import FakeApiServer


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def running(api):
    yield from started_sources(lambda: KubePdbsSource(
        MonotonicWallClock(), kubeconfig=api.kubeconfig_path, backoff_initial=0.05,
        backoff_max=0.5))


def test_budgets_of_every_namespace_are_listed_watched_and_deleted(api, running):
    api.put_pdb("web", namespace="shop", match_labels={"app": "web"}, disruptions_allowed=1)
    api.put_pdb("db", namespace="data", match_expressions=[
        {"key": "app", "operator": "In", "values": ["db", "cache"]}], disruptions_allowed=0)
    source, log = running()
    relisted = log.wait_for(PdbsRelisted)
    assert relisted.keys == {"shop/web", "data/db"}
    got = {e.key: e for e in log.of(PdbStatus)}
    assert got["shop/web"].match_labels == (("app", "web"),)
    assert got["shop/web"].disruptions_allowed == 1 and got["shop/web"].selector == "set"
    assert got["data/db"].match_expressions[0].values == ("db", "cache")
    assert got["data/db"].generation == got["data/db"].observed_generation == 1
    listed = api.requests_for("poddisruptionbudgets", watch=False)[0]
    assert "fieldSelector" not in listed  # every namespace's, cluster-wide
    assert log.wait_for(SourceStatus).up
    api.wait_for_watches(1, "poddisruptionbudgets")
    # the spec changes (generation 2) before the disruption controller saw it: behind
    api.put_pdb("web", namespace="shop", match_labels={"app": "web"}, disruptions_allowed=1,
                observed_generation=1)
    behind = log.wait_for(PdbStatus, lambda e: e.key == "shop/web" and e.generation == 2)
    assert behind.observed_generation == 1
    api.delete_pdb("db", namespace="data")
    gone = log.wait_for(PdbStatus, lambda e: e.key == "data/db" and e.deleted)
    assert gone.deleted


def test_forbidden_is_down_with_the_grant_to_add_then_recovers(api, running):
    api.put_pdb("web", match_labels={"app": "web"})
    api.set_forbidden(True, "poddisruptionbudgets")
    source, log = running()
    down = log.wait_for(SourceStatus)
    assert not down.up and "forbidden" in down.reason and "poddisruptionbudgets" in down.reason
    assert not log.of(PdbsRelisted)
    api.set_forbidden(False, "poddisruptionbudgets")
    assert log.wait_for(PdbsRelisted).keys == {"default/web"}
    wait_until(lambda: log.of(SourceStatus)[-1].up, "up again")


def test_a_list_past_the_bound_is_refused_then_recovers(api, running, monkeypatch):
    """LIST_MAX_OBJECTS (5 here instead of 10,000): past it down naming the bound, nothing of
    the list used (a judgement on some budgets would not be one of all)."""
    from exporter.sources.apiserver import listwatch
    monkeypatch.setattr(listwatch, "LIST_MAX_OBJECTS", 5)
    for i in range(6):
        api.put_pdb(f"b{i}", match_labels={"app": f"a{i}"})
    source, log = running()
    down = log.wait_for(SourceStatus, lambda e: not e.up)
    assert "poddisruptionbudgets has more than 5 objects" in down.reason
    assert not log.of(PdbStatus) and not log.of(PdbsRelisted)
    api.delete_pdb("b5")
    assert len(log.wait_for(PdbsRelisted).keys) == 5


def test_a_malformed_budget_is_counted_and_the_others_flow(api, running):
    api.put_raw("poddisruptionbudgets", {
        "kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
        "metadata": {"name": "odd", "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": {f"k{i}": "v" for i in range(100)}}},
        "status": {"observedGeneration": 1, "disruptionsAllowed": "many"}})
    api.put_pdb("fine", match_labels={"app": "web"})
    source, log = running()
    relisted = log.wait_for(PdbsRelisted)
    assert relisted.keys == {"default/odd", "default/fine"}
    odd = next(e for e in log.of(PdbStatus) if e.name == "odd")
    assert odd.selector == "unread" and odd.disruptions_allowed == 0
    details = [m.detail for m in log.of(MalformedInput)]
    assert len(details) == 2 and all("default/odd" in d for d in details)
