# The two commands the README promises. Each installs what is missing first (scripts/setup.sh).
PY := .venv/bin/python
ARGS ?=

.PHONY: run test lint lab check bench image
run:
	@scripts/setup.sh run
	@exec .venv/bin/node-resize-exporter run $(ARGS)

test:
	@scripts/setup.sh test
	@$(MAKE) --no-print-directory lint
	@$(PY) -m pytest $(ARGS)

# ruff over the whole tree (ruff.toml); mypy --strict on the pure core (the correlator and the
# event types), the part every other module trusts.
lint:
	@.venv/bin/ruff check --quiet .
	@.venv/bin/mypy --strict --no-error-summary exporter/correlate exporter/events.py

check:
	@scripts/setup.sh run
	@.venv/bin/node-resize-exporter check

lab:
	@scripts/setup.sh lab
	@$(PY) -m lab $(ARGS)

bench:
	@scripts/setup.sh bench
	@$(PY) bench/run.py all --out bench/results/latest.json $(ARGS)

# dist/node-resize-exporter-<version>.oci.tar, without a container engine (deploy/image/build.sh).
image:
	@scripts/setup.sh image
	@deploy/image/build.sh
