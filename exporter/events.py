"""The typed events every source yields and the correlator consumes.

One direction of flow: sources -> these events -> correlator -> sinks. Every timestamp here is
wall-clock seconds (float, time.time() basis) derived from CLOCK_MONOTONIC through
exporter.clock.Clock, so kernel time and user-space time share one axis and never jump.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping


class Resource(str, enum.Enum):
    CPU = "cpu"
    MEMORY = "memory"
    HUGEPAGES_2MI = "hugepages-2Mi"
    HUGEPAGES_1GI = "hugepages-1Gi"
    SWAP = "swap"

    @property
    def unit(self) -> str:
        """The kube-state-metrics unit label: CPUs are cores, everything else bytes."""
        return "core" if self is Resource.CPU else "byte"


# Bound once for KernelSnapshot.capacity, which the correlator asks several times per event: on
# Python 3.11 `Resource.CPU` is an attribute lookup on the enum class, four times a global's.
_CPU, _MEMORY, _SWAP = Resource.CPU, Resource.MEMORY, Resource.SWAP


class Direction(str, enum.Enum):
    """A kernel transition's direction (a CPU or memory block going online or offline)."""

    ONLINE = "online"
    OFFLINE = "offline"

    @property
    def change(self) -> "Change":
        return Change.INCREASE if self is Direction.ONLINE else Change.DECREASE


class Change(str, enum.Enum):
    """A capacity change's direction, as the KEP-3953 metrics name it."""

    INCREASE = "increase"
    DECREASE = "decrease"


class Result(str, enum.Enum):
    SUCCESS = "success"
    FAILED = "failed"


# ---------------------------------------------------------------- kernel side


@dataclass(frozen=True)
class Transition:
    """One CPU or memory block finished changing state in the kernel (or the kernel refused).

    `start` is None when the source cannot know when the transition began (uevent, sysfs);
    only BPF records carry a duration.
    """

    source: str  # "bpf", "uevent" or "sysfs"
    resource: Resource  # CPU or MEMORY (per unit); swap and hugepages are capacities only
    # (KernelSnapshot.capacity)
    unit: int  # CPU number or memory block number
    direction: Direction
    result: Result
    end: float
    start: float | None = None
    steps: int | None = None  # cpuhp steps run (BPF)
    failed_state: str | None = None  # cpuhp state name (or number) whose callback failed
    error: str | None = None  # errno name or "ret=-16"
    pfn: int | None = None  # memory: first page frame (BPF)
    nr_pages: int | None = None  # memory: pages in the range (BPF); managed: pages moved
    # What moved the memory when no block did (unit MANAGED_UNIT): "virtio-mem",
    # "virtio-balloon", ... (exporter/sources/kernel/managed_pages.py); None for a block's own.
    mechanism: str | None = None

    @property
    def duration(self) -> float | None:
        return None if self.start is None else max(0.0, self.end - self.start)


# The BPF programs that see the managed page count move (bpf/managed.bpf.c): while both are
# attached, their source's managed-page changes are the ones believed (correlate/ledger.py).
MANAGED_PAGE_PROGRAMS = ("managed_adjust_enter", "managed_online_enter")


@dataclass(frozen=True)
class DeviceChange:
    """A CPU or memory block device appeared or vanished (uevent add/remove: physical hotplug)."""

    source: str
    resource: Resource
    unit: int
    action: str  # "add" or "remove"
    time: float


@dataclass(frozen=True)
class KernelSnapshot:
    """What sysfs and procfs say right now: the truth every gauge is set from."""

    time: float
    cpus_online: frozenset[int]
    cpus_offline: frozenset[int]
    cpus_present: frozenset[int]
    cpus_possible: frozenset[int]
    memory_block_size: int  # bytes; 0 when the kernel has no memory hotplug sysfs
    memory_blocks_online: frozenset[int]
    memory_blocks_offline: frozenset[int]
    mem_total_bytes: int
    swap_total_bytes: int
    hugepages_bytes: Mapping[Resource, int] = field(default_factory=dict)

    def capacity(self, resource: Resource) -> float:
        """The kernel's capacity in the unit the Node object uses (cores or bytes)."""
        if resource is _CPU:
            return float(len(self.cpus_online))
        if resource is _MEMORY:
            return float(self.mem_total_bytes)
        if resource is _SWAP:
            return float(self.swap_total_bytes)
        return float(self.hugepages_bytes.get(resource, 0))

    @property
    def memory_blocks_bytes(self) -> int:
        return len(self.memory_blocks_online) * self.memory_block_size


@dataclass(frozen=True)
class SourceStatus:
    """A source started, stopped or failed; `reason` says why, for logs and `check`; `cause`
    what kind of failure it is, typed, for what acts on it (never read back from `reason`)."""

    source: str
    up: bool
    time: float
    reason: str = ""
    cause: str = ""  # a DownCause value when the source knows it ("": not known)


class DownCause(str, enum.Enum):
    """Why a source is down, where something acts on the kind (the readmission forecast's
    validity): the API server refused the identity, or answered more than the source reads."""

    FORBIDDEN = "forbidden"  # 401/403
    TRUNCATED = "truncated"  # a list past the source's bound


@dataclass(frozen=True)
class ProgramStatus:
    """A BPF program attached or not (and why), as ebpf_exporter reports its programs."""

    program: str
    attached: bool
    time: float
    reason: str = ""


@dataclass(frozen=True)
class EventsLost:
    """A source lost events (ring buffer full, netlink ENOBUFS). `count` is the new loss."""

    source: str
    count: int
    time: float


@dataclass(frozen=True)
class MalformedInput:
    """A source got data it could not parse; counted and skipped, never fatal."""

    source: str
    detail: str
    time: float


# ---------------------------------------------------------------- Kubernetes side


@dataclass(frozen=True)
class NodeStatus:
    """The Node object's status as a watch delivered it (time = delivery time)."""

    time: float
    node: str
    capacity: Mapping[Resource, float]  # cores or bytes
    allocatable: Mapping[Resource, float]
    resource_version: str = ""
    # The Ready condition's lastHeartbeatTime (wall seconds; None: not reported).
    # A dead kubelet sends no Node update at all, so this is what ages while Ready stays True.
    heartbeat: float | None = None
    # The readmission forecast: status.allocatable.pods (else status.capacity.pods), the
    # kubelet's maxPods. None: not reported (an event from an older journal).
    max_pods: int | None = None


@dataclass(frozen=True, slots=True)  # one per pod (or container): no __dict__ each
class ContainerResize:
    """Balloon pod in-place resize state, read from conditions (or deprecated status.resize)."""

    pending_reason: str = ""  # "Deferred", "Infeasible" (PodResizePending) or ""
    in_progress: bool = False  # PodResizeInProgress present
    in_progress_error: bool = False  # PodResizeInProgress reason Error
    desired: Mapping[Resource, float] = field(default_factory=dict)  # spec requests
    applied: Mapping[Resource, float] = field(default_factory=dict)  # status resources
    # The PodResizePending (or InProgress Error) condition's message, bounded; the
    # metrics sink reads a bounded reason from it (cpu_manager_static, capacity, other).
    message: str = ""


@dataclass(frozen=True, slots=True)  # one per pod (or container): no __dict__ each
class ContainerSizing:
    """One container of a pod as the kubelet sized it when it created it: what the running-pods
    judge (exporter/correlate/running_pods_view.py) compares the container's cgroup and processes
    with. Memory in bytes, as allocated when the kubelet reports it, else the spec's."""

    name: str
    container_id: str = ""  # the runtime's id, without its "containerd://" scheme; "": none yet
    memory_request: float = 0.0
    memory_limit: float = 0.0  # 0: no limit
    sidecar: bool = False  # a restartable init container (its OOM score follows the app's)


@dataclass(frozen=True, slots=True)  # one per pod (or container): no __dict__ each
class PodStatus:
    """One pod on this node, as the pod watch delivered it."""

    time: float
    uid: str
    namespace: str
    name: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    reason: str  # status.reason, e.g. OutOfcpu
    ready: bool
    deleted: bool = False
    balloon: bool = False
    requests: Mapping[Resource, float] = field(default_factory=dict)  # sum over containers
    resize: ContainerResize | None = None
    resource_version: str = ""
    # What the pod holds in the scheduler's accounting (KEP-1287: max of spec,
    # allocated and actual requests per container; allocated and actual only once the resize
    # is Infeasible) and in the kubelet's (what it allocated). None: not known (an event from
    # an older journal): `requests` stands in.
    scheduler_requests: Mapping[Resource, float] | None = None
    kubelet_requests: Mapping[Resource, float] | None = None
    # What the kubelet sized each container by (the running-pods judge): status.qosClass
    # (Guaranteed, Burstable, BestEffort; "" not reported), a node-critical pod (its OOM score
    # is fixed), and the app and sidecar containers. Empty from older journals: not judged.
    qos_class: str = ""
    node_critical: bool = False
    containers: tuple[ContainerSizing, ...] = ()
    # When the kubelet wrote this status, as the object says (managedFields `time` of the
    # kubelet's status writes, 1 s resolution; for a Running pod gone NotReady, its Ready
    # condition's lastTransitionTime). `time` is when the watch delivered it: a relist or a
    # watch burst delivers many pods at one time. None: the object does not say.
    status_time: float | None = None
    # The readmission forecast (correlate/readmission_forecast.py): what the kubelet admits the
    # pod against when it restarts (component-helpers PodRequests over what it allocated: init
    # containers, sidecars, pod-level resources and overhead included), whole CPUs the static
    # CPU manager would pin for it (Guaranteed QoS, integer CPU requests; 0 otherwise), and
    # metadata.creationTimestamp (the kubelet readmits pods oldest first). None: not known (an
    # event from an older journal).
    admission_requests: Mapping[Resource, float] | None = None
    exclusive_cpus: int = 0
    created: float | None = None
    # The kind of its controller (ReplicaSet, DaemonSet, StatefulSet, Job, ...), "" when none
    # or not known: the plan names it beside each pod it would hurt.
    owner_kind: str = ""
    # metadata.labels, sorted (key, value) pairs: which PodDisruptionBudget selects the pod.
    # None: not known (past the converter's bound, exporter/kube/convert.py LABELS_MAX, or an
    # event from an older journal): no budget can be judged for it, never "none selects it".
    # metadata.deletionTimestamp set: being deleted (an eviction then deletes it without
    # asking its budget).
    labels: tuple[tuple[str, str], ...] | None = None
    deleting: bool = False


@dataclass(frozen=True)
class PodsRelisted:
    """A relist replaced the pod view: pods not in `uids` are gone (no double counting)."""

    time: float
    uids: frozenset[str]


@dataclass(frozen=True)
class SelectorTerm:
    """One matchExpressions entry of a label selector: `operator` In, NotIn, Exists or
    DoesNotExist (anything else makes the whole selector invalid, as the API server reads it)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


# PdbStatus.selector: "set" (terms to match), "nothing" (no selector, or an empty one: the
# eviction subresource skips it), "invalid" (the API server's LabelSelectorAsSelector refuses
# it: it matches no pod), "unread" (past the converter's bounds: whom it selects is not known).
SELECTOR_STATES = ("set", "nothing", "invalid", "unread")


@dataclass(frozen=True)
class PdbStatus:
    """One PodDisruptionBudget (policy/v1), what the eviction subresource reads of it."""

    time: float
    namespace: str
    name: str
    selector: str = "nothing"  # SELECTOR_STATES
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorTerm, ...] = ()
    disruptions_allowed: int = 0
    current_healthy: int = 0
    desired_healthy: int = 0
    generation: int = 0
    observed_generation: int = 0
    disrupted_pods: int = 0  # entries of status.disruptedPods (past 2,000 evictions are refused)
    unhealthy_pod_eviction_policy: str = ""  # "" (IfHealthyBudget), IfHealthyBudget, AlwaysAllow
    deleted: bool = False
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PdbsRelisted:
    """A relist replaced the budgets: those not in `keys` ("namespace/name") are gone."""

    time: float
    keys: frozenset[str]


@dataclass(frozen=True)
class PodResourcesAllocatable:
    """kubelet podresources GetAllocatableResources. None means "not reported" (empty list)."""

    time: float
    cpu_ids: frozenset[int] | None
    memory_bytes: Mapping[str, int] = field(default_factory=dict)  # memory type -> bytes


@dataclass(frozen=True)
class KubeletFeatures:
    """What the kubelet's own /metrics says: feature gates and native resize metrics found."""

    time: float
    gates: Mapping[str, bool]
    native_metrics: frozenset[str] = frozenset()


# ------------------------------------------------------- the node's state around the kubelet
# (What a kubelet restart would meet: its files, cgroups and process, sysfs's memory policy, and
# KEP-3953's Node condition and Warning Events from the API. Each replaces the one before.)


@dataclass(frozen=True)
class CpuManagerCheckpoint:
    """<kubelet root>/cpu_manager_state as the kubelet wrote it (CPUManagerCheckpointV2).

    `present` False: no file (no kubelet yet, or one that never ran a CPU manager). `error`
    set: the file is there but unreadable, not the kubelet's JSON, or its checksum is wrong;
    the kubelet refuses to start on such a file too ("checkpoint is corrupted").
    """

    time: float
    path: str
    present: bool
    policy: str = ""  # "none" or "static"
    default_cpus: frozenset[int] = frozenset()
    assigned_cpus: frozenset[int] = frozenset()  # union of every container's exclusive cpuset
    error: str = ""

    @property
    def static(self) -> bool:
        """The static CPU manager's checkpoint, read whole: whole CPUs are pinned."""
        return self.present and not self.error and self.policy == "static"


@dataclass(frozen=True)
class MemoryManagerCheckpoint:
    """<kubelet root>/memory_manager_state: its policy and the memory it recorded per
    resource (summed over NUMA nodes), which the Static policy re-checks at start."""

    time: float
    path: str
    present: bool
    policy: str = ""  # "None" or "Static"
    total_bytes: Mapping[str, int] = field(default_factory=dict)  # "memory", "hugepages-2Mi"
    error: str = ""


@dataclass(frozen=True)
class KubepodsCpuset:
    """The CPUs of the kubepods cgroup's cpuset (v1 cpuset.cpus, v2 cpuset.cpus.effective);
    `path` empty when no kubepods cgroup was found."""

    time: float
    path: str
    cpus: frozenset[int] = frozenset()


@dataclass(frozen=True)
class MemoryAutoOnline:
    """/sys/devices/system/memory/auto_online_blocks: what the kernel does with a hot-added
    memory block (offline: it stays offline until something onlines it)."""

    time: float
    policy: str  # offline, online, online_kernel, online_movable


@dataclass(frozen=True)
class KubeletProcess:
    """The kubelet process as seen from this host's PID namespace; `start_time` (wall
    seconds) None when no kubelet process is visible."""

    time: float
    start_time: float | None
    pid: int | None = None


@dataclass(frozen=True)
class NodeCapacityConfigured:
    """KEP-3953's Node condition CapacityConfigured (Accepted, InProgress, Infeasible,
    EmergencyReduced) and spec.configuredCapacity, as a Node watch delivers them."""

    time: float
    node: str
    status: str  # the condition's status: True, False, Unknown; "" when absent
    reason: str = ""
    configured: Mapping[Resource, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeHeartbeat:
    """A sign of life of the kubelet: via "node_status", the Node's Ready
    lastHeartbeatTime moved while its capacity did not (not a NodeStatus: no capacity changed);
    via "lease", its node Lease's renewTime moved."""

    time: float
    node: str
    heartbeat: float  # wall seconds
    via: str = "node_status"  # HEARTBEAT_VIA


HEARTBEAT_VIA = ("node_status", "lease")


@dataclass(frozen=True)
class NodeWarningEvents:
    """KEP-3953: the kubelet's Warning Events of one reason on this Node (EmergencyCapacityReduced:
    it cut the Node's capacity in an emergency), as the API holds them now (Events expire, an
    hour by default): how often they were reported (the Events' counts, summed) and when last."""

    time: float
    node: str
    reason: str
    occurrences: int
    last_seen: float | None  # wall seconds of the newest one; None when there are none


@dataclass(frozen=True)
class ContainerCgroup:
    """One container's cgroup under kubepods as the running-pods source read it. None: not
    read (no such file, no process, unlimited). Bytes and cores."""

    pod_uid: str
    container_id: str
    qos: str  # from the cgroup path: guaranteed, burstable, besteffort
    oom_score_adj: int | None = None  # of its lowest PID (the container's init; children inherit)
    cpus: frozenset[int] | None = None  # v1 cpuset.cpus, v2 cpuset.cpus.effective
    cpu_limit: float | None = None  # cores: CFS quota over period
    memory_limit: int | None = None
    swap_limit: int | None = None  # v2 memory.swap.max; v1 memory.memsw minus memory limit


@dataclass(frozen=True)
class RunningContainers:
    """A scan of the kubepods cgroups: every container found (up to the scan's budget).
    `truncated`: the budget ended the scan early; `skipped`: containers not readable (a
    process that exited, a file that vanished or would not parse)."""

    time: float
    cgroup_version: int  # 1 or 2; 0: no kubepods cgroup found
    containers: tuple[ContainerCgroup, ...] = ()
    truncated: bool = False
    skipped: int = 0


@dataclass(frozen=True)
class VirtioMemDevice:
    """One virtio-mem device as the guest kernel shows it (/proc/iomem, /proc/kpageflags)."""

    name: str  # the virtio device, e.g. virtio4 (its region's name in /proc/iomem)
    region_start: int  # bytes: the device's memory region
    region_bytes: int
    plugged_bytes: int  # added to the guest and not fake-offline (sub-blocks unplugged)
    # What the hypervisor asked for, as the driver logged it (/dev/kmsg); None: not in the log.
    requested_bytes: int | None = None
    # (memory block, plugged bytes in it) for every block added from the region.
    blocks: tuple[tuple[int, int], ...] = ()
    # How far the requested size can be lowered with the guest honouring it: plugged memory
    # in offline and ZONE_MOVABLE blocks (memory_devices.lowerable_bytes).
    lowerable_bytes: int = 0
    # The device's block size, as the driver logged it at probe (None: not in the log).
    block_size: int | None = None


@dataclass(frozen=True)
class ParavirtMemory:
    """The paravirtual memory devices the guest kernel has: virtio-mem devices and the balloon.
    `balloon_bytes` is what balloons hold for the host now (None: no balloon driver bound)."""

    time: float
    virtio_mem: tuple[VirtioMemDevice, ...] = ()
    balloon_bytes: int | None = None
    balloon_deflate_on_oom: bool | None = None  # the virtio-balloon's feature bit


KernelEvent = Transition | DeviceChange | KernelSnapshot
KubeEvent = (NodeStatus | PodStatus | PodsRelisted | PodResourcesAllocatable | KubeletFeatures
             | NodeHeartbeat | PdbStatus | PdbsRelisted)
NodeStateEvent = (CpuManagerCheckpoint | MemoryManagerCheckpoint | KubepodsCpuset
                  | MemoryAutoOnline | KubeletProcess | NodeCapacityConfigured
                  | NodeWarningEvents | RunningContainers | ParavirtMemory)
Event = (KernelEvent | KubeEvent | NodeStateEvent | SourceStatus | ProgramStatus | EventsLost
         | MalformedInput)
