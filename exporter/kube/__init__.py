"""Kubernetes side of the exporter: API client, quantities, object conversion, source factory.

The sources themselves live in exporter/sources/ (kube_node, kube_pods, podresources,
kubelet_metrics); `build_sources` is the one place that decides which of them run.
"""
from __future__ import annotations

import os
import socket

from exporter.clock import Clock
from exporter.kube.convert import LabelSelector
from exporter.sources.base import Source, SourceUnavailable

DEFAULT_BALLOON_SELECTOR = "node-resize-exporter.io/balloon=true"
DEFAULT_PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def resolve_node_name(flag: str | None = None) -> str:
    """--node-name, else $NODE_NAME (the DaemonSet sets it from spec.nodeName), else hostname.

    The hostname fallback matches the kubelet's default --hostname-override-less node name,
    lower-cased as the kubelet does.
    """
    if flag:
        return flag
    env = os.environ.get("NODE_NAME", "").strip()
    if env:
        return env
    return socket.gethostname().lower()


def build_sources(clock: Clock, *, node_name: str, kubeconfig: str | None = None,
                  podresources_socket: str | None = DEFAULT_PODRESOURCES_SOCKET,
                  kubelet_metrics_url: str | None = None,
                  balloon_selector: str = DEFAULT_BALLOON_SELECTOR,
                  enable_api: bool = True,
                  podresources_interval: float = 30.0,
                  kubelet_metrics_interval: float = 60.0) -> list[Source]:
    """The Kubernetes sources for this node, not yet opened or started.

    Raises SourceUnavailable for a bad balloon selector (a flag error: fail at start-up).
    `podresources_socket=None` disables that source; `kubelet_metrics_url=None` (the default)
    disables the kubelet scrape; `enable_api=False` skips the Node and Pod watches.
    """
    # Imports here keep `import exporter.kube` light for code that only wants quantities.
    from exporter.sources.kube_node import KubeNodeSource
    from exporter.sources.kube_pods import KubePodsSource
    from exporter.sources.kubelet_metrics import KubeletMetricsSource
    from exporter.sources.podresources import PodResourcesSource

    try:
        selector = LabelSelector(balloon_selector)
    except ValueError as e:
        raise SourceUnavailable(f"bad balloon selector {balloon_selector!r}: {e}",
                                "use key=value terms joined by commas") from e
    sources: list[Source] = []
    if enable_api:
        sources.append(KubeNodeSource(clock, node_name=node_name, kubeconfig=kubeconfig))
        sources.append(KubePodsSource(clock, node_name=node_name, kubeconfig=kubeconfig,
                                      balloon_selector=selector))
    if podresources_socket:
        sources.append(PodResourcesSource(clock, socket_path=podresources_socket,
                                          interval=podresources_interval))
    if kubelet_metrics_url:
        sources.append(KubeletMetricsSource(clock, url=kubelet_metrics_url,
                                            interval=kubelet_metrics_interval))
    return sources
