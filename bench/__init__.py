"""Benchmarks against peers (issue 7): see bench/README.md and `python bench/run.py --help`."""
