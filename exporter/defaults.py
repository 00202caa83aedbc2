"""Every default value of the exporter, in one place.

Plain constants and nothing else: the option definitions (exporter/options.py), the correlator's
config and the sources read them from here, so a default is never written twice.
"""
from __future__ import annotations

# HTTP endpoint (node_exporter's flag names: --web.listen-address, --web.telemetry-path)
PORT = 9862
LISTEN_ADDRESS = f"0.0.0.0:{PORT}"
TELEMETRY_PATH = "/metrics"

# Logging
LOG_LEVEL = "info"
LOG_FORMAT = "logfmt"

# Kernel sources
SOURCES = "auto"
SYSFS_INTERVAL = 30.0  # s between sysfs/procfs re-reads (also re-read after every event)
SYSFS_ROOT = "/sys"
PROCFS_ROOT = "/proc"
RINGBUF_PAGES = 64

# Kubernetes
KUBERNETES = "auto"
PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
PODRESOURCES_INTERVAL = 30.0
KUBELET_METRICS_INTERVAL = 60.0
BALLOON_SELECTOR = "node-resize-exporter.io/balloon=true"
BALLOON_PRIORITY_CLASSES: tuple[str, ...] = ()  # --balloon-priority-class, repeatable
NODE_LEASE = True  # watch the node's Lease (the kubelet's 10 s heartbeat)

# The kubelet's local state (issue 13)
KUBELET_ROOT_DIR = "/var/lib/kubelet"  # the kubelet's --root-dir default
CGROUP_ROOT = "/sys/fs/cgroup"
# s between re-reads when nothing pokes: checkpoints are also re-read on inotify and every
# kernel event, so this only bounds what a missed notification can cost
KUBELET_STATE_INTERVAL = 30.0
# s between checks that the kubelet process is the same one (one stat of /proc/PID): a restarted
# kubelet takes seconds to post its Node, so its new start time is seen before the resync
KUBELET_PROCESS_INTERVAL = 1.0

# Episodes (the correlator)
COALESCE_WINDOW = 2.0  # s: transitions of one resource and direction this close are one episode
RESYNC_DEADLINE = 600.0  # s after the kernel is done -> resync_timeout
READMISSION_SETTLE = 10.0  # s without a pod change after a resync -> settled
MEMORY_TOLERANCE = "100Mi"  # KEP-3953's jitter bound for the kubelet's memory
MEMORY_TOLERANCE_BYTES = 100 * 2**20

# Longest duration a seconds flag accepts: a year. Beyond it a typo (or inf) would make a
# thread sleep forever and freeze what it updates.
MAX_SECONDS = 365 * 86400.0
