"""Node and Pod JSON (as the API server serialises them) -> the typed events.

Pure functions over plain dicts. Real objects are not always tidy (older servers, fakes,
hand-edited status), so every field is optional here: a missing field gives a default, a
quantity that does not parse is left out and reported in `problems`, never raised.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from exporter.events import (
    ContainerResize,
    ContainerSizing,
    NodeStatus,
    PdbStatus,
    PodStatus,
    Resource,
    SelectorTerm,
)
from exporter.kube.quantity import parse_quantity

# Node/Pod resource names we track; everything else (ephemeral-storage, pods, devices) is ignored.
_RESOURCES = {r.value: r for r in (Resource.CPU, Resource.MEMORY, Resource.HUGEPAGES_2MI,
                                   Resource.HUGEPAGES_1GI)}

# KEP-5620's priority class for balloon pods. The API server reserves "system-" names, so no
# pod can carry it until the KEP makes it built in; today's balloons are found by label or by
# --balloon-priority-class (the cluster-autoscaler's overprovisioning pattern).
BALLOON_PRIORITY_CLASS = "system-balloon"
_MESSAGE_MAX = 256  # a condition message kept for its reason; an API object's, not a log's
# The kubelet fixes the OOM score of pods of this class (pkg/kubelet/types IsNodeCriticalPod)
NODE_CRITICAL_CLASS = "system-node-critical"
_CONTAINERS_MAX = 64  # containers of one pod carried for the running-pods judge
_ID_MAX = 128  # a runtime's container id (64 hex digits for containerd and CRI-O)
# A pod's labels kept for the PodDisruptionBudgets that select it: at most this many, each key
# at most a qualified name (253-character prefix, "/", 63-character name) and each value at most
# 63 characters (what the API server validates). Past a bound the pod's labels are not kept at
# all (None: its budget is not judged, never judged on a part of its labels).
LABELS_MAX = 64
LABEL_KEY_MAX = 317
LABEL_VALUE_MAX = 63
# A PodDisruptionBudget's selector: matchLabels entries, matchExpressions, values of one
# expression; past a bound whom it selects is not known ("unread").
SELECTOR_TERMS_MAX = 64
SELECTOR_VALUES_MAX = 256
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass
class Converted:
    """A conversion result plus the malformed bits that were skipped (for MalformedInput)."""

    event: NodeStatus | PodStatus | PdbStatus | None
    problems: list[str] = field(default_factory=list)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def resources(raw: Any, where: str, problems: list[str]) -> dict[Resource, float]:
    """A ResourceList ({"cpu": "2", "memory": "8Gi", ...}) -> {Resource: cores or bytes}."""
    out: dict[Resource, float] = {}
    for name, text in _dict(raw).items():
        resource = _RESOURCES.get(name)
        if resource is None:
            continue
        try:
            out[resource] = parse_quantity(text)
        except ValueError as e:
            problems.append(f"{where}.{name}: {e}")
    return out


def _add(total: dict[Resource, float], more: Mapping[Resource, float]) -> None:
    for resource, value in more.items():
        total[resource] = total.get(resource, 0.0) + value


# What a converter could still raise on an object no test imagined (a value of an odd type deep
# inside, a recursion limit): the object is reported as a problem and skipped, never raised
# out of the watch (One poison object relisted 89 times in 45 s).
_UNEXPECTED = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError)


def node_status(obj: Any, now: float) -> Converted:
    """A Node object -> NodeStatus (None when it is not a recognisable Node). Never raises."""
    try:
        return _node_status(obj, now)
    except _UNEXPECTED as e:
        return Converted(None, [f"node object not readable: {e!r}"[:300]])


def _node_status(obj: Any, now: float) -> Converted:
    obj = _dict(obj)
    meta = _dict(obj.get("metadata"))
    name = _str(meta.get("name"))
    if not name:
        return Converted(None, ["node without metadata.name"])
    problems: list[str] = []
    status = _dict(obj.get("status"))
    ready = _conditions(status).get("Ready")
    event = NodeStatus(
        time=now,
        node=name,
        capacity=resources(status.get("capacity"), f"node {name} status.capacity", problems),
        allocatable=resources(status.get("allocatable"), f"node {name} status.allocatable",
                              problems),
        resource_version=_str(meta.get("resourceVersion")),
        heartbeat=_timestamp(ready.get("lastHeartbeatTime"), f"node {name} Ready heartbeat",
                             problems) if ready else None,
        max_pods=_max_pods(status, f"node {name}", problems),
    )
    return Converted(event, problems)


def _max_pods(status: Mapping[str, Any], where: str, problems: list[str]) -> int | None:
    """status.allocatable.pods, else status.capacity.pods: the kubelet's maxPods (None when
    the Node reports neither)."""
    for field_ in ("allocatable", "capacity"):
        raw = _dict(status.get(field_)).get("pods")
        if raw is None:
            continue
        try:
            return int(parse_quantity(raw))
        except ValueError as e:
            problems.append(f"{where} status.{field_}.pods: {e}")
    return None


def _timestamp(raw: Any, where: str, problems: list[str]) -> float | None:
    """An RFC 3339 time as the API serialises it (2026-11-23T08:21:44Z) -> epoch seconds."""
    if raw is None:
        return None
    text = _str(raw)
    try:
        when = datetime.fromisoformat(text[:64])
        if when.tzinfo is None:
            raise ValueError("no time zone")
        return when.timestamp()
    except (ValueError, OverflowError):
        problems.append(f"{where}: not an RFC 3339 time: {text[:40]!r}")
        return None


class LabelSelector:
    """An equality-based label selector: "a=b,c==d,e!=f,g,!h" (the kubectl -l grammar).

    Set-based terms ("in", "notin") are rejected with ValueError at construction, so a typo in
    the flag fails at start-up instead of silently matching nothing.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.terms: list[tuple[str, str, str]] = []  # (key, op, value); op in = != exists !exists
        for term in (t.strip() for t in text.split(",")):
            if not term:
                continue
            if " in " in term or " notin " in term or "(" in term:
                raise ValueError(f"set-based selector terms are not supported: {term!r}")
            if "!=" in term:
                key, value = term.split("!=", 1)
                op = "!="
            elif "==" in term:
                key, value = term.split("==", 1)
                op = "="
            elif "=" in term:
                key, value = term.split("=", 1)
                op = "="
            elif term.startswith("!"):
                key, value, op = term[1:], "", "!exists"
            else:
                key, value, op = term, "", "exists"
            key, value = key.strip(), value.strip()
            if not key or any(c.isspace() for c in key):
                raise ValueError(f"bad label selector term: {term!r}")
            self.terms.append((key, op, value))

    def matches(self, labels: Mapping[str, str]) -> bool:
        if not self.terms:
            return False  # an empty selector would make every pod a balloon: treat as "none"
        for key, op, value in self.terms:
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
            if op == "exists" and key not in labels:
                return False
            if op == "!exists" and key in labels:
                return False
        return True


def is_balloon(obj: Mapping[str, Any], selector: LabelSelector | None,
               priority_classes: Iterable[str] = ()) -> bool:
    """Balloon pods: the label selector, OR spec.priorityClassName one of `priority_classes`
    (--balloon-priority-class) or KEP-5620's system-balloon."""
    spec = _dict(obj.get("spec"))
    priority_class = _str(spec.get("priorityClassName"))
    if priority_class and (priority_class == BALLOON_PRIORITY_CLASS
                           or priority_class in priority_classes):
        return True
    labels = {k: v for k, v in _dict(_dict(obj.get("metadata")).get("labels")).items()
              if isinstance(v, str)}
    return selector is not None and selector.matches(labels)


def _conditions(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for cond in _list(status.get("conditions")):
        cond = _dict(cond)
        ctype = _str(cond.get("type"))
        if ctype:
            out[ctype] = cond
    return out


def _resize(status: Mapping[str, Any], conditions: Mapping[str, dict[str, Any]],
            desired: dict[Resource, float], applied: dict[Resource, float]) -> ContainerResize:
    pending = conditions.get("PodResizePending")
    in_progress = conditions.get("PodResizeInProgress")
    pending_reason = _str(pending.get("reason")) if pending and pending.get("status") == "True" \
        else ""
    progressing = in_progress is not None and in_progress.get("status") == "True"
    error = in_progress is not None and progressing and _str(in_progress.get("reason")) == "Error"
    said = pending if pending_reason else in_progress if error else None
    message = _str(said.get("message"))[:_MESSAGE_MAX] if said else ""
    # status.resize: deprecated (before v1.33) but still served by older kubelets.
    legacy = _str(status.get("resize"))
    if not pending_reason and legacy in ("Deferred", "Infeasible"):
        pending_reason = legacy
    if not progressing and legacy == "InProgress":
        progressing = True
    return ContainerResize(pending_reason=pending_reason, in_progress=progressing,
                           in_progress_error=error, desired=desired, applied=applied,
                           message=message)


def pod_status(obj: Any, now: float, selector: LabelSelector | None,
               deleted: bool = False, priority_classes: Iterable[str] = ()) -> Converted:
    """A Pod object -> PodStatus (None when it has no uid: nothing could track it). Never
    raises."""
    try:
        return _pod_status(obj, now, selector, deleted, frozenset(priority_classes))
    except _UNEXPECTED as e:
        return Converted(None, [f"pod object not readable: {e!r}"[:300]])


def _pod_status(obj: Any, now: float, selector: LabelSelector | None,
                deleted: bool, priority_classes: frozenset[str] = frozenset()) -> Converted:
    obj = _dict(obj)
    meta = _dict(obj.get("metadata"))
    uid = _str(meta.get("uid"))
    name = _str(meta.get("name"))
    namespace = _str(meta.get("namespace"))
    if not uid:
        return Converted(None, [f"pod {namespace}/{name} without metadata.uid"])
    problems: list[str] = []
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    where = f"pod {namespace}/{name}"

    # What the pod asks for: the sum over its (app) containers' spec requests, the figure an
    # in-place resize changes. Applied: what the kubelet reports it actuated, when it says.
    desired: dict[Resource, float] = {}
    for container in _list(spec.get("containers")):
        container = _dict(container)
        cname = _str(container.get("name"))
        _add(desired, resources(_dict(container.get("resources")).get("requests"),
                                f"{where} container {cname} requests", problems))
    applied: dict[Resource, float] = {}
    for cstatus in _list(status.get("containerStatuses")):
        cstatus = _dict(cstatus)
        cname = _str(cstatus.get("name"))
        reported = _dict(cstatus.get("resources")).get("requests")
        if reported is None:
            reported = cstatus.get("allocatedResources")
        _add(applied, resources(reported, f"{where} containerStatus {cname} resources",
                                problems))

    conditions = _conditions(status)
    scheduler, kubelet = _views(spec, status, conditions, where, problems)
    admission, exclusive = _admission(spec, status)
    ready_cond = conditions.get("Ready")
    balloon = is_balloon(obj, selector, priority_classes)
    has_resize_signal = ("PodResizePending" in conditions or "PodResizeInProgress" in conditions
                         or bool(_str(status.get("resize"))))
    resize = _resize(status, conditions, desired, applied) if balloon or has_resize_signal \
        else None
    event = PodStatus(
        time=now,
        uid=uid,
        namespace=namespace,
        name=name,
        phase=_str(status.get("phase")),
        reason=_str(status.get("reason")),
        ready=ready_cond is not None and ready_cond.get("status") == "True",
        deleted=deleted,
        balloon=balloon,
        requests=desired,
        resize=resize,
        resource_version=_str(meta.get("resourceVersion")),
        scheduler_requests=scheduler,
        kubelet_requests=kubelet,
        qos_class=_str(status.get("qosClass"))[:16],
        node_critical=_str(spec.get("priorityClassName")) == NODE_CRITICAL_CLASS,
        containers=_sizings(spec, status, where),
        status_time=_status_written(meta, status, ready_cond, where, problems),
        admission_requests=admission,
        exclusive_cpus=exclusive,
        created=_timestamp(meta.get("creationTimestamp"), f"{where} creationTimestamp",
                           problems),
        owner_kind=_owner_kind(meta),
        labels=_labels(meta, where, problems),
        deleting=meta.get("deletionTimestamp") is not None,
    )
    return Converted(event, problems)


def _labels(meta: Mapping[str, Any], where: str,
            problems: list[str]) -> tuple[tuple[str, str], ...] | None:
    """metadata.labels as sorted (key, value) pairs; None (with a problem) past the bounds or
    when one is not a string pair: its PodDisruptionBudget cannot be judged."""
    raw = meta.get("labels")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(f"{where} metadata.labels: not an object: labels not kept")
        return None
    if len(raw) > LABELS_MAX:
        problems.append(f"{where} metadata.labels: {len(raw)} labels, more than {LABELS_MAX}: "
                        "labels not kept (its PodDisruptionBudget is not judged)")
        return None
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key \
                or len(key) > LABEL_KEY_MAX or len(value) > LABEL_VALUE_MAX:
            problems.append(f"{where} metadata.labels: a label {str(key)[:40]!r} that is not a "
                            "valid key and value: labels not kept (its PodDisruptionBudget is "
                            "not judged)")
            return None
        out.append((key, value))
    return tuple(sorted(out))


def pdb_status(obj: Any, now: float, deleted: bool = False) -> Converted:
    """A policy/v1 PodDisruptionBudget -> PdbStatus (None when it has no namespace or name).
    Never raises."""
    try:
        return _pdb_status(obj, now, deleted)
    except _UNEXPECTED as e:
        return Converted(None, [f"poddisruptionbudget object not readable: {e!r}"[:300]])


def _int(raw: Any, where: str, problems: list[str]) -> int:
    """An int32/int64 field; absent: 0; anything else: 0 and a problem (0 is what an unset
    field reads as, and the reading that never lets an eviction through by mistake)."""
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or abs(raw) >= 1 << 63:
        problems.append(f"{where}: not an integer: {str(raw)[:40]!r}")
        return 0
    return raw


def _pdb_status(obj: Any, now: float, deleted: bool) -> Converted:
    obj = _dict(obj)
    meta = _dict(obj.get("metadata"))
    name, namespace = _str(meta.get("name")), _str(meta.get("namespace"))
    if not name or not namespace:
        return Converted(None, [f"poddisruptionbudget {namespace[:63]}/{name[:253]} without "
                                "metadata.namespace or name"])
    where = f"poddisruptionbudget {namespace}/{name}"
    problems: list[str] = []
    spec, status = _dict(obj.get("spec")), _dict(obj.get("status"))
    state, labels, terms = _selector(spec.get("selector"), where, problems)
    policy = _str(spec.get("unhealthyPodEvictionPolicy"))[:32]
    disrupted = status.get("disruptedPods")
    event = PdbStatus(
        time=now, namespace=namespace, name=name, selector=state, match_labels=labels,
        match_expressions=terms,
        disruptions_allowed=_int(status.get("disruptionsAllowed"),
                                 f"{where} status.disruptionsAllowed", problems),
        current_healthy=_int(status.get("currentHealthy"), f"{where} status.currentHealthy",
                             problems),
        desired_healthy=_int(status.get("desiredHealthy"), f"{where} status.desiredHealthy",
                             problems),
        generation=_int(meta.get("generation"), f"{where} metadata.generation", problems),
        observed_generation=_int(status.get("observedGeneration"),
                                 f"{where} status.observedGeneration", problems),
        disrupted_pods=len(disrupted) if isinstance(disrupted, dict) else 0,
        unhealthy_pod_eviction_policy=policy, deleted=deleted,
        resource_version=_str(meta.get("resourceVersion"))[:64])
    return Converted(event, problems)


def _selector(raw: Any, where: str, problems: list[str]
              ) -> tuple[str, tuple[tuple[str, str], ...], tuple[SelectorTerm, ...]]:
    """spec.selector -> (state, matchLabels, matchExpressions), the state as
    metav1.LabelSelectorAsSelector and the eviction subresource read it: no selector or an
    empty one selects nothing; a malformed one (an unknown operator, In/NotIn without values,
    Exists/DoesNotExist with values) is an error there, so it selects nothing; past our bounds,
    or not shaped as JSON a server would send, "unread"."""
    if raw is None:
        return "nothing", (), ()
    if not isinstance(raw, dict):
        problems.append(f"{where} spec.selector: not an object: whom it selects is not known")
        return "unread", (), ()
    match_labels = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or []
    if not isinstance(match_labels, dict) or not isinstance(expressions, list) \
            or len(match_labels) > SELECTOR_TERMS_MAX or len(expressions) > SELECTOR_TERMS_MAX:
        problems.append(f"{where} spec.selector: not readable or more than "
                        f"{SELECTOR_TERMS_MAX} terms: whom it selects is not known")
        return "unread", (), ()
    labels = []
    for key, value in match_labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            problems.append(f"{where} spec.selector.matchLabels: not strings: whom it selects "
                            "is not known")
            return "unread", (), ()
        labels.append((key[:LABEL_KEY_MAX + 1], value[:LABEL_VALUE_MAX + 1]))
    terms = []
    invalid = False
    for item in expressions:
        item = _dict(item)
        values = item.get("values") or []
        if not isinstance(values, list) or len(values) > SELECTOR_VALUES_MAX \
                or not all(isinstance(v, str) for v in values) \
                or not isinstance(item.get("key"), str) \
                or not isinstance(item.get("operator"), str):
            problems.append(f"{where} spec.selector.matchExpressions: not readable or more "
                            f"than {SELECTOR_VALUES_MAX} values: whom it selects is not known")
            return "unread", (), ()
        op = item["operator"]
        if op not in SELECTOR_OPERATORS or (op in ("In", "NotIn")) != bool(values):
            invalid = True
        terms.append(SelectorTerm(item["key"][:LABEL_KEY_MAX + 1], op[:16],
                                  tuple(v[:LABEL_VALUE_MAX + 1] for v in values)))
    if invalid:
        return "invalid", tuple(sorted(labels)), tuple(terms)
    if not labels and not terms:
        return "nothing", (), ()
    return "set", tuple(sorted(labels)), tuple(terms)


def selects(pdb: PdbStatus, labels: Mapping[str, str]) -> bool | None:
    """Whether `pdb` selects a pod with these labels, as the eviction subresource decides
    (k8s.io/apimachinery labels.Selector): matchLabels and every expression must hold; In:
    the label present with one of the values; NotIn: absent or none of them; Exists;
    DoesNotExist. No, empty or invalid selectors select nothing. None: the selector was not
    read."""
    if pdb.selector == "unread":
        return None
    if pdb.selector != "set":
        return False
    for key, value in pdb.match_labels:
        if labels.get(key) != value:
            return False
    for term in pdb.match_expressions:
        present = term.key in labels
        if term.operator == "In" and not (present and labels[term.key] in term.values):
            return False
        if term.operator == "NotIn" and present and labels[term.key] in term.values:
            return False
        if term.operator == "Exists" and not present:
            return False
        if term.operator == "DoesNotExist" and present:
            return False
    return True


def _owner_kind(meta: Mapping[str, Any]) -> str:
    """The kind of the pod's controller (its ownerReference with controller: true), "" when
    none: what an orchestrator weighs before evicting it (a bare pod does not come back)."""
    for ref in _list(meta.get("ownerReferences")):
        ref = _dict(ref)
        if ref.get("controller") is True:
            kind = _str(ref.get("kind"))
            return kind if len(kind) <= 63 and kind.isalnum() else ""
    return ""


def _container_id(raw: Any) -> str:
    """"containerd://0123abcd" -> "0123abcd" (the name of its cgroup directory); "" for
    anything that is not a bounded id."""
    text = _str(raw).rpartition("://")[2]
    return text if 0 < len(text) <= _ID_MAX and text.isalnum() else ""


def _sizings(spec: Mapping[str, Any], status: Mapping[str, Any],
             where: str) -> tuple[ContainerSizing, ...]:
    """Each app container and sidecar (a restartable init container) with its memory request
    and limit as the kubelet sized it: allocated (or reported running) when the status says,
    else the spec's. Problems are not reported twice: the sums above already did."""
    quiet: list[str] = []
    statuses = {_str(_dict(c).get("name")): _dict(c)
                for key in ("containerStatuses", "initContainerStatuses")
                for c in _list(status.get(key))}
    found = [(_dict(c), False) for c in _list(spec.get("containers"))]
    found += [(_dict(c), True) for c in _list(spec.get("initContainers"))
              if _str(_dict(c).get("restartPolicy")) == "Always"]
    out: list[ContainerSizing] = []
    for container, sidecar in found[:_CONTAINERS_MAX]:
        name = _str(container.get("name"))
        cs = statuses.get(name, {})
        spec_res = _dict(container.get("resources"))
        running = _dict(cs.get("resources"))
        requests = resources(spec_res.get("requests"), where, quiet)
        if isinstance(cs.get("allocatedResources"), dict):
            requests = resources(cs.get("allocatedResources"), where, quiet)
        elif "requests" in running:
            requests = resources(running.get("requests"), where, quiet)
        limits = resources(running.get("limits") if "limits" in running
                           else spec_res.get("limits"), where, quiet)
        memory_request = requests.get(Resource.MEMORY, 0.0)
        if Resource.MEMORY not in requests and Resource.MEMORY in limits:
            memory_request = limits[Resource.MEMORY]  # the API defaults a request to the limit
        out.append(ContainerSizing(
            name=name[:64], container_id=_container_id(cs.get("containerID")),
            memory_request=memory_request, memory_limit=limits.get(Resource.MEMORY, 0.0),
            sidecar=sidecar))
    return tuple(out)


MANAGED_FIELDS_READ = 32  # entries looked at: one per manager and operation, a handful in life


def _status_written(meta: Mapping[str, Any], status: Mapping[str, Any],
                    ready_cond: Mapping[str, Any] | None, where: str,
                    problems: list[str]) -> float | None:
    """When the kubelet last wrote this pod's status, as the object says.

    The API server stamps each managedFields entry with the time of the manager's last write
    (1 s resolution): the kubelet's entry for the status subresource is the time of its last
    status write, such as the one that rejected the pod OutOfcpu. A Running pod gone NotReady
    says more exactly when in its Ready condition's lastTransitionTime. Not for a Failed pod:
    a restarted kubelet rewrites the conditions before it rejects the pod, so theirs is the
    earlier, unrelated time (tests/fixtures/kubelet-v1.36/pods-watch-readmission-outofcpu).
    """
    written = None
    for entry in _list(meta.get("managedFields"))[:MANAGED_FIELDS_READ]:
        entry = _dict(entry)
        if _str(entry.get("manager")) == "kubelet" and \
                _str(entry.get("subresource")) == "status":
            written = _timestamp(entry.get("time"), f"{where} managedFields kubelet time",
                                 problems)
            break
    if ready_cond is not None and _str(status.get("phase")) == "Running" and \
            _str(ready_cond.get("status")) == "False":
        changed = _timestamp(ready_cond.get("lastTransitionTime"),
                             f"{where} Ready lastTransitionTime", problems)
        if changed is not None and (written is None or changed <= written):
            return changed
    return written


def _max(*lists: Mapping[Resource, float]) -> dict[Resource, float]:
    out: dict[Resource, float] = {}
    for one in lists:
        for resource, value in one.items():
            out[resource] = max(out.get(resource, value), value)
    return out


def _views(spec: Mapping[str, Any], status: Mapping[str, Any],
           conditions: Mapping[str, dict[str, Any]], where: str,
           problems: list[str]) -> tuple[dict[Resource, float],
                                                     dict[Resource, float]]:
    """What the pod's app containers hold, summed, as the scheduler and the kubelet count it.

    Scheduler (k8s.io/component-helpers/resource PodRequests, KEP-1287): a container whose
    status reports resources counts max(spec, status.resources, allocatedResources), or, when
    the pod's resize is Infeasible, max(status.resources, allocatedResources): a resize that
    cannot happen frees nothing and takes nothing. Otherwise its spec requests.
    Kubelet: what it allocated (allocatedResources), else what it reports running with, else
    the spec (not admitted yet: the spec is what admission will allocate).
    Problems are not reported twice: the desired/applied sums above already did.
    """
    infeasible = _str(conditions.get("PodResizePending", {}).get("reason")) == "Infeasible"
    statuses = {_str(_dict(c).get("name")): _dict(c)
                for c in _list(status.get("containerStatuses"))}
    scheduler: dict[Resource, float] = {}
    kubelet: dict[Resource, float] = {}
    quiet: list[str] = []
    for container in _list(spec.get("containers")):
        container = _dict(container)
        wanted = resources(_dict(container.get("resources")).get("requests"), where, quiet)
        cs = statuses.get(_str(container.get("name")))
        raw_actual = _dict(cs.get("resources")) if cs and "resources" in cs else None
        actual = resources(raw_actual.get("requests"), where, quiet) if raw_actual is not None \
            else None
        allocated = resources(cs.get("allocatedResources"), where, quiet) \
            if cs and isinstance(cs.get("allocatedResources"), dict) else None
        if actual is None:
            _add(scheduler, wanted)
        elif infeasible:
            _add(scheduler, _max(actual, allocated or {}))
        else:
            _add(scheduler, _max(wanted, actual, allocated or {}))
        _add(kubelet, allocated if allocated is not None
             else actual if actual is not None else wanted)
    return scheduler, kubelet


# Pod-level resources (spec.resources, KEP-2837) replace the containers' sum for these only.
_POD_LEVEL = (Resource.CPU, Resource.MEMORY)


def _admission(spec: Mapping[str, Any], status: Mapping[str, Any]
               ) -> tuple[dict[Resource, float], int]:
    """What the kubelet admits the pod against when it (re)starts, and the whole CPUs its
    static CPU manager would pin for it.

    Requests: k8s.io/component-helpers/resource PodRequests (v1.36) over what the kubelet
    allocated (its allocation manager readmits a pod with its allocated resources, not a
    pending resize's spec: a container's allocatedResources where reported, else its spec):
    the app containers' sum plus every restartable init container (sidecar); the largest of
    that and each regular init container plus the sidecars started before it; pod-level
    requests (spec.resources) replace cpu and memory; spec.overhead added.
    Exclusive CPUs: only for status.qosClass Guaranteed, per container an integer CPU request
    (pkg/kubelet/cm/cpumanager policy_static.go guaranteedCPUs), combined the same way (init
    containers' CPUs are reused by the containers after them).
    Quantities that do not parse were reported by the caller's own pass: skipped quietly."""
    quiet: list[str] = []
    guaranteed = _str(status.get("qosClass")) == "Guaranteed"
    allocated: dict[str, dict[Resource, float]] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in _list(status.get(key)):
            cs = _dict(cs)
            if isinstance(cs.get("allocatedResources"), dict):
                allocated[_str(cs.get("name"))] = resources(cs.get("allocatedResources"), "",
                                                            quiet)

    def held(container: dict[str, Any]) -> tuple[dict[Resource, float], int]:
        name = _str(container.get("name"))
        req = allocated.get(name)
        if req is None:
            req = resources(_dict(container.get("resources")).get("requests"), "", quiet)
        cpu = req.get(Resource.CPU, 0.0)
        whole = int(cpu) if guaranteed and cpu >= 1 and cpu == int(cpu) else 0
        return req, whole

    total: dict[Resource, float] = {}
    total_x = 0
    for container in _list(spec.get("containers")):
        req, whole = held(_dict(container))
        _add(total, req)
        total_x += whole
    sidecars: dict[Resource, float] = {}
    sidecars_x = 0
    init: dict[Resource, float] = {}
    init_x = 0
    for container in _list(spec.get("initContainers")):
        container = _dict(container)
        req, whole = held(container)
        if _str(container.get("restartPolicy")) == "Always":
            _add(total, req)
            _add(sidecars, req)
            total_x += whole
            sidecars_x += whole
            step, step_x = dict(sidecars), sidecars_x
        else:
            step, step_x = dict(req), whole + sidecars_x
            _add(step, sidecars)
        init = _max(init, step)
        init_x = max(init_x, step_x)
    total = _max(total, init)
    pod_level = resources(_dict(spec.get("resources")).get("requests"), "", quiet)
    for resource in _POD_LEVEL:
        if resource in pod_level:
            total[resource] = pod_level[resource]
    _add(total, resources(spec.get("overhead"), "", quiet))
    return total, max(total_x, init_x)
