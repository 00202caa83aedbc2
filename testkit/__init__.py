"""Helpers shared by the tests, the QEMU lab and the benchmarks: driving the real kernel's
hotplug under the machine-wide lock (kernel.py) and running and scraping a real exporter
process (exporter_proc.py). Not shipped in the wheel; importable from a checkout."""
