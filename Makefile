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

# Most tests wait on real servers and runs rather than the CPU, so TEST_WORKERS pytest processes
# (each keeping a file's tests together, so a module's fixtures run once) share CI's two cores.
# Three, not two: with two the parallel pass kept 1.1 of the 2 cores busy (fresh clone, 565 s);
# with three it took 446 s. Tests that judge this host's own load (marked `serial`) would see
# the other workers' load as theirs: they run afterwards, alone.
TEST_WORKERS ?= 3
# The suite starts some hundreds of Python processes (servers, Locust masters and workers). An
# editable install leaves servelab's sources uncompiled, and where PYTHONDONTWRITEBYTECODE is
# set (as on CI's machines) every process compiled them again: ~0.2 s of CPU each. Compiled
# once here (only what changed); a stale .pyc is never used, Python checks the source's mtime.
COMPILE = @$(BIN)/python -m compileall -q src loadtests > /dev/null
test: $(STAMP_TEST) ensure-chromium
	$(COMPILE)
	@$(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS); a=$$?; \
	$(PYTEST) -m serial $(PYTEST_ARGS); b=$$?; \
	if [ $$a -eq 5 ] && [ $$b -eq 5 ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; \
	for rc in $$a $$b; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

# The inner loop: everything but the long end-to-end tests (marked `slow`); under 2 minutes.
test-fast: $(STAMP_TEST) ensure-chromium
	$(COMPILE)
	@$(PYTEST) -m "not slow" $(PYTEST_ARGS); $(NO_TESTS_IS_FAILURE)

bench: $(STAMP_TEST)
	$(BIN)/python bench/sim.py
	$(BIN)/python bench/loadgen.py
	$(BIN)/python bench/analysis.py

clean:
	rm -rf $(VENV) results/*.duckdb
