# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test

.PHONY: demo test test-fast install install-test bench clean ensure-chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Re-install only when the project's metadata changes (editable install: code changes need nothing).
$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(STAMP_RUN)

install: $(STAMP_RUN)
install-test: $(STAMP_TEST) ensure-chromium

demo: $(STAMP_RUN)
	$(BIN)/servelab demo

# The report test opens pages in Debian's headless Chromium; install it where we may (CI runs as root).
ensure-chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "make: chromium not installed; the report's browser test will say so" >&2; }

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
PYTEST = $(BIN)/python -m pytest -q
NO_TESTS_IS_FAILURE = rc=$$?; if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test: $(STAMP_TEST) ensure-chromium
	@$(PYTEST) $(PYTEST_ARGS); $(NO_TESTS_IS_FAILURE)

# The inner loop: everything but the long end-to-end tests (marked `slow`); under 2 minutes.
test-fast: $(STAMP_TEST) ensure-chromium
	@$(PYTEST) -m "not slow" $(PYTEST_ARGS); $(NO_TESTS_IS_FAILURE)

bench: $(STAMP_TEST)
	$(BIN)/python bench/sim.py
	$(BIN)/python bench/loadgen.py
	$(BIN)/python bench/analysis.py

clean:
	rm -rf $(VENV) results/*.duckdb
