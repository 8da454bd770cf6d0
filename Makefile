# The two commands of the README, plus what they need. Everything installs into .venv; Kubernetes,
# etcd and KWOK binaries are built once into the versioned cache (~/.cache/dra-harness/binaries).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
REPORT_DIR ?= reports
PYTEST_WORKERS ?= 2

.PHONY: run test unit install binaries wirecompat clean

# Main job: local real 1.37 control plane + KWOK nodes, conformance suite, report, stop.
run: install binaries
	$(BIN)/dra-harness run --report-dir $(REPORT_DIR)

# The harness's own tests and the conformance suite, on a local cluster started for the run.
test: install binaries wirecompat
	$(BIN)/pytest -n $(PYTEST_WORKERS) tests conformance

unit: install
	$(BIN)/pytest tests/unit

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

binaries: install
	$(BIN)/dra-harness binaries install

# The Go client of the kubelet-plugin wire tests (tests/wirecompat), built once into the cache.
wirecompat: install
	$(BIN)/python -m harness.wirecompat

clean:
	rm -rf $(VENV) $(REPORT_DIR) .pytest_cache
