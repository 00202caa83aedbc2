"""Command line: click commands and nothing else. Bad flags and config exit 2 with the fix."""
from __future__ import annotations

import faulthandler
import sys
from typing import Any

import click

from exporter import __version__
from exporter.cli import plan as plan_command
from exporter.cli import postmortem
from exporter.config import options
from exporter.config.options import LOG_FORMAT, LOG_LEVEL, SYSFS_ROOT, Options
from exporter.sources import registry

# Every source declares its own flags when it registers: load them before the commands below
# are built from the option table.
registry.load()

RUN_EPILOG = """\b
Examples:
  node-resize-exporter run                         # every source that works, :9862
  node-resize-exporter run --source uevent,sysfs   # no BPF
  node-resize-exporter run --kubeconfig ~/.kube/config --node-name worker-3
  node-resize-exporter run --print-bpf             # show the BPF C that would load
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="node-resize-exporter")
def main() -> None:
    """Makes Kubernetes node resizing observable: kernel CPU and memory hotplug joined with
    what the kubelet and the API server report, as Prometheus metrics, traces and a journal."""


@main.command(epilog=RUN_EPILOG)
@options.apply(options.RUN)
@click.option("--print-bpf", is_flag=True, help="Print the BPF program and exit.")
def run(print_bpf: bool, **values: Any) -> None:
    """Run the exporter: watch the kernel (and Kubernetes), serve /metrics."""
    opts = Options.from_cli(values)
    if print_bpf:
        from exporter.sources.kernel.bpf.source import RINGBUF_PAGES, printable_program
        from exporter.sources.kernel.sysfs import read_hotplug_states
        click.echo(printable_program(read_hotplug_states(SYSFS_ROOT.of(opts)),
                                     RINGBUF_PAGES.of(opts)))
        return
    from exporter.config import logs
    logs.setup(LOG_LEVEL.of(opts), LOG_FORMAT.of(opts))
    # A crash in native code (bcc, gRPC, OpenSSL, SQLite) leaves every thread's Python stack
    # on stderr, the container's log, instead of only "exited -11".
    faulthandler.enable()
    from exporter.app import serve
    sys.exit(serve(opts))


@main.command()
@options.apply(options.RUN)
def check(**values: Any) -> None:
    """Say what works on this host and what does not, with the fix for each failure.

    Takes the options `run` takes and checks what `run` would use. Exit status 1 when any
    check FAILs, else 0 (WARN: it runs, with less)."""
    from exporter.cli.check import render, run_checks
    text, status = render(run_checks(Options.from_cli(values)))
    click.echo(text)
    sys.exit(status)


postmortem.register(main)
plan_command.register(main)
