# The two commands of the README, plus what they need. Everything installs into .venv; Kubernetes,
# etcd and KWOK binaries are built once into the versioned cache (~/.cache/dra-harness/binaries).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
REPORT_DIR ?= reports
PYTEST_WORKERS ?= 2

.PHONY: run test unit lint install binaries node-tools wirecompat example-driver kind-e2e clean
# Debian packages a real node (docs/real-node.md) takes from the machine; the rest is built here.
NODE_PACKAGES := runc containernetworking-plugins busybox-static

# Main job: local real 1.37 control plane + KWOK nodes, conformance suite, report, stop.
run: install binaries
	$(BIN)/dra-harness run --report-dir $(REPORT_DIR)

# The harness's own tests and the conformance suite, on a local cluster started for the run; the 25
# slowest tests are listed at the end (where CI's time goes). --dist loadgroup: tests marked xdist_group(name) share one worker.
test: install binaries wirecompat example-driver
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=25 tests conformance

# The suite on a kind cluster, and a pod through a kind kubelet (docs/kind-and-existing.md): kind and the
# node image's kubeadm built into the cache; without a Docker engine the harness starts its own (root on
# Debian). Run on its own, not beside `make test`: it starts a kind cluster per test (the suite's: clusters/mixed.yaml,
# kind workers and KWOK nodes; the e2e's: 3 nodes).
kind-e2e: install binaries
	$(BIN)/dra-harness binaries install --kind
	DRA_HARNESS_KIND_E2E=1 $(BIN)/pytest --durations=0 tests/integration/test_kind_conformance.py \
	  tests/integration/test_kind_e2e.py

unit: install
	$(BIN)/pytest tests/unit

# ruff over the whole tree (tests and benchmarks too), mypy over the project's packages, and the
# allowed import directions (import-linter); zero findings (configured in pyproject.toml)
LINT_PATHS := harness fake_devices load conformance
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy $(LINT_PATHS)
	$(BIN)/lint-imports

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# As root, also the real node's runtime (containerd from the Go module proxy, the pause binary).
binaries: install node-tools
	$(BIN)/dra-harness binaries install $$( [ "$$(id -u)" = 0 ] && echo --node-runtime )

# runc, CNI plugins and a static busybox for the real node: installed with apt-get when running as
# root on Debian/Ubuntu; elsewhere the kubelet tests skip and say why.
node-tools:
	@if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "note: not root or no apt-get: no real node, the kubelet tests will skip (docs/real-node.md)"; \
	else \
	  missing=""; for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	  fi; \
	fi

# The Go client of the kubelet-plugin wire tests (tests/wirecompat), built once into the cache.
wirecompat: install
	$(BIN)/python -m harness.binaries.wirecompat

# The reference third-party driver of the vendor-mode test (dra-example-driver v0.4.0's kubelet plugin),
# built once from the Go module proxy into the binary cache (~2 min cold, then only verified); without
# Go its test skips and says why.
example-driver: install
	@if command -v go >/dev/null; then $(BIN)/python -m harness.binaries.exampledriver; \
	else echo "note: no go on PATH: dra-example-driver is not built, its vendor-mode test will skip"; fi

clean:
	rm -rf $(VENV) $(REPORT_DIR) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
