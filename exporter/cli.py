"""Command line: click commands and nothing else. Bad flags and config exit 2 with the fix."""
from __future__ import annotations

import logging
import sys

import click

from exporter import __version__
from exporter.config import (
    DEFAULT_BALLOON_SELECTOR, DEFAULT_LISTEN, DEFAULT_PODRESOURCES_SOCKET, ConfigError, Options,
    parse_listen, parse_sources,
)

RUN_EPILOG = """\b
Examples:
  node-resize-exporter run                         # every source that works, :9862
  node-resize-exporter run --source uevent,sysfs   # no BPF
  node-resize-exporter run --kubeconfig ~/.kube/config --node-name worker-3
  node-resize-exporter run --print-bpf             # show the BPF C that would load
"""


def _config_error(e: Exception) -> click.UsageError:
    return click.UsageError(str(e))


class Seconds(click.ParamType):
    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if v <= 0:
            self.fail(f"{value!r} must be more than 0", param, ctx)
        return v


class Bytes(click.ParamType):
    """Bytes as a number or a Kubernetes quantity (100Mi, 1Gi)."""

    name = "bytes"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        from exporter.kube.quantity import parse_quantity
        try:
            v = parse_quantity(value)
        except ValueError:
            self.fail(f"{value!r} is not a byte count (examples: 104857600, 100Mi, 1Gi)",
                      param, ctx)
        if v < 0:
            self.fail(f"{value!r} must not be negative", param, ctx)
        return v


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="node-resize-exporter")
def main() -> None:
    """Makes Kubernetes node resizing observable: kernel CPU and memory hotplug joined with
    what the kubelet and the API server report, as Prometheus metrics, traces and a journal."""


@main.command(epilog=RUN_EPILOG)
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="Address for /metrics and /healthz (HOST:PORT).")
@click.option("--source", "source", default="auto", show_default=True,
              help="Kernel event sources: auto (every one that works) or a comma list of "
                   "bpf, uevent, sysfs. The sysfs reconciler always sets the gauges.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.option("--sysfs-interval", type=Seconds(), default=30.0, show_default=True,
              help="Seconds between sysfs/procfs re-reads (also re-read after every event).")
@click.option("--sysfs-root", default="/sys", show_default=True, help="Where sysfs is mounted.")
@click.option("--procfs-root", default="/proc", show_default=True,
              help="Where procfs is mounted.")
@click.option("--ringbuf-pages", type=click.IntRange(1, 1 << 16), default=64, show_default=True,
              help="BPF ring buffer size in pages (a power of two).")
@click.option("--kubernetes", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="Watch the Node and its pods: auto = when in a cluster or --kubeconfig given.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig file (default: in-cluster service account).")
@click.option("--node-name", envvar="NODE_NAME", default=None,
              help="This node's name [env NODE_NAME; default: the hostname].")
@click.option("--podresources-socket", default=DEFAULT_PODRESOURCES_SOCKET, show_default=True,
              help="The kubelet's podresources gRPC socket.")
@click.option("--podresources-interval", type=Seconds(), default=30.0, show_default=True,
              help="Seconds between podresources GetAllocatableResources polls.")
@click.option("--kubelet-metrics-url", default=None,
              help="Scrape the kubelet's /metrics for resize feature gates (optional).")
@click.option("--balloon-selector", default=DEFAULT_BALLOON_SELECTOR, show_default=True,
              help="Label selector for balloon pods (pods with priorityClassName "
                   "system-balloon count too).")
@click.option("--coalesce-window", type=Seconds(), default=2.0, show_default=True,
              help="Transitions of one resource and direction this close are one episode.")
@click.option("--resync-deadline", type=Seconds(), default=600.0, show_default=True,
              help="Seconds after the kernel is done before an episode is a resync_timeout.")
@click.option("--readmission-settle", type=Seconds(), default=10.0, show_default=True,
              help="Seconds without pod changes after a resync before readmission settles.")
@click.option("--memory-tolerance", type=Bytes(), default="100Mi", show_default=True,
              help="Node memory within this of the kernel's counts as resynced.")
@click.option("--journal", type=click.Path(dir_okay=False), default=None,
              help="Journal file (default /var/lib/node-resize-exporter/journal.db as root).")
@click.option("--no-journal", is_flag=True, help="Keep no journal.")
@click.option("--web.config.file", "web_config_file", type=click.Path(dir_okay=False),
              default=None, help="TLS / basic auth config, in the Prometheus exporters' format.")
@click.option("--print-bpf", is_flag=True, help="Print the BPF program and exit.")
def run(listen, source, log_level, sysfs_interval, sysfs_root, procfs_root, ringbuf_pages,
        kubernetes, kubeconfig, node_name, podresources_socket, podresources_interval,
        kubelet_metrics_url,
        balloon_selector, coalesce_window, resync_deadline, readmission_settle,
        memory_tolerance, journal, no_journal, web_config_file, print_bpf):
    """Run the exporter: watch the kernel (and Kubernetes), serve /metrics."""
    try:
        host, port = parse_listen(listen)
        options = Options(
            listen_host=host, listen_port=port, sources=parse_sources(source),
            sysfs_interval=sysfs_interval, sysfs_root=sysfs_root, procfs_root=procfs_root,
            ringbuf_pages=ringbuf_pages, kubernetes=kubernetes, kubeconfig=kubeconfig,
            node_name=node_name, podresources_socket=podresources_socket,
            podresources_interval=podresources_interval,
            kubelet_metrics_url=kubelet_metrics_url, balloon_selector=balloon_selector,
            coalesce_window=coalesce_window, resync_deadline=resync_deadline,
            readmission_settle=readmission_settle, memory_tolerance_bytes=memory_tolerance,
            journal=journal, journal_enabled=not no_journal, web_config_file=web_config_file,
        ).validate()
    except ConfigError as e:
        raise _config_error(e)
    if print_bpf:
        from pathlib import Path
        from exporter.sources.bpf import printable_program
        from exporter.sources.sysfs import parse_hotplug_states
        states = parse_hotplug_states(
            (Path(sysfs_root) / "devices/system/cpu/hotplug/states").read_text())
        click.echo(printable_program(states, ringbuf_pages))
        return
    _setup_logging(log_level)
    from exporter.runner import serve
    sys.exit(serve(options))


@main.command()
def check() -> None:
    """Say what works on this host and what does not, with the fix for each failure.

    Exit status 0 only when the BPF source can run."""
    from exporter.checks import run_checks
    checks = run_checks()
    for c in checks:
        click.echo(c.line())
    bpf_ok = next(c for c in checks if c.name == "bpf source").status == "ok"
    click.echo("BPF source: " + ("can run" if bpf_ok else "cannot run (the exporter falls "
                                 "back to uevent and sysfs)"))
    sys.exit(0 if bpf_ok else 1)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The HTTP client logs every request and chunk at debug/info: only its problems matter.
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _register_postmortem() -> None:
    try:
        from exporter import cli_postmortem
    except ImportError:
        return
    for command in getattr(cli_postmortem, "COMMANDS", ()):
        main.add_command(command)


_register_postmortem()
