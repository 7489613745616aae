"""The profile fuzzer (profile_fuzzing.py): every generated profile gets a located error or plans
cleanly; no traceback, no hang, no case past MEMORY_MB of memory growth (an address-space limit
in the case's own forked process). `python tests/profiles/profile_fuzzing.py -n 2000` prints the
counts, the slowest case and the largest memory growth."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

import profile_fuzzing as fuzz

# Derandomized: the same cases on every run, so a failure here is a bug, not bad luck.
FUZZ = dict(deadline=None, database=None, derandomize=True, print_blob=True,
            suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def warmed():
    fuzz.warm_up()


def _check(case):
    outcome = fuzz.run_case(case)
    assert outcome.kind in ("error", "valid"), f"{outcome.kind}: {outcome.detail}"


@pytest.mark.slow
@settings(max_examples=100, **FUZZ)
@given(case=fuzz.cases())
def test_fuzzed_profiles_fail_cleanly_or_plan(warmed, case):
    _check(case)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SERVELAB_FUZZ_LONG"),
                    reason="2,000 cases take ~3 minutes: set SERVELAB_FUZZ_LONG=1")
@settings(max_examples=2000, **FUZZ)
@given(case=fuzz.cases())
def test_fuzzed_profiles_2000(warmed, case):
    _check(case)


def test_fuzzer_catches_a_traceback_and_a_hang(monkeypatch):
    """The harness itself: an exception escaping the CLI is a traceback, a stuck case a hang."""
    monkeypatch.setattr(fuzz, "_exercise", lambda path: 1 / 0)
    assert fuzz.run_case(fuzz.Case("x: 1\n")).kind == "traceback"
    monkeypatch.setattr(fuzz, "HANG_S", 0.5)
    monkeypatch.setattr(fuzz, "_exercise", lambda path: __import__("time").sleep(30))
    assert fuzz.run_case(fuzz.Case("x: 1\n")).kind == "hang"
    monkeypatch.setattr(fuzz, "_exercise", lambda path: bytearray(fuzz.MEMORY_MB << 21))
    assert fuzz.run_case(fuzz.Case("x: 1\n")).kind == "traceback"   # MemoryError
