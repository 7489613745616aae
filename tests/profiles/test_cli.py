"""`servelab profiles validate|show|sample`, `servelab demo`, and every shipped profile."""
from __future__ import annotations

import csv
import io
import itertools
import json
import subprocess
import sys

import pytest

from servelab.cli import main
from servelab.profiles import load_profile
from servelab.profiles.planner import RequestPlanner

from .conftest import REPO, SHIPPED

EXPECTED = {"smoke", "chat", "rag_long_prompt", "code_completion", "summarization", "mixed",
            "quant_sweep", "spec_decode", "poisson_rates", "multi_turn_chat", "trace_replay"}


def test_all_listed_profiles_are_shipped():
    assert EXPECTED <= {p.stem for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_profile_is_valid_and_fits_the_default_model(path):
    profile = load_profile(path)
    assert profile.name == path.stem
    assert len(profile.description) > 60 and "?" in profile.description   # names its question
    planner = RequestPlanner(profile)
    stages = planner.stages()
    assert stages and all(s.duration_s > 0 for s in stages)
    # Whole sessions (history included) must fit Qwen2.5-7B's 32,768-token context.
    longest = 0
    for session in itertools.islice(planner.sessions(), 2000):
        total = sum(r.prompt_tokens + r.output_tokens for r in session)
        longest = max(longest, total)
    assert longest <= 32_768


def test_validate_exit_codes(capsys, write_profile):
    assert main(["profiles", "validate", *map(str, SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(SHIPPED)
    bad = write_profile("name: x\ndescription: d\nclasses: []\n", "bad.yaml")
    assert main(["profiles", "validate", str(SHIPPED[0]), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{bad}:3: classes: found []; allowed a list with at least 1 item(s)" in captured.err
    assert f"{bad}:1: load: found nothing" in captured.err
    assert "1 of 2 profile(s) invalid" in captured.err


def test_show_smoke(capsys):
    assert main(["profiles", "show", str(REPO / "traffic_profiles" / "smoke.yaml")]) == 0
    out = capsys.readouterr().out
    assert "profile smoke" in out and "short_chat" in out and "ttft<=1000ms" in out
    # uniform 64..256 prompts: mean 160; the p99 is at most 256.
    row = next(line for line in out.splitlines() if line.strip().startswith("short_chat  1"))
    prompt_mean = int(row.split()[3])
    assert 150 <= prompt_mean <= 170
    assert "total planned time 8s" in out and "depends on server latency" in out


def test_show_rate_and_trace_plans(capsys):
    assert main(["profiles", "show", str(REPO / "traffic_profiles" / "poisson_rates.yaml")]) == 0
    out = capsys.readouterr().out
    assert "rate (open loop, poisson arrivals; at most 512 in flight)" in out
    assert "expected requests 6,020 (rate x duration per stage)" in out   # 43/s x 140 s
    assert main(["profiles", "show", str(REPO / "traffic_profiles" / "trace_replay.yaml")]) == 0
    out = capsys.readouterr().out
    assert "expected requests 400 (one per trace row)" in out


def test_sample_jsonl_and_csv(capsys):
    smoke = str(REPO / "traffic_profiles" / "smoke.yaml")
    assert main(["profiles", "sample", smoke, "-n", "5"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r["class"] == "short_chat" and 64 <= r["prompt_tokens"] <= 256 and
               r["arrival_s"] is None and r["turn"] == 1 for r in rows)
    rates = str(REPO / "traffic_profiles" / "poisson_rates.yaml")
    assert main(["profiles", "sample", rates, "-n", "6", "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(table) == 6 and set(table[0]) >= {"class", "prompt_tokens", "output_tokens",
                                                 "prefix_group", "turn", "arrival_s"}
    arrivals = [float(r["arrival_s"]) for r in table]
    assert arrivals == sorted(arrivals) and all(r["stage"] == "0" for r in table)


def test_sample_worker_split_matches_the_whole(capsys):
    mixed = str(REPO / "traffic_profiles" / "mixed.yaml")
    assert main(["profiles", "sample", mixed, "-n", "60"]) == 0
    whole = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    parts = []
    for w in range(3):
        assert main(["profiles", "sample", mixed, "-n", "20", "--workers", "3",
                     "--worker", str(w)]) == 0
        parts += [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert sorted(parts, key=lambda r: r["index"]) == whole


def test_bad_arguments_and_missing_file(capsys, tmp_path):
    smoke = str(REPO / "traffic_profiles" / "smoke.yaml")
    assert main(["profiles", "sample", smoke, "--workers", "2", "--worker", "2"]) == 2
    assert "--worker 2 --workers 2" in capsys.readouterr().err
    assert main(["profiles", "show", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read the file" in capsys.readouterr().err
    assert main(["profiles"]) == 2


def test_show_all_profiles_prints_every_summary(capsys):
    from servelab.commands.profiles import show_all_profiles

    assert show_all_profiles() == 0
    out = capsys.readouterr().out
    for name in EXPECTED:
        assert f"profile {name}  (" in out


def test_console_script_exit_status(write_profile):
    bad = write_profile("name: x\n", "bad.yaml")
    cmd = [sys.executable, "-m", "servelab.cli", "profiles", "validate"]
    ok = subprocess.run(cmd + [str(REPO / "traffic_profiles" / "smoke.yaml")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "ok (smoke" in ok.stdout
    failed = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, timeout=60)
    assert failed.returncode == 2
    assert f"{bad}:1: classes: found nothing" in failed.stderr
    assert "Traceback" not in failed.stderr
