"""Only what pyproject.toml cannot say: the package list is found, plus exporter.bpf, which
package-dir maps to the top-level bpf/ (the BPF C ships inside the wheel; exporter/bpf_files.py
finds it installed or in a checkout)."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["exporter*"]) + ["exporter.bpf"])
