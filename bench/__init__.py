"""Benchmarks against peers: see bench/README.md and `python bench/run.py --help`."""
