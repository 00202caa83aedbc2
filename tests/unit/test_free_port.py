"""The tests' port picker stays out of the kernel's ephemeral range and in its worker's slice:
three workers starting servers side by side once lost a race for a port an outgoing connection
took between bind(0) and the exporter's own bind ("address already in use" in CI)."""
from __future__ import annotations

import socket

from testkit import exporter_proc
from testkit.exporter_proc import free_port


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_ports_are_below_the_ephemeral_range_and_in_this_workers_slice(monkeypatch):
    for worker in ("gw0", "gw1", "gw2", ""):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(exporter_proc, "_next_port", [])
        ports = [free_port() for _ in range(20)]
        assert all(p < _ephemeral_low() for p in ports), ports
        assert all(p in exporter_proc._slice() for p in ports), (worker, ports)
        assert len(set(ports)) == 20  # never the same port twice in a row


def test_workers_slices_do_not_overlap(monkeypatch):
    slices = []
    for worker in ("gw0", "gw1", "gw2", "gw3", ""):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(exporter_proc._slice()))
    for i, a in enumerate(slices):
        for b in slices[i + 1:]:
            assert not a & b


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    monkeypatch.setattr(exporter_proc, "_next_port", [])
    port = free_port()
    exporter_proc._next_port[0] = port  # the next pick would be this port again
    with socket.create_server(("127.0.0.1", port)):
        assert free_port() != port
