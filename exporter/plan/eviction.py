"""Would the API server refuse the evictions a plan asks for? PodDisruptionBudgets judged as the
eviction subresource judges them (kubernetes pkg/registry/core/pod/storage/eviction.go):

1. A pod that is Succeeded, Failed or Pending, or already being deleted (deletionTimestamp),
   is deleted without asking any budget (canIgnorePDB).
2. The budgets of the pod's namespace whose selector selects its labels; no selector, an empty
   one or an invalid one selects nothing. More than one: the eviction is refused (500, "more
   than one PodDisruptionBudget"). None: the pod is evicted.
3. One budget, the pod not Ready: with unhealthyPodEvictionPolicy AlwaysAllow, or with
   currentHealthy >= desiredHealthy > 0, it is deleted without spending the budget.
4. Otherwise the budget is spent (checkAndDecrement): status.observedGeneration behind
   metadata.generation (its controller has not seen the latest spec): refused (429); a negative
   disruptionsAllowed or more than 2,000 disruptedPods: refused (403); disruptionsAllowed 0:
   refused (429); else allowed, one disruption fewer.

Several pods of one budget in one plan: the first `disruptionsAllowed` (in the order the plan
evicts them) go, the rest are refused; each one spent also leaves one healthy pod fewer for
rule 3. Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.events import Event, PdbsRelisted, PdbStatus, PodStatus, SourceStatus
from exporter.kube.convert import selects

MAX_DISRUPTED_PODS = 2000  # eviction.go MaxDisruptedPodSize
ALWAYS_ALLOW = "AlwaysAllow"


@dataclass(frozen=True)
class Budgets:
    """The cluster's PodDisruptionBudgets as read (by namespace); an immutable snapshot."""

    by_namespace: Mapping[str, tuple[PdbStatus, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, budgets: Iterable[PdbStatus]) -> "Budgets":
        out: dict[str, list[PdbStatus]] = {}
        for b in budgets:
            if not b.deleted:
                out.setdefault(b.namespace, []).append(b)
        return cls({ns: tuple(sorted(bs, key=lambda b: b.name)) for ns, bs in out.items()})

    def __len__(self) -> int:
        return sum(len(b) for b in self.by_namespace.values())


PDB_SOURCE = "kube_pdbs"  # the source that lists and watches them
NOT_LISTED = "not listed yet (the PodDisruptionBudget watch has not answered)"


class BudgetsView:
    """The budgets the PodDisruptionBudget watch delivered, for the plan: read() is a Budgets
    snapshot (made again only after a change), or why they are not read now (not listed yet,
    or the source down: forbidden, unreachable, past the list bound)."""

    def __init__(self) -> None:
        self._budgets: dict[str, PdbStatus] = {}
        self._listed = False
        self._down = ""
        self._snapshot: Budgets | None = None

    def handle(self, event: Event) -> None:
        if isinstance(event, PdbStatus):
            if event.deleted:
                self._budgets.pop(event.key, None)
            else:
                self._budgets[event.key] = event
            self._snapshot = None
        elif isinstance(event, PdbsRelisted):
            self._budgets = {k: b for k, b in self._budgets.items() if k in event.keys}
            self._listed, self._down, self._snapshot = True, "", None
        elif isinstance(event, SourceStatus) and event.source == PDB_SOURCE:
            self._down = "" if event.up else (event.reason or "the watch is down")

    def read(self) -> Budgets | str:
        if self._down:
            return self._down
        if not self._listed:
            return NOT_LISTED
        if self._snapshot is None:
            self._snapshot = Budgets.of(self._budgets.values())
        return self._snapshot


@dataclass(frozen=True)
class Verdict:
    """Whether the eviction of one pod would be refused (None: cannot tell), by which budget,
    and why, in words."""

    blocked: bool | None
    budget: str = ""  # namespace/name of the budget that decides ("": none)
    detail: str = ""


def judge(pods: Iterable[tuple[str, str, PodStatus | None]],
          budgets: Budgets) -> list[Verdict]:
    """A verdict for each pod to evict ((namespace, name, the pod as last seen or None), in the
    order the plan evicts them), the budgets spent by the ones before it."""
    allowed: dict[str, int] = {}  # budget key -> disruptions left in this plan
    healthy: dict[str, int] = {}  # budget key -> healthy pods left in this plan
    out = []
    for namespace, name, pod in pods:
        out.append(_one(namespace, name, pod, budgets, allowed, healthy))
    return out


def _one(namespace: str, name: str, pod: PodStatus | None, budgets: Budgets,
         allowed: dict[str, int], healthy: dict[str, int]) -> Verdict:
    if pod is None:
        return Verdict(None, detail=f"pod {namespace}/{name} was not seen: its labels and phase "
                       "are not known")
    if pod.phase in ("Succeeded", "Failed", "Pending") or pod.deleting:
        state = "being deleted" if pod.deleting else pod.phase
        return Verdict(False, detail=f"{state}: the eviction deletes it without asking a "
                       "PodDisruptionBudget")
    if pod.labels is None:
        return Verdict(None, detail="its labels were not kept (past the bound): whether a "
                       "PodDisruptionBudget selects it is not known")
    labels = dict(pod.labels)
    matched: list[PdbStatus] = []
    for budget in budgets.by_namespace.get(pod.namespace, ()):
        hit = selects(budget, labels)
        if hit is None:
            return Verdict(None, budget.key, f"PodDisruptionBudget {budget.key}: its selector "
                           "was not read (past the bound): whether it selects the pod is not "
                           "known")
        if hit:
            matched.append(budget)
    if len(matched) > 1:
        names = ", ".join(b.name for b in matched[:4])
        return Verdict(True, matched[0].key, f"more than one PodDisruptionBudget selects it "
                       f"({names}): the API server refuses its eviction (500) until one goes")
    if not matched:
        return Verdict(False, detail="no PodDisruptionBudget selects it")
    b = matched[0]
    key = b.key
    left = allowed.get(key, b.disruptions_allowed)
    current = healthy.get(key, b.current_healthy)
    if not pod.ready:
        if b.unhealthy_pod_eviction_policy == ALWAYS_ALLOW:
            return Verdict(False, key, f"not Ready, and {key}'s unhealthyPodEvictionPolicy is "
                           "AlwaysAllow: deleted without spending the budget")
        if b.desired_healthy > 0 and current >= b.desired_healthy:
            return Verdict(False, key, f"not Ready, and {key} has {current} healthy pods of "
                           f"the {b.desired_healthy} it needs: deleted without spending the "
                           "budget")
    if b.observed_generation < b.generation:
        return Verdict(True, key, f"{key}'s status is behind its spec (observedGeneration "
                       f"{b.observed_generation} < generation {b.generation}): the API server "
                       "refuses evictions (429) until its controller catches up")
    if b.disruptions_allowed < 0:
        return Verdict(True, key, f"{key} allows a negative number of disruptions "
                       f"({b.disruptions_allowed}): refused (403)")
    if b.disrupted_pods > MAX_DISRUPTED_PODS:
        return Verdict(True, key, f"{key} lists {b.disrupted_pods} disrupted pods, more than "
                       f"{MAX_DISRUPTED_PODS}: refused (403) until its controller clears them")
    if left <= 0:
        spent = b.disruptions_allowed - left
        return Verdict(True, key, f"{key} allows no disruption" + (
            f" left after the {spent} evicted before it in this plan" if spent else
            f" (it needs {b.desired_healthy} healthy pods and has {b.current_healthy})")
            + ": refused (429)")
    allowed[key] = left - 1
    if pod.ready:
        healthy[key] = current - 1
    return Verdict(False, key, f"{key} allows it ({left} of {b.disruptions_allowed} "
                   "disruptions left)")
