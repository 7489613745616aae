"""Hostile and extreme profiles: each is refused by `validate` with a located error (never a
traceback, an unbounded read or an expansion to gigabytes), or, where it is valid, plans safely.
The cases are the ones a profile fuzzer found (issue 11)."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from servelab.cli import main
from servelab.core import yamlsource
from servelab.profiles import ProfileError, load_profile
from servelab.profiles.limits import MAX_PLANNED_REQUESTS, MAX_TOKENS
from servelab.profiles.planner import RequestPlanner
from test_validation import GOOD  # the same minimal valid profile the validation tests start from

# 9 x 9 x ... "lol"s: 260 bytes that PyYAML would expand to 9**6 = 531,441 strings (one more
# line is 4.8 million; the issue's 295-byte file took 7.7 s and 1.1 GB).
LAUGHS = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
          + "".join(f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcde", "bcdef")))


def only(path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_billion_laughs_is_refused_at_its_line(write_profile):
    path = write_profile(GOOD + LAUGHS)
    assert len(LAUGHS) < 300
    msg = only(path)
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: YAML syntax error: the document expands "
                    r"to more than 200,000 values \(aliases count as copies\)", msg), msg


def test_aliases_that_stay_small_still_work(write_profile):
    path = write_profile(GOOD.replace("output_tokens: 64", "output_tokens: &out 64")
                         .replace("load:", "  - {name: again, prompt_tokens: *out, "
                                  "output_tokens: *out}\nload:"))
    assert [c.prompt_tokens.kind for c in load_profile(path).classes] == ["normal", "fixed"]
    doc = yamlsource.parse("a: &a {x: 1}\nb: *a\nc: {<<: *a, y: 2}\n")
    assert doc.data == {"a": {"x": 1}, "b": {"x": 1}, "c": {"x": 1, "y": 2}}


@pytest.mark.parametrize("value", ["&c [*c]", "&m {a: *m}"])
def test_recursive_alias_is_refused(write_profile, value):
    path = write_profile(GOOD.replace("levels: [1, 2]", f"levels: {value}"))
    assert only(path).startswith(f"{path}:8:") and "recursive alias" in only(path)


@pytest.mark.parametrize("text", ["x: " + "[" * 1000 + "]" * 1000 + "\n",
                                  "".join("  " * i + "a:\n" for i in range(1000)),
                                  "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a"
                                  + "]" * 30 + "\n"])
def test_deep_nesting_is_refused_without_recursion_error(text):
    with pytest.raises(yamlsource.YamlSyntaxError, match="nesting deeper than 64 levels"):
        yamlsource.parse(text)


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x1b", "\x7f", "\uffff"])
def test_control_character_is_refused_at_its_line_and_column(write_profile, char):
    path = write_profile(GOOD.replace("a test profile", f"a test{char} profile"))
    msg = only(path)
    assert msg.startswith(f"{path}:2:20: YAML syntax error: control character #x"), msg
    assert "escapes in a double-quoted string" in msg


def test_impossible_date_and_giant_integer_are_located(write_profile):
    assert only(write_profile(GOOD + "seed: 2001-02-30\n")).endswith(
        "9:7: YAML syntax error: cannot read the value '2001-02-30' (day is out of range for "
        "month)")
    msg = only(write_profile(GOOD + "seed: " + "9" * 5000 + "\n"))
    assert ":9:7: YAML syntax error: cannot read the value" in msg and "5000 digits" in msg


def test_400_digit_bound_is_a_located_error(write_profile):
    path = write_profile(GOOD.replace("stdev: 50", "stdev: 50, max: 1" + "0" * 400))
    assert only(path) == (f"{path}:5: classes[0].prompt_tokens.max: found 100000...000 "
                          f"(401 digits); allowed a number <= {MAX_TOKENS}")


@pytest.mark.parametrize("field, old, new", [
    ("classes[0].prompt_tokens: found null", "prompt_tokens: {kind: normal, mean: 300, stdev: 50}",
     "prompt_tokens: null"),
    ("load.concurrency.hold: found inf", "hold: 5", "hold: .inf"),
    ("classes[0].prompt_tokens.mean: found nan; allowed a finite number", "mean: 300",
     "mean: .nan"),
    ("classes[0].prompt_tokens.stdev: found -inf; allowed a finite number", "stdev: 50",
     "stdev: -.inf"),
    ("classes[0].weight: found 1e+308; allowed a number <= 1e+06", "  - name: chat\n",
     "  - name: chat\n    weight: 1.0e+308\n"),
    ("classes[0].prompt_tokens.max: found 9223372036854775808; allowed a number <= 1000000",
     "{kind: normal, mean: 300, stdev: 50}", "{kind: uniform, min: 1, max: 9223372036854775808}"),
    ("load.rate.burstiness: found 1e-300; allowed a number >= 0.01",
     "concurrency: {levels: [1, 2], hold: 5}",
     "rate: {rates: [1], duration: 1h, arrival: gamma, burstiness: 1.0e-300}"),
    ("load.rate.rates: found 3,600,000,000,000,000 planned requests",
     "concurrency: {levels: [1, 2], hold: 5}", "rate: {rates: [1.0e+12], duration: 1h}"),
    ("load.concurrency: found null", "concurrency: {levels: [1, 2], hold: 5}", "concurrency:"),
    ("load.concurrency.levels[0]: found 1000000; allowed a number <= 100000", "levels: [1, 2]",
     "levels: [1000000]"),
    ("classes[0].prompt_tokens.sigma: found 1e+300; allowed a number <= 20",
     "{kind: normal, mean: 300, stdev: 50}", "{kind: lognormal, median: 5, sigma: 1.0e+300}"),
    ("seed: found 3000000000; allowed a number <= 2147483647", "name: t\n",
     "name: t\nseed: 3000000000\n"),
])
def test_what_the_planner_would_choke_on_is_refused_by_validate(write_profile, field, old, new):
    assert old in GOOD
    path = write_profile(GOOD.replace(old, new))
    msg = only(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: {re.escape(field)}", msg), msg


def test_histogram_weights_that_do_not_normalise(write_profile):
    bins = "[{min: 1, max: 2, weight: 1.0e+308}, {min: 3, max: 4, weight: 1.0e+308}]"
    path = write_profile(GOOD.replace("output_tokens: 64", "output_tokens: {kind: empirical, "
                                      f"histogram: {bins}}}"))
    with pytest.raises(ProfileError, match=r"output_tokens.histogram\[0\].weight: found 1e\+308"):
        load_profile(path)


def test_request_budget_is_per_run_and_inclusive(write_profile):
    rate = MAX_PLANNED_REQUESTS / 100
    ok = write_profile(GOOD.replace("concurrency: {levels: [1, 2], hold: 5}",
                                    f"rate: {{rates: [{rate:g}], duration: 100}}"))
    assert load_profile(ok).load.rate.rates == [rate]
    over = write_profile(GOOD.replace("concurrency: {levels: [1, 2], hold: 5}",
                                      f"rate: {{rates: [{rate:g}, 1], duration: 100}}"), "o.yaml")
    assert "at most 1,000,000 planned requests per run" in only(over)


@pytest.mark.parametrize("target", ["/dev/zero", "."])
def test_referenced_file_must_be_a_regular_file(write_profile, target):
    path = write_profile(GOOD.replace("output_tokens: 64",
                                      f"output_tokens: {{kind: empirical, file: {target}}}"))
    assert "not a regular file" in only(path)
    trace = write_profile(GOOD.replace("    prompt_tokens: {kind: normal, mean: 300, stdev: 50}\n"
                                       "    output_tokens: 64\n", "").replace(
        "concurrency: {levels: [1, 2], hold: 5}", f"trace: {{file: {target}}}"), "trace.yaml")
    assert "load.trace.file" in only(trace) and "not a regular file" in only(trace)


def test_referenced_file_over_the_cap_is_refused(write_profile, tmp_path, monkeypatch):
    from servelab.profiles import files

    monkeypatch.setattr(files, "MAX_DATA_BYTES", 1000)
    (tmp_path / "v.csv").write_text("5\n" * 600)
    path = write_profile(GOOD.replace("output_tokens: 64",
                                      "output_tokens: {kind: empirical, file: v.csv}"))
    assert "larger than 1,000 bytes" in only(path)


def test_profile_itself_must_be_a_small_regular_file(tmp_path):
    msg = str(pytest.raises(ProfileError, load_profile, "/dev/zero").value)
    assert msg.startswith("/dev/zero:1: cannot read the file (a device, pipe or socket")
    big = tmp_path / "big.yaml"
    big.write_text(GOOD + "#" * (1024 * 1024))
    assert "larger than 1 MiB" in str(pytest.raises(ProfileError, load_profile, big).value)


@pytest.mark.parametrize("body, message", [
    ("5\nNaN\n", "line 2: not JSON (NaN is not a JSON number)"),
    ("5\n1e400\n", "line 2: not JSON (1e400 is out of a float's range)"),
    ("[" * 100_000 + "\n", "line 1: not JSON"),
    ("9" * 5000 + "\n", "line 1: not JSON (Exceeds the limit"),
    (f"{MAX_TOKENS + 1}\n", f"token counts from 1 to {MAX_TOKENS:,}"),
])
def test_hostile_jsonl_values_file(write_profile, tmp_path, body, message):
    (tmp_path / "v.jsonl").write_text(body)
    path = write_profile(GOOD.replace("output_tokens: 64",
                                      "output_tokens: {kind: empirical, file: v.jsonl}"))
    assert message in only(path)


@pytest.mark.parametrize("body, message", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "x" * 200_000 + "\n",
     "not CSV (field larger than field limit"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\ninf,1,1\n",
     "line 2: timestamp 'inf' is not a finite"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,1e400,1\n", "line 2: ContextTokens '1e400'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n1e300,5,5\n", "a replay of 1e+300 s"),
])
def test_hostile_trace_file(write_profile, tmp_path, body, message):
    (tmp_path / "t.csv").write_text(body)
    path = write_profile(GOOD.replace("    prompt_tokens: {kind: normal, mean: 300, stdev: 50}\n"
                                      "    output_tokens: 64\n", "").replace(
        "concurrency: {levels: [1, 2], hold: 5}", "trace: {file: t.csv}"))
    assert message in only(path)


def test_key_with_control_characters_stays_on_one_line(write_profile):
    path = write_profile(GOOD + 'load2: 1\n"bad\\vkey\\u2028": 2\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    for line in str(info.value).splitlines():
        assert line.startswith(f"{path}:"), line
    assert "['bad\\x0bkey\\u2028']" in str(info.value)


def test_extreme_but_valid_values_plan_within_bounds(write_profile):
    # No max: a lognormal tail of sigma 20 would overflow int64 without the profile's ceiling;
    # sigma -0.0 passes ">= 0" but numpy refuses it.
    path = write_profile(GOOD.replace("{kind: normal, mean: 300, stdev: 50}",
                                      "{kind: lognormal, median: 5, sigma: 19.9}")
                         .replace("output_tokens: 64",
                                  "output_tokens: {kind: normal, mean: 9, stdev: -0.0}"))
    reqs = list(itertools.islice(RequestPlanner(load_profile(path)).requests(), 2000))
    prompt = np.array([r.prompt_tokens for r in reqs])
    assert prompt.min() >= 1 and prompt.max() <= MAX_TOKENS and prompt.max() == MAX_TOKENS
    assert {r.output_tokens for r in reqs} == {9}


def test_sample_of_a_large_open_loop_stage_is_lazy(write_profile, capsys):
    path = write_profile(GOOD.replace("concurrency: {levels: [1, 2], hold: 5}",
                                      "rate: {rates: [5000], duration: 190}"))
    assert main(["profiles", "sample", str(path), "-n", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_sessions_over_the_turn_budget(write_profile):
    classes = "".join(f"""
  - name: c{i}
    prompt_tokens: 5
    output_tokens: 5
    session: {{turns: {{kind: uniform, min: 1, max: 100}}}}""" for i in range(6))
    path = write_profile(f"name: t\ndescription: d\nclasses:{classes}\n"
                         "load: {concurrency: {levels: [1], hold: 5}}\n")
    assert "classes: found sessions with 600 turns in all" in only(path)


def test_cli_exits_2_without_traceback(write_profile, capsys):
    path = write_profile(GOOD + LAUGHS)
    for argv in (["profiles", "validate"], ["profiles", "show"], ["profiles", "sample"]):
        assert main(argv + [str(path)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"{path}:" in err
