"""``servelab run --workers auto``: the worker count follows the plan's peak users and the host's
cores, says why, and stops at what the cores allow."""
from __future__ import annotations

import argparse
import textwrap

import pytest

from servelab.commands.run import add_run_flags
from servelab.orchestration.workers import USERS_PER_PROCESS, auto_workers, peak_users
from servelab.profiles.loader import load_profile

HEAD = """\
name: auto_workers
description: worker count test
endpoint: chat
model: auto
classes:
  - name: chat
    prompt_tokens: 32
    output_tokens: {kind: uniform, min: 50, max: 150}
load:
"""


def _profile(tmp_path, load: str):
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(load), "  "))
    return load_profile(path)


def test_peak_users_of_each_plan_kind(tmp_path):
    assert peak_users(_profile(tmp_path, "concurrency: {levels: [4, 900, 16], hold: 5s}")) == 900
    ramp = "ramp: {stages: [{users: 300, spawn_rate: 10, duration: 5s}, " \
           "{users: 40, spawn_rate: 10, duration: 5s}]}"
    assert peak_users(_profile(tmp_path, ramp)) == 300
    capped = "rate: {rates: [5, 50], duration: 5s, max_in_flight: 700}"
    assert peak_users(_profile(tmp_path, capped)) == 700
    # open loop without a cap: rate x a guessed E2E of the longest reply (150 tokens)
    assert peak_users(_profile(tmp_path, "rate: {rates: [5, 50], duration: 5s}")) == 275


def test_count_follows_users_and_stops_at_the_cores(tmp_path):
    small = _profile(tmp_path, f"concurrency: {{levels: [{USERS_PER_PROCESS}], hold: 5s}}")
    assert auto_workers(small, starts_simulator=False, cores=2)[0] == 0
    big = _profile(tmp_path, "concurrency: {levels: [5000], hold: 5s}")
    count, why = auto_workers(big, starts_simulator=False, cores=32)
    assert count == -(-5000 // USERS_PER_PROCESS) and "5000 peak users" in why
    count, why = auto_workers(big, starts_simulator=True, cores=4)
    assert count == 2 and "fewer than" in why and "generator_saturated" in why


def test_the_flag_takes_auto_or_a_count():
    p = argparse.ArgumentParser()
    add_run_flags(p)
    assert p.parse_args(["--profile", "x", "--workers", "auto"]).workers == "auto"
    assert p.parse_args(["--profile", "x", "--workers", "3"]).workers == 3
    with pytest.raises(SystemExit):
        p.parse_args(["--profile", "x", "--workers", "many"])
