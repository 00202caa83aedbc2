# The two commands the README promises. Each installs what is missing first (scripts/setup.sh).
PY := .venv/bin/python
ARGS ?=
# The root pass's pytest-xdist workers: the lab, the kernel files and the rest side by side
# (tests/conftest.py: chain_of). TEST_JOBS=0 runs it in one process, in file order.
TEST_JOBS ?= 3

.PHONY: run test lint unit-unprivileged lab check bench image
run:
	@scripts/setup.sh run
	@exec .venv/bin/node-resize-exporter run $(ARGS)

test:
	@scripts/setup.sh test
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory unit-unprivileged
	@$(PY) -m pytest -n $(TEST_JOBS) --durations=15 $(ARGS)

# ruff over the whole tree (ruff.toml, imports sorted); mypy --strict over all of exporter/
# (pyproject.toml's [tool.mypy] sets strict and names the code that is not ours).
lint:
	@.venv/bin/ruff check --quiet .
	@.venv/bin/mypy --no-error-summary exporter

# tests/unit needs neither root nor a server: run as root (CI), it is first run as nobody to
# prove it. Skipped when not root (nobody to switch to). The fuzz tests' 10,000 examples each
# (CI=true) run in the root pass that follows; here 300 prove they need no root (3 min saved).
unit-unprivileged:
	@if [ "$$(id -u)" = 0 ]; then \
	  setpriv --reuid=nobody --regid=nogroup --clear-groups \
	    env HOME=/nonexistent PYTHONDONTWRITEBYTECODE=1 NRE_FUZZ_EXAMPLES=300 \
	    $(PY) -m pytest -q -p no:cacheprovider -W ignore tests/unit; fi

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
