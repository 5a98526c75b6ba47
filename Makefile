# tierscope — one install, the demo, the tests, the benchmarks.
#
#   make setup     install what is missing (apt as root, the lab's system user, Python venv, native
#                  engine); idempotent
#   make demo      run the demo (depends on setup)
#   make test      the lint and the test suite (depends on setup); what CI runs
#   make lint      the house rules: ruff's checks and formatting over python/, tests/ and bench/, mypy over
#                  the package (strict on the pure parts); rustfmt and clippy over engine/
#   make format    apply ruff's formatting (the check `make lint` runs)
#   make bench     the benchmarks in bench/ (each prints ratios against a peer run side by side)
#   make fuzz      a longer fuzzing run of the tracer's protocol parsers
#   make fidelity  the real-run fidelity scenarios and the slow checks that do not fit in `make test`

SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
BIN   := $(VENV)/bin

# Debian packages the lab starts, traces or compares against.
APT_PACKAGES := nginx-light wrk hey tcpdump tshark mariadb-server mariadb-client \
                postgresql-15 postgresql-client-15 postgresql-contrib iproute2 procps \
                chromium redis-server galera-4 rsync openssh-server pgbouncer pgpool2 gcc libc6-dev
# Spark (`analyze --engine spark`) starts a JVM: a headless JRE, installed only when no `java` is on the
# PATH and JAVA_HOME is unset (a JDK the machine already has serves).
JRE_PACKAGE  := default-jre-headless

ENGINE_SOURCES := $(shell find engine/src -name '*.rs' 2>/dev/null) engine/Cargo.toml
PY_META        := pyproject.toml $(wildcard packaging/data/scripts/*)

.PHONY: setup system-packages system-user demo test lint format test-python test-engine bench fuzz fidelity clean

setup: system-packages system-user $(VENV)/.installed

system-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$JAVA_HOME" ] && ! command -v java >/dev/null 2>&1; then missing="$$missing $(JRE_PACKAGE)"; fi; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "setup: installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
	      || { echo "setup: apt-get install failed for:$$missing" >&2; exit 1; }; \
	  else \
	    echo "setup: not root, cannot install:$$missing (tests that need them will be skipped)" >&2; \
	  fi; \
	fi
	@# Debian starts installed daemons; tierscope starts its own, on its own ports and data dirs.
	@if [ "$$(id -u)" = 0 ]; then \
	  for s in nginx mariadb postgresql redis-server pgbouncer pgpool2; do service $$s stop >/dev/null 2>&1 || true; done; fi

# The unprivileged system user nginx's workers and the app servers run as in a root lab (no home,
# no login shell, a group of its own); tierscope makes it on first use too (services/_accounts.py).
LAB_OS_USER := tierscope
system-user:
	@if [ "$$(id -u)" = 0 ]; then \
	  getent passwd $(LAB_OS_USER) >/dev/null || { \
	    echo "setup: making the system user $(LAB_OS_USER) (nginx workers and app servers run as it)"; \
	    useradd --system --user-group --no-create-home --home-dir /nonexistent \
	      --shell /usr/sbin/nologin $(LAB_OS_USER); }; \
	fi

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip 'maturin>=1.5,<2'

# One install step builds the engine (maturin, bin bindings) and installs the package (editable).
$(VENV)/.installed: $(VENV)/bin/python $(ENGINE_SOURCES) $(PY_META)
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

# The diagnosis corpus (bench/diagnosis): the Python extra `diagnosis` (without rebuilding the
# package) and the Express shop's npm packages (npm ci, only when node_modules is missing or the lock changed).
DIAG_NODE := bench/diagnosis_corpus/express_shop
APT_PACKAGES += nodejs
setup: $(VENV)/.diagnosis $(DIAG_NODE)/node_modules/.installed
$(VENV)/.diagnosis: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["diagnosis"])')
	@touch $@
$(DIAG_NODE)/node_modules/.installed: $(DIAG_NODE)/package-lock.json $(DIAG_NODE)/package.json
	cd $(DIAG_NODE) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

demo: setup
	$(BIN)/tierscope demo

test: setup lint test-engine test-python

# House rules any change must keep: ruff's checks (pyflakes, pycodestyle, import order, bugbear,
# pyupgrade, simplify; each ignore says why) and its formatting at 120 columns (`make format` applies
# it), configured in pyproject.toml's [tool.ruff], which takes precedence over a user's own
# configuration. The whole package type-checks with mypy ([tool.mypy]: strict on the pure parts: the
# contracts, the tables, the manifest, the tiers, the spec, the analysis, the study document). The engine: formatted as engine/rustfmt.toml says,
# and clippy-clean with warnings as errors.

PY_BENCH := $(filter-out %__pycache__,$(wildcard bench/*))

format: setup
	$(BIN)/ruff format python tests $(PY_BENCH)

lint: setup
	$(BIN)/ruff check python tests $(PY_BENCH)
	$(BIN)/ruff format --check python tests $(PY_BENCH)
	$(BIN)/mypy --no-error-summary
	cd engine && cargo fmt --check
	cd engine && cargo clippy --all-targets -q -- -D warnings

test-engine:
	cd engine && cargo test --release -q

test-python:
	$(PY) -m pytest -q -m "not slow" --durations=15 tests

fidelity: setup
	$(PY) -m pytest -q -m "slow or fidelity" tests

bench: setup
	@for b in bench/*; do [ -x "$$b" ] && [ -f "$$b" ] || continue; echo "== $$b"; PATH="$(CURDIR)/$(BIN):$$PATH" "$$b" || exit 1; done

# A longer fuzzing run of the tracer's protocol parsers (libFuzzer via cargo fuzz, nightly Rust).
# `make test` runs the short, stable-toolchain version (a mutation test inside cargo test).
FUZZ_SECONDS ?= 600
fuzz: setup
	@rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
	@cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	cd engine && cargo +nightly fuzz run parsers -- -max_total_time=$(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) engine/target .pytest_cache
