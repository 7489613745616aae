"""Every way a profile can be wrong: each message names the file, the YAML line and the field."""
from __future__ import annotations

import re

import pytest

from servelab.core.errors import ServelabError
from servelab.profiles import ProfileError, load_profile

GOOD = """
name: t
description: a test profile
classes:
  - name: chat
    prompt_tokens: {kind: normal, mean: 300, stdev: 50}
    output_tokens: 64
load:
  concurrency: {levels: [1, 2], hold: 5}
"""


def problems(path) -> list[str]:
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert isinstance(info.value, ServelabError)
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.problems)
    return lines


def only(path) -> str:
    lines = problems(path)
    assert len(lines) == 1, lines
    return lines[0]


def test_good_profile_loads(write_profile, tmp_path):
    profile = load_profile(write_profile(GOOD))
    assert profile.classes[0].sampling.ignore_eos is True
    assert profile.salt is True and profile.model == "auto" and profile.endpoint == "chat"
    assert profile.load.kind == "concurrency" and profile.load.plan.warmup == 0
    assert profile.tokenizer_path is None
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "t.json").write_text("{}")
    profile = load_profile(write_profile(GOOD + "tokenizer: tok/t.json\n"))
    assert profile.tokenizer_path == tmp_path / "tok" / "t.json"


def test_yaml_syntax_error_gives_line_and_column(write_profile):
    path = write_profile("name: t\nclasses: [a, b\nload: 1\n")
    msg = only(path)
    assert msg.startswith(f"{path}:3:5: YAML syntax error")


def test_unknown_distribution(write_profile):
    path = write_profile(GOOD.replace("kind: normal", "kind: gaussian"))
    assert only(path) == (f"{path}:5: classes[0].prompt_tokens: found kind 'gaussian'; allowed "
                          "kind one of 'fixed', 'uniform', 'normal', 'lognormal', 'empirical'")


def test_negative_stdev(write_profile):
    path = write_profile(GOOD.replace("stdev: 50", "stdev: -3"))
    assert only(path) == (f"{path}:5: classes[0].prompt_tokens.stdev: found -3; allowed a number "
                          ">= 0")


def test_weights_summing_to_zero(write_profile):
    path = write_profile(GOOD.replace("  - name: chat\n", "  - name: chat\n    weight: 0\n"))
    msg = only(path)
    assert msg.startswith(f"{path}:3: classes: found weights summing to 0; allowed")
    assert "weight > 0" in msg


def test_missing_load_plan(write_profile):
    text = GOOD.split("load:")[0]
    path = write_profile(text)
    assert only(path) == (f"{path}:1: load: found nothing; allowed exactly one of concurrency, "
                          "rate, ramp, trace")


def test_empty_load_and_two_plans(write_profile):
    path = write_profile(GOOD.replace("  concurrency: {levels: [1, 2], hold: 5}", "  {}"))
    assert "load: found no plan; allowed exactly one of concurrency" in only(path)
    path = write_profile(GOOD + "  rate: {rates: [1], duration: 10}\n")
    assert f"{path}:7: load: found plans concurrency, rate; allowed exactly one" in only(path)


def test_unknown_key_suggests_the_right_one(write_profile):
    path = write_profile(GOOD.replace("output_tokens: 64", "output_token: 64"))
    lines = problems(path)
    assert len(lines) == 2
    # The missing real key is reported at its class (line 4), the typo at its own line.
    assert lines[0].startswith(f"{path}:4: classes[0].output_tokens: found nothing")
    assert lines[1].startswith(f"{path}:6: classes[0].output_token: found unknown key "
                               "'output_token'; allowed did you mean 'output_tokens'?")


def test_unknown_top_level_and_slo_keys(write_profile):
    path = write_profile(GOOD + "colour: red\n")
    assert only(path).startswith(f"{path}:9: colour: found unknown key 'colour'; allowed keys: "
                                 "name, description")
    path = write_profile(GOOD.replace("output_tokens: 64",
                                      "output_tokens: 64\n    slo: {ttft: 200}"))
    assert "classes[0].slo.ttft: found unknown key 'ttft'; allowed did you mean 'ttft_ms'?" \
        in only(path)


def test_every_problem_is_listed(write_profile):
    path = write_profile("""
        name: bad name
        description: ""
        endpoint: grpc
        classes:
          - name: a
            prompt_tokens: {kind: uniform, min: 50, max: 10}
            output_tokens: {kind: lognormal, median: 10, mean: 20, sigma: 1}
          - name: a
            prompt_tokens: 0
            output_tokens: 12.5
        load:
          rate: {rates: [0], duration: 1x, arrival: gamma}
        """)
    lines = problems(path)
    expected = [
        (1, "name: found 'bad name'"),
        (2, "description: found ''; allowed non-empty text"),
        (3, "endpoint: found 'grpc'; allowed one of 'chat' or 'completions'"),
        (6, "classes[0].prompt_tokens.max: found 10 < min 50; allowed max >= min"),
        (7, "classes[0].output_tokens.median: found both median and mean"),
        (8, "classes[1].name: found 'a' again (also classes[0])"),
        (9, "classes[1].prompt_tokens: found 0; allowed a number >= 1"),
        (10, "classes[1].output_tokens: found 12.5; allowed a whole number"),
        (12, "load.rate.rates[0]: found 0; allowed a number > 0"),
        (12, "load.rate.duration: found '1x'; allowed seconds as a number"),
    ]
    for line, text in expected:
        assert any(m.startswith(f"{path}:{line}: {text}") for m in lines), (line, text, lines)
    assert len(lines) == len(expected)


def test_rate_plan_rules(write_profile):
    gamma = GOOD.replace("  concurrency: {levels: [1, 2], hold: 5}",
                         "  rate: {rates: [1], duration: 10, arrival: gamma}")
    assert "load.rate.burstiness: found nothing; allowed a number > 0 with gamma" \
        in only(write_profile(gamma))
    poisson = GOOD.replace("  concurrency: {levels: [1, 2], hold: 5}",
                           "  rate: {rates: [1], duration: 10, burstiness: 2}")
    assert "load.rate.burstiness: found 2; allowed burstiness only with arrival: gamma" \
        in only(write_profile(poisson))


def test_duration_strings(write_profile):
    path = write_profile(GOOD.replace("hold: 5", "hold: 1m30s, warmup: 500ms"))
    plan = load_profile(path).load.plan
    assert plan.hold == 90 and plan.warmup == 0.5
    assert "load.concurrency.hold: found '0s'; allowed a number > 0" in \
        only(write_profile(GOOD.replace("hold: 5", "hold: 0s")))


def test_lengths_required_without_trace_and_refused_with_trace(write_profile, tmp_path):
    path = write_profile(GOOD.replace("    output_tokens: 64\n", ""))
    assert only(path).startswith(f"{path}:4: classes[0].output_tokens: found nothing; allowed a "
                                 "length distribution")
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.68,10,5\n")
    traced = GOOD.replace("  concurrency: {levels: [1, 2], hold: 5}", "  trace: {file: t.csv}")
    lines = problems(write_profile(traced))
    assert "classes[0].prompt_tokens: found a length distribution under a trace plan" in lines[0]
    assert "classes[0].output_tokens: found a length distribution under a trace plan" in lines[1]


def test_missing_and_broken_files(write_profile, tmp_path):
    path = write_profile(GOOD.replace("output_tokens: 64",
                                      "output_tokens: {kind: empirical, file: nope.csv}"))
    msg = only(path)
    assert msg.startswith(f"{path}:6: classes[0].output_tokens.file: found 'nope.csv' (")
    assert "relative to the profile's folder" in msg
    (tmp_path / "lengths.csv").write_text("n\n12\nlots\n")
    path = write_profile(GOOD.replace("output_tokens: 64",
                                      "output_tokens: {kind: empirical, file: lengths.csv}"))
    assert "line 3: 'lots' is not a number" in only(path)
    (tmp_path / "trace.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        "2023-11-16 18:15:46.68,10,5\nyesterday,1,1\n")
    traced = (GOOD.split("classes:")[0]
              + "classes:\n  - name: c\nload:\n  trace: {file: trace.csv}\n")
    msg = only(write_profile(traced))
    assert re.search(r":6: load\.trace\.file: found 'trace\.csv' \(line 3: TIMESTAMP 'yesterday' "
                     r"is not a date-time\)", msg), msg
    assert "tokenizer: found 'tok.json' (no such file)" in \
        only(write_profile(GOOD + "tokenizer: tok.json\n"))


def test_class_rules(write_profile):
    prefix = GOOD.replace("output_tokens: 64", "output_tokens: 64\n    prefix_groups: 3")
    assert "classes[0].prefix_groups: found 3; allowed prefix_groups only together with " \
           "prefix_tokens > 0" in only(write_profile(prefix))
    unbounded = GOOD.replace("output_tokens: 64", "output_tokens: 64\n    session: {turns: "
                             "{kind: lognormal, median: 3, sigma: 1}}")
    assert "classes[0].session.turns: found an unbounded distribution; allowed a distribution " \
           "with max" in only(write_profile(unbounded))
    text = GOOD.replace("output_tokens: 64", "output_tokens: 64\n    text: klingon")
    assert "classes[0].text: found 'klingon'; allowed one of 'modern', 'kjv' or 'code'" in \
        only(write_profile(text))


def test_duplicate_yaml_key(write_profile):
    path = write_profile(GOOD.replace("output_tokens: 64", "output_tokens: 64\n    weight: 1\n"
                                      "    weight: 2"))
    assert only(path) == (f"{path}:8: classes[0].weight: found key 'weight' again (first on line "
                          "7); allowed each key once")


def test_empty_file_and_wrong_top_level(write_profile):
    path = write_profile("")
    assert only(path) == (f"{path}:1: (top level): found an empty file; allowed a mapping with "
                          "name, description, classes and load")
    path = write_profile("- 1\n- 2\n")
    assert "(top level): found a list" in only(path)


def test_unreadable_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    assert only(missing).startswith(f"{missing}:1: cannot read the file")
