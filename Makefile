# The two commands the README promises. Each installs what is missing first (scripts/setup.sh).
PY := .venv/bin/python
ARGS ?=

.PHONY: run test lab check bench image
run:
	@scripts/setup.sh run
	@exec .venv/bin/node-resize-exporter run $(ARGS)

test:
	@scripts/setup.sh test
	@$(PY) -m pytest $(ARGS)

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
