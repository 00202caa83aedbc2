"""One-shot reads, in one room: what `check` and `plan` read once, where the running exporter
has its sources instead. The kernel now, the kubelet's checkpoints, one scan of the running
containers, one bounded list of this node's Node and pods; each made at most once per `Reads`
(one `check` lists the pods once, bounded, for every line that needs them) and handed to the
judges (the sinks' check lines, the planner) as events, the way the sources would.

The sinks import no source and no API client: what they judge comes from here.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.checks import Check, quoted
from exporter.config.decide import Decisions, decide
from exporter.config.options import KUBECONFIG, PROCFS_ROOT, SYSFS_ROOT, Options
from exporter.events import (
    CpuManagerCheckpoint,
    KernelSnapshot,
    MemoryManagerCheckpoint,
    NodeStatus,
    PdbStatus,
    PodStatus,
    RunningContainers,
)
from exporter.kube.bounds import LIST_MAX_OBJECTS
from exporter.kube.client import KubeUnavailable, disruption_budgets, load_config, node_and_pods
from exporter.kube.convert import node_status, pdb_status, pod_status
from exporter.sources.kernel.memory_blocks import HotplugHardware, PageFlagsReader, read_hardware
from exporter.sources.kernel.memory_devices import MemoryDevices, read_devices, with_logged
from exporter.sources.kernel.sysfs import SysfsReader
from exporter.sources.kubelet.kubelet_checkpoint import (
    KUBELET_ROOT_DIR,
    ROOT_EMPTY,
    not_mounted,
    read_cpu_manager_state,
    read_memory_manager_state,
    read_reserved_cpus,
)
from exporter.sources.kubelet.kubepods_cgroup import CGROUP_ROOT
from exporter.sources.kubelet.running_pods import (
    NO_KUBEPODS,
    RUNNING_PODS_MAX_CONTAINERS,
    find_layout,
    scan,
)

__all__ = ["HotplugHardware", "PageFlagsReader", "read_hardware", "read_kernel", "Reads",
           "NodeAndPods",
           "MemoryDevices", "read_devices", "with_logged",
           "Unlisted", "KUBELET_ROOT_DIR", "CGROUP_ROOT", "LIST_MAX_OBJECTS", "ROOT_EMPTY",
           "NO_KUBEPODS", "find_layout", "not_mounted", "read_reserved_cpus"]

T = TypeVar("T")


def read_kernel(sysfs: str, procfs: str, now: float) -> KernelSnapshot:
    """The kernel's CPUs, memory blocks and MemTotal now, as the sysfs source reads them."""
    return SysfsReader(sysfs, procfs).read(now)


@dataclass(frozen=True)
class Unlisted:
    """Why this node's Node and pods were not listed. `cannot`: the pods are there but were
    not all seen (a judgement of some would not be one of all); otherwise there was nothing
    to list (no API configured, no such Node)."""

    cannot: bool
    message: str
    fix: str


@dataclass(frozen=True)
class NodeAndPods:
    node: NodeStatus
    pods: list[PodStatus] = field(default_factory=list)  # as the pod watch converts them


@dataclass(frozen=True)
class Scanned:
    found: RunningContainers
    problems: list[str]  # what was unreadable


class Reads:
    """The one-shot reads of one `check` or `plan` run, each made once when first asked."""

    def __init__(self, options: Options, decisions: Decisions | None = None) -> None:
        self.options = options
        self.decisions = decisions or decide(options)
        self._made: dict[str, tuple[bool, Any]] = {}  # what -> (raised, value or exception)

    @classmethod
    def of(cls, given: "Options | Reads") -> "Reads":
        return given if isinstance(given, Reads) else cls(given)

    def _once(self, what: str, read: Callable[[], T]) -> T:
        if what not in self._made:
            try:
                self._made[what] = (False, read())
            except Exception as e:  # noqa: BLE001 - raised again to every caller
                self._made[what] = (True, e)
        raised, value = self._made[what]
        if raised:
            raise value
        return value  # type: ignore[no-any-return]

    # ------------------------------------------------------------ the kernel

    def kernel(self) -> KernelSnapshot:
        """sysfs and procfs now. Raises OSError or ValueError."""
        return self._once("kernel", lambda: SysfsReader(
            SYSFS_ROOT.of(self.options), PROCFS_ROOT.of(self.options)).read(0.0))

    def kernel_or_check(self, name: str) -> KernelSnapshot | Check:
        """The kernel now, or the WARN line `name` that says why it cannot be read."""
        try:
            return self.kernel()
        except (OSError, ValueError) as e:
            return Check(name, "warn", f"not checked: cannot read sysfs/procfs ({e})",
                         "mount the host's /sys and /proc")

    def hardware(self) -> HotplugHardware:
        return self._once("hardware", lambda: read_hardware(SYSFS_ROOT.of(self.options)))

    # ------------------------------------------------------------ the kubelet's files

    @property
    def kubelet_root(self) -> str:
        return KUBELET_ROOT_DIR.of(self.options)

    def checkpoints(self) -> tuple[CpuManagerCheckpoint, MemoryManagerCheckpoint]:
        """The CPU and memory managers' checkpoints under --kubelet-root-dir. Raises OSError
        (unreadable) or ValueError (not a regular file)."""
        root = self.kubelet_root
        return self._once("checkpoints", lambda: (read_cpu_manager_state(root, 0.0),
                                                  read_memory_manager_state(root, 0.0)))

    def running(self) -> Scanned | None:
        """One bounded scan of the running containers' cgroups; None when not asked for
        (--cgroup-root empty or --running-pods.max-containers 0)."""
        root, most = CGROUP_ROOT.of(self.options), RUNNING_PODS_MAX_CONTAINERS.of(self.options)
        if not root or most <= 0:
            return None

        def read() -> Scanned:
            problems: list[str] = []
            found = scan(root, PROCFS_ROOT.of(self.options), 0.0, max_containers=most,
                         problems=problems)
            return Scanned(found, problems)
        return self._once("running", read)

    # ------------------------------------------------------------ the API server

    def node_and_pods(self, node: str | None = None) -> NodeAndPods | Unlisted:
        """One list of this node's Node and of the pods bound to it, at most LIST_MAX_OBJECTS
        pods (the watch sources' bound): never a list of some of them (Unlisted says why)."""
        name = node or self.decisions.node
        return self._once(f"node_and_pods {name}", lambda: _node_and_pods(self.options, name))


    def budgets(self) -> list[PdbStatus] | str:
        """One list of the cluster's PodDisruptionBudgets, at most LIST_MAX_OBJECTS (the watch
        source's bound), or why they were not read (never some of them)."""
        return self._once("budgets", lambda: _budgets(self.options))


def _budgets(options: Options) -> list[PdbStatus] | str:
    try:
        config = load_config(KUBECONFIG.of(options))
    except KubeUnavailable as e:
        return f"not read: {e.reason}"
    try:
        raw, truncated = disruption_budgets(config, LIST_MAX_OBJECTS)
    except Exception as e:  # noqa: BLE001 - 403, unreachable...: say so, never a traceback
        return (f"not read: listing them failed ({quoted(e) or type(e).__name__}); grant "
                "list on poddisruptionbudgets (policy) to the exporter's service account")
    if truncated:
        return (f"not read: more than {LIST_MAX_OBJECTS} in the cluster (the list bound); a "
                "judgement on some would not be one of all")
    out = []
    for obj in raw:
        event = pdb_status(obj, 0.0).event
        if not isinstance(event, PdbStatus):
            # A budget we cannot name could be the one that selects a pod: not read.
            return "not read: a PodDisruptionBudget in the list is not readable"
        out.append(event)
    return out


def _node_and_pods(options: Options, node: str) -> NodeAndPods | Unlisted:
    try:
        config = load_config(KUBECONFIG.of(options))
    except KubeUnavailable as e:
        return Unlisted(False, e.reason, e.fix)
    try:
        found, raw, truncated = node_and_pods(config, node, LIST_MAX_OBJECTS)
    except Exception as e:  # noqa: BLE001 - unreachable, 403...: say so, never a traceback
        return Unlisted(True, f"listing node {node} and its pods failed: "
                        f"{quoted(e) or type(e).__name__}",
                        "check the API server address, the credentials and list on nodes and "
                        "pods")
    if truncated:
        return Unlisted(True, f"more than {LIST_MAX_OBJECTS} pods are bound to node {node} "
                        "(the list bound); a judgement of some would not be one of all",
                        "check --node-name and the pods the API server binds to it")
    if found is None:
        return Unlisted(False, f"no Node named {node}",
                        "pass --node-name (or $NODE_NAME) as the kubelet registered it")
    converted = node_status(found, 0.0).event
    if not isinstance(converted, NodeStatus):
        return Unlisted(False, f"the Node {node} is not readable", "")
    pods = [e for e in (pod_status(obj, 0.0, None).event for obj in raw)
            if isinstance(e, PodStatus)]
    return NodeAndPods(converted, pods)
