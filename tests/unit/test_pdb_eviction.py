"""PodDisruptionBudgets as the eviction subresource applies them (exporter/plan/eviction.py,
after kubernetes pkg/registry/core/pod/storage/eviction.go): the selector, the pods that ignore
a budget, more than one budget, a status behind its spec, no disruption left, the allowance
spent across several pods of one plan; the Pod and PodDisruptionBudget JSON they are read
from, bounded; and the plan's answer (pdb_blocked, the evict action, `inputs`)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest

from exporter.events import PdbsRelisted, PdbStatus, PodStatus, SelectorTerm, SourceStatus
from exporter.kube.convert import LABELS_MAX, pdb_status, pod_status, selects
from exporter.plan.answer import answer
from exporter.plan.eviction import NOT_LISTED, Budgets, BudgetsView, judge
from exporter.plan.model import Change
from exporter.plan.planner import plan, unpluggable
from testkit.forecast import T, forecaster, node, pod, snapshot
from tests.unit.test_plan import hardware, inputs

SCHEMA = json.loads((Path(__file__).parents[2] / "docs/plan.schema.json").read_text())


def budget(name: str = "web", namespace: str = "default", *, labels=(("app", "web"),),
           terms=(), selector: str = "set", allowed: int = 1, current: int = 2,
           desired: int = 1, generation: int = 1, observed: int = 1, policy: str = "",
           disrupted: int = 0) -> PdbStatus:
    return PdbStatus(T, namespace, name, selector, tuple(labels), tuple(terms), allowed,
                     current, desired, generation, observed, disrupted, policy)


def a_pod(name: str = "web-1", namespace: str = "default", *, labels=(("app", "web"),),
          phase: str = "Running", ready: bool = True, deleting: bool = False) -> PodStatus:
    return PodStatus(T, f"uid-{name}", namespace, name, phase, "", ready,
                     labels=None if labels is None else tuple(sorted(labels)),
                     deleting=deleting)


def verdicts(pods, *budgets_):
    return [v.blocked for v in judge([(p.namespace, p.name, p) for p in pods],
                                     Budgets.of(budgets_))]


# ---------------------------------------------------------------- the selector


@pytest.mark.parametrize("terms, labels, want", [
    ([SelectorTerm("tier", "In", ("a", "b"))], {"tier": "b"}, True),
    ([SelectorTerm("tier", "In", ("a", "b"))], {"tier": "c"}, False),
    ([SelectorTerm("tier", "In", ("a",))], {}, False),
    ([SelectorTerm("tier", "NotIn", ("a",))], {}, True),  # absent: not in
    ([SelectorTerm("tier", "NotIn", ("a",))], {"tier": "a"}, False),
    ([SelectorTerm("tier", "NotIn", ("a",))], {"tier": "z"}, True),
    ([SelectorTerm("tier", "Exists")], {"tier": ""}, True),
    ([SelectorTerm("tier", "Exists")], {}, False),
    ([SelectorTerm("tier", "DoesNotExist")], {}, True),
    ([SelectorTerm("tier", "DoesNotExist")], {"tier": "x"}, False),
    # every term and every matchLabels entry must hold
    ([SelectorTerm("tier", "Exists"), SelectorTerm("env", "In", ("prod",))],
     {"tier": "x", "env": "dev"}, False),
])
def test_match_expressions_all_four_operators(terms, labels, want):
    b = budget(labels=(), terms=terms)
    assert selects(b, labels) is want
    assert selects(budget(labels=(("app", "web"),), terms=terms), {**labels, "app": "db"}) \
        is False


def test_no_selector_an_empty_or_invalid_one_selects_nothing_and_an_unread_one_is_unknown():
    everything = {"app": "web"}
    for obj_selector in (None, {}, {"matchLabels": {}, "matchExpressions": []}):
        b = pdb_status({"metadata": {"name": "x", "namespace": "default"},
                        "spec": {"selector": obj_selector}}, T).event
        assert isinstance(b, PdbStatus) and b.selector == "nothing"
        assert selects(b, everything) is False
    for bad in ({"key": "app", "operator": "Matches", "values": ["web"]},
                {"key": "app", "operator": "In", "values": []},
                {"key": "app", "operator": "Exists", "values": ["web"]}):
        b = pdb_status({"metadata": {"name": "x", "namespace": "default"},
                        "spec": {"selector": {"matchExpressions": [bad]}}}, T).event
        assert b.selector == "invalid" and selects(b, everything) is False
    converted = pdb_status({"metadata": {"name": "x", "namespace": "default"},
                            "spec": {"selector": {"matchLabels": {
                                f"k{i}": "v" for i in range(500)}}}}, T)
    assert converted.event.selector == "unread" and converted.problems
    assert selects(converted.event, everything) is None


# ---------------------------------------------------------------- the eviction rules


def test_a_pod_no_budget_selects_is_evicted_and_other_namespaces_budgets_do_not_count():
    assert verdicts([a_pod(labels=(("app", "db"),))], budget(allowed=0)) == [False]
    assert verdicts([a_pod()], budget(namespace="other", allowed=0)) == [False]


@pytest.mark.parametrize("phase, deleting", [("Succeeded", False), ("Failed", False),
                                             ("Pending", False), ("Running", True)])
def test_terminal_pending_and_deleting_pods_ignore_their_budget(phase, deleting):
    assert verdicts([a_pod(phase=phase, deleting=deleting)], budget(allowed=0)) == [False]


def test_more_than_one_budget_refuses_the_eviction():
    got = judge([("default", "web-1", a_pod())],
                Budgets.of([budget("a", allowed=5), budget("b", allowed=5)]))
    assert got[0].blocked is True and "more than one" in got[0].detail


def test_a_status_behind_its_spec_or_no_disruption_left_refuses():
    behind = judge([("default", "web-1", a_pod())],
                   Budgets.of([budget(allowed=3, generation=2, observed=1)]))[0]
    assert behind.blocked is True and "observedGeneration 1 < generation 2" in behind.detail
    none_left = judge([("default", "web-1", a_pod())], Budgets.of([budget(allowed=0)]))[0]
    assert none_left.blocked is True and "allows no disruption" in none_left.detail
    assert verdicts([a_pod()], budget(allowed=-1)) == [True]
    assert verdicts([a_pod()], budget(allowed=3, disrupted=2001)) == [True]
    assert verdicts([a_pod()], budget(allowed=1)) == [False]


def test_an_unready_pod_goes_with_always_allow_or_a_healthy_budget():
    unready = a_pod(ready=False)
    assert verdicts([unready], budget(allowed=0, policy="AlwaysAllow")) == [False]
    assert verdicts([unready], budget(allowed=0, current=3, desired=2)) == [False]
    assert verdicts([unready], budget(allowed=0, current=1, desired=2)) == [True]
    assert verdicts([unready], budget(allowed=0, current=0, desired=0)) == [True]
    # a Ready pod is never let through that way
    assert verdicts([a_pod()], budget(allowed=0, policy="AlwaysAllow")) == [True]


def test_several_pods_of_one_budget_spend_its_allowance_in_the_plans_order():
    pods = [a_pod(f"web-{i}") for i in range(4)]
    assert verdicts(pods, budget(allowed=2, current=4, desired=2)) == [False, False, True, True]
    got = judge([(p.namespace, p.name, p) for p in pods],
                Budgets.of([budget(allowed=2, current=4, desired=2)]))
    assert "after the 2 evicted before it" in got[2].detail
    # each Ready pod spent is one healthy pod fewer: an unready one after them no longer
    # goes for free (current 3 >= desired 2 before; 1 < 2 after two evictions)
    mixed = [a_pod("web-0"), a_pod("web-1"), a_pod("sick", ready=False)]
    assert verdicts(mixed, budget(allowed=2, current=3, desired=2)) == [False, False, True]
    assert verdicts(mixed[2:], budget(allowed=2, current=3, desired=2)) == [False]


def test_unknown_labels_or_an_unseen_pod_cannot_be_judged():
    assert verdicts([a_pod(labels=None)], budget()) == [None]
    assert judge([("default", "gone", None)], Budgets.of([budget()]))[0].blocked is None
    unread = budget("huge", selector="unread", labels=())
    assert verdicts([a_pod()], unread) == [None]


# ---------------------------------------------------------------- the JSON, bounded


def test_a_pods_labels_and_deletion_are_read_and_too_many_are_not_kept():
    obj = pod("web-1")
    obj["metadata"]["labels"] = {"app": "web", "tier": "front"}
    obj["metadata"]["deletionTimestamp"] = "2026-11-23T08:00:00Z"
    got = pod_status(obj, T, None)
    assert got.event.labels == (("app", "web"), ("tier", "front")) and got.event.deleting
    obj["metadata"]["labels"] = {f"k{i}": "v" for i in range(LABELS_MAX + 1)}
    got = pod_status(obj, T, None)
    assert got.event.labels is None and any("labels not kept" in p for p in got.problems)
    obj["metadata"]["labels"] = {"app": "x" * 5000}
    assert pod_status(obj, T, None).event.labels is None
    obj["metadata"]["labels"] = {"app": 7}
    assert pod_status(obj, T, None).event.labels is None
    del obj["metadata"]["labels"]
    assert pod_status(obj, T, None).event.labels == ()


def test_a_budget_is_read_as_the_api_serves_it_and_hostile_numbers_never_let_one_through():
    obj = {"kind": "PodDisruptionBudget", "apiVersion": "policy/v1",
           "metadata": {"name": "web", "namespace": "shop", "generation": 3,
                        "resourceVersion": "7"},
           "spec": {"minAvailable": 2, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                    "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [
                        {"key": "tier", "operator": "In", "values": ["a", "b"]}]}},
           "status": {"observedGeneration": 3, "disruptionsAllowed": 1, "currentHealthy": 3,
                      "desiredHealthy": 2, "expectedPods": 3,
                      "disruptedPods": {"web-0": "2026-11-23T08:00:00Z"}}}
    got = pdb_status(obj, T)
    b = got.event
    assert not got.problems and b.key == "shop/web" and b.selector == "set"
    assert (b.disruptions_allowed, b.current_healthy, b.desired_healthy, b.generation,
            b.observed_generation, b.disrupted_pods) == (1, 3, 2, 3, 3, 1)
    assert b.match_labels == (("app", "web"),)
    assert b.match_expressions == (SelectorTerm("tier", "In", ("a", "b")),)
    assert b.unhealthy_pod_eviction_policy == "AlwaysAllow"
    obj["status"]["disruptionsAllowed"] = "9"
    obj["status"]["observedGeneration"] = True
    got = pdb_status(obj, T)
    assert got.event.disruptions_allowed == 0 and len(got.problems) == 2
    for odd in (None, [], {"metadata": {"name": "x"}}, {"metadata": []}):
        assert pdb_status(odd, T).event is None


def test_the_view_is_unread_until_listed_and_while_its_source_is_down():
    view = BudgetsView()
    assert view.read() == NOT_LISTED
    view.handle(budget("a"))
    view.handle(budget("b"))
    view.handle(PdbsRelisted(T, frozenset({"default/a"})))
    assert len(view.read()) == 1
    view.handle(SourceStatus("kube_pdbs", False, T, "RBAC: forbidden"))
    assert view.read() == "RBAC: forbidden"
    view.handle(SourceStatus("kube_pdbs", True, T, "listed"))
    view.handle(dataclasses.replace(budget("a"), deleted=True))
    assert len(view.read()) == 0


# ---------------------------------------------------------------- the plan's answer


def _labelled(name: str, labels: dict[str, str]) -> dict:
    obj = pod(name, {"cpu": "1500m"})
    obj["metadata"]["labels"] = labels
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return obj


def _plan(budgets: Budgets | None, not_read: dict[str, str] | None = None):
    objs = [_labelled("web-1", {"app": "web"}), _labelled("web-2", {"app": "web"}),
            _labelled("db", {"app": "db"})]
    f = forecaster(node(cpu="2", allocatable_cpu="2"), snapshot(2), objs)
    pods = {e.uid: e for e in (pod_status(o, T, None).event for o in objs)}
    i = inputs(hardware(), cpus=2, forecast=f, running=None, cpu_checkpoint=None,
               memory_checkpoint=None, budgets=budgets, pods=pods,
               not_read={"running_containers": "x", "cpu_manager_checkpoint": "x",
                         **(not_read or {})})
    return answer(Change(-1, 0), i, node="vm", now=T), i


def test_the_plan_says_which_evictions_a_budget_refuses_without_changing_the_verdict():
    p, _ = _plan(Budgets.of([budget("web", allowed=1, current=2, desired=1),
                             budget("db", labels=(("app", "db"),), allowed=0)]))
    doc = p.json()
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(json.dumps(doc)))
    assert {r["name"]: r["pdb_blocked"] for r in doc["pods"]["rejected"]} == \
        {"web-1": False, "web-2": True, "db": True}
    evict = next(a for a in doc["actions"] if a["do"] == "evict")
    assert {e["name"]: (e["pdb_blocked"], e["pdb"]) for e in evict["pods"]} == {
        "web-1": (False, "default/web"), "web-2": (True, "default/web"),
        "db": (True, "default/db")}
    assert "would refuse to evict" in evict_step(doc)
    assert doc["inputs"]["pod_disruption_budgets"] == "read"
    assert doc["verdict"] == "harmful"
    assert any("evictions the API server would refuse" in h for h in doc["harm"])


def evict_step(doc) -> str:
    return next(s for s in doc["steps"] if s.startswith("move away"))


def test_unread_budgets_leave_pdb_blocked_null_and_are_named_in_inputs():
    p, i = _plan(None, {"pod_disruption_budgets": "RBAC: forbidden to list/watch "
                                                  "poddisruptionbudgets"})
    doc = p.json()
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(json.dumps(doc)))
    assert {r["pdb_blocked"] for r in doc["pods"]["rejected"]} == {None}
    assert doc["inputs"]["pod_disruption_budgets"].startswith("RBAC: forbidden")
    assert "pod disruption budgets: RBAC: forbidden to list/watch poddisruptionbudgets" in \
        doc["unknown"]
    assert doc["verdict"] == "harmful"  # what a restart would reject is harm, whatever else
    # budgets decide whether an eviction can be done, not what a change hurts: the gauges'
    # "can leave now" is the same with them read, unread or refusing
    refusing = dataclasses.replace(i, budgets=Budgets.of([budget(allowed=0)]), not_read={
        k: v for k, v in i.not_read.items() if k != "pod_disruption_budgets"})
    assert unpluggable(i, []) == unpluggable(refusing, [])


def test_a_plan_that_evicts_nobody_does_not_need_the_budgets():
    objs = [pod("small", {"cpu": "100m"})]
    f = forecaster(node(cpu="2", allocatable_cpu="2"), snapshot(2), objs)
    i = inputs(hardware(), cpus=2, forecast=f, budgets=None,
               not_read={"pod_disruption_budgets": "not listed yet"})
    doc = plan(Change(-1, 0), i).json()
    assert doc["inputs"]["pod_disruption_budgets"] == "not needed"
    assert not any("disruption" in u for u in doc["unknown"])


def test_no_journal_keeps_the_clusters_budgets(tmp_path):
    """Cluster state that changes with any pod's readiness anywhere: a node's journal would
    fill with it. The node's own events beside them are kept."""
    from exporter.clock import FakeClock
    from exporter.events import EventsLost
    from exporter.sinks.journal.reader import JournalReader
    from exporter.sinks.journal.sink import JournalSink
    j = JournalSink(tmp_path / "journal.db", clock=FakeClock(T))
    j.on_event(budget("a"))
    j.on_event(PdbsRelisted(T, frozenset({"default/a"})))
    j.on_event(EventsLost(source="bpf", count=1, time=T))
    assert j.flush(10)
    j.close()
    assert [type(e).__name__ for e in JournalReader(tmp_path / "journal.db").events()] == \
        ["EventsLost"]
