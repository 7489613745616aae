"""A property-based profile fuzzer: hostile profiles in, located errors or working plans out.

Cases are built by hypothesis, mostly by mutating the shipped ``traffic_profiles/*.yaml``
(structure-aware: a value somewhere is replaced by an extreme number, null, an infinity, text,
deep nesting, a list or a mapping; keys are dropped or added; files the profile names are pointed
at devices, folders or generated hostile files) and then the YAML text itself (control
characters, alias bombs, recursive aliases, deep brackets, cut files); some are random YAML.

Each case runs in a forked child (the parent has imported everything once, so a case costs its
own work only) under an address-space limit of ``MEMORY_MB`` over what the child started with:
``servelab profiles validate``, and when that passes ``profiles show``, ``profiles sample``, the
planner (stages, every open-loop stage's arrivals, the first ``PLAN_REQUESTS`` requests) and the
prompts of the first ``PROMPTS`` requests (estimated token counts: no server).
The outcome is ``error`` (exit 2, every problem line located as FILE:LINE), ``valid`` (all of the
above worked), or a failure: ``traceback``, ``unlocated``, ``valid_but_fails``, ``hang`` (no
answer within ``HANG_S``) or ``died``. The child reports its own time and peak RSS growth.

Run ``python tests/profiles/profile_fuzzing.py -n 2000`` for the counts, the slowest case and
the largest memory growth.
"""
from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import re
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "traffic_profiles").glob("*.yaml"))
BASES = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in SHIPPED]
MEMORY_MB = 500
HANG_S = 20.0
PLAN_REQUESTS = 1000
PROMPTS = 2
FAILURES = ("traceback", "unlocated", "valid_but_fails", "hang", "died")


@dataclass
class Case:
    text: str
    files: dict = field(default_factory=dict)   # name in the profile's folder -> bytes

    def __repr__(self) -> str:   # hypothesis prints this for a failing case
        files = {k: v[:200] for k, v in self.files.items()}
        return f"Case(text={self.text[:3000]!r}, files={files})"


@dataclass
class Outcome:
    kind: str
    detail: str = ""
    seconds: float = 0.0
    peak_mb: float = 0.0


# ---- values -----------------------------------------------------------------------------------
EXTREME_NUMBERS = [0, -1, 1, 2, 0.5, -0.0, 1e-300, 5e-324, 1e12, 1e15, 1e308, -1e308, 2**31,
                   2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63), 10**400, -(10**400),
                   float("inf"), float("-inf"), float("nan"), 3600, 86400 * 400, 100, 101,
                   10_000_001]
WEIRD_TEXT = ["", " ", "\x00", "\x07bell", "é" * 3, "😀", "\u202e", "1e400", "-5", "inf", ".inf",
              "nan", "9" * 400, "1m30", "500ms", "1h" * 50, "null", "~", "yes", "0x10",
              "a" * 10_000, "../../../../etc/passwd", "/dev/zero", "\n\n", "{", "*a", "&a"]

scalars = st.one_of(
    st.sampled_from(EXTREME_NUMBERS),
    st.none(), st.booleans(),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WEIRD_TEXT),
    st.text(max_size=40),
)


def nested(depth: int):
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


values = st.one_of(
    scalars,
    st.builds(nested, st.integers(1, 90)),
    st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
        max_leaves=12),
    st.sampled_from([{"kind": "uniform", "min": 1, "max": 2**63},
                     {"kind": "lognormal", "median": 1e300, "sigma": 1e300},
                     {"kind": "lognormal", "mean": 5, "sigma": 19.9},
                     {"kind": "normal", "mean": 1e7, "stdev": 1e300},
                     {"kind": "empirical", "histogram": [{"min": 1, "max": 2, "weight": 1e308},
                                                         {"min": 1, "max": 3, "weight": 1e308}]},
                     {"kind": "empirical", "samples": []},
                     {"kind": "empirical", "file": "/dev/zero"},
                     {"kind": "empirical", "file": "values.csv"},
                     {"kind": "empirical", "file": "values.jsonl"},
                     {"kind": "empirical", "file": "."},
                     {"kind": "fixed", "value": None}]),
)

FILE_BODIES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"\x00" * 100, b"1\n2\nNaN\n", b"1e400\n", b"9" * 5000 + b"\n",
                     b"[" * 100_000 + b"\n", b"x" * 200_000 + b"\n", b"n\n1\n2\n3\n",
                     b"Infinity\n", b'{"n": 1e999}\n', b"\xff\xfe\n", b"-5\n",
                     b"TIMESTAMP,ContextTokens,GeneratedTokens\ninf,1,1\n",
                     b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,1e400,1\n",
                     b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n1e300,5,5\n",
                     b'{"timestamp": 1e300, "input_length": 1, "output_length": 1}\n'
                     b'{"timestamp": 0, "input_length": 1, "output_length": 1}\n']),
    st.lists(st.sampled_from(["1", "2.5", "1e7", "10000001", "0", "x", "nan", ""]), max_size=20)
    .map(lambda xs: ("\n".join(xs) + "\n").encode()),
)


# ---- mutations --------------------------------------------------------------------------------
def _slots(data, path=()):
    """Every (path, container, key) of the data: where a value may be replaced or removed."""
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append((path + (k,), data, k))
            out.extend(_slots(v, path + (k,)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.append((path + (i,), data, i))
            out.extend(_slots(v, path + (i,)))
    return out


@st.composite
def mutated_data(draw):
    data = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(data)
        if not slots:
            break
        op = draw(st.sampled_from(["number"] * 8 + ["replace"] * 4 + ["drop", "add", "wrap",
                                                                      "copy"]))
        numeric = [x for x in slots if isinstance(x[1][x[2]], (int, float))
                   and not isinstance(x[1][x[2]], bool)]
        _, container, key = draw(st.sampled_from(numeric if op == "number" and numeric
                                                 else slots))
        if op == "number":
            # Mostly in-range numbers, so that many cases stay valid and reach the planner.
            container[key] = draw(st.one_of(
                st.sampled_from(EXTREME_NUMBERS), st.integers(1, 5000),
                st.floats(0.01, 1e4), st.integers(1, 10**8), st.floats(1e-6, 1e9)))
        elif op == "replace":
            container[key] = copy.deepcopy(draw(values))
        elif op == "drop":
            del container[key]
        elif op == "add" and isinstance(container, dict):
            container[draw(st.sampled_from(["file", "max", "weight", "sessionz", "kind", "x"]))] = \
                copy.deepcopy(draw(values))
        elif op == "wrap":
            container[key] = [container[key]]
        elif op == "copy" and isinstance(container, list):
            container.extend([container[key]] * draw(st.integers(1, 150)))
    return data


def _dump(data) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=100)


BOMB = ('lol: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n"
                  for p, n in zip("abcdefgh", "bcdefghi")))


@st.composite
def text_mutation(draw, text: str) -> str:
    op = draw(st.sampled_from(["none"] * 12 + ["control", "bomb", "recursive", "brackets",
                               "cut", "splice", "indent"]))
    pos = draw(st.integers(0, len(text)))
    if op == "control":
        char = draw(st.sampled_from(["\x00", "\x01", "\x08", "\x0b", "\x0c", "\x1b", "\x7f",
                                     "\x85", "\ufeff", "\ud800", "\uffff"]))
        return text[:pos] + char + text[pos:]
    if op == "bomb":
        return BOMB + text
    if op == "recursive":
        return text + draw(st.sampled_from(["extra: &c [*c]\n", "extra: &m {a: *m}\n",
                                            "extra: *nope\n", "extra: &a 1\nmore: &a 2\n"]))
    if op == "brackets":
        n = draw(st.sampled_from([70, 1000, 20000]))
        return text + "extra: " + "[" * n + "]" * n + "\n"
    if op == "cut":
        return text[:pos]
    if op == "splice":
        return text[:pos] + draw(st.text(max_size=30)) + text[pos:]
    if op == "indent":
        return text[:pos] + "\n" + " " * draw(st.integers(0, 9)) + "- " + text[pos:]
    return text


@st.composite
def cases(draw) -> Case:
    files = draw(st.dictionaries(st.sampled_from(["values.csv", "values.jsonl", "trace.csv",
                                                  "trace.jsonl"]), FILE_BODIES, max_size=2))
    mode = draw(st.sampled_from(["mutate"] * 7 + ["random", "trace_file"]))
    if mode == "random":
        text = _dump(copy.deepcopy(draw(values)))
    else:
        data = draw(mutated_data())
        if mode == "trace_file" and isinstance(data, dict):
            data["load"] = {"trace": {"file": draw(st.sampled_from(
                ["trace.csv", "trace.jsonl", "/dev/zero", "traces", "missing.csv",
                 "traces/azure_conv_sample.csv"])), "time_scale": draw(st.sampled_from(
                    [1, 1e-300, 1e300, 1e6, 0.5]))}}
            classes = data.get("classes")
            for cls in classes if isinstance(classes, list) else []:
                if isinstance(cls, dict):
                    cls.pop("prompt_tokens", None)
                    cls.pop("output_tokens", None)
        text = _dump(data)
    return Case(draw(text_mutation(text)), files)


# ---- running one case -------------------------------------------------------------------------
def _vm_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cli(*argv: str) -> tuple[int, str, str]:
    from servelab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _exercise(path: str) -> tuple[str, str]:
    """What the child does; returns (outcome kind, detail)."""
    rc, _, err = _cli("profiles", "validate", path)
    if rc == 2:
        located = re.compile(re.escape(path) + r":\d+(:\d+)?: \S")
        lines = err.splitlines()
        if not lines or not lines[-1].endswith("profile(s) invalid"):
            return "unlocated", err[-2000:]
        bad = [line for line in lines[:-1] if not located.match(line)]
        return ("unlocated", "\n".join(bad)[:2000]) if bad else ("error", lines[0][:300])
    if rc != 0:
        return "valid_but_fails", f"validate exited {rc}: {err[-2000:]}"
    for argv in (("profiles", "show", path), ("profiles", "sample", path, "-n", "50"),
                 ("profiles", "sample", path, "-n", "20", "--workers", "3", "--worker", "2")):
        rc, _, err = _cli(*argv)
        if rc != 0:
            return "valid_but_fails", f"{' '.join(argv[:2])} exited {rc}: {err[-2000:]}"
    from servelab.profiles import load_profile
    from servelab.profiles.planner import RequestPlanner

    from servelab.profiles.prompts import PromptBuilder
    from servelab.profiles.tokens import EstimateCounter

    profile = load_profile(path)
    planner = RequestPlanner(profile)
    stages = planner.stages()
    if planner.load_kind in ("rate", "trace"):
        for s in stages:
            planner.arrival_times(s.index)
        first = list(itertools.islice(planner.iter_arrivals(0, 1, 2), PLAN_REQUESTS))
    else:
        first = list(itertools.islice(planner.requests(1, 2), PLAN_REQUESTS))
        next(planner.sessions(0, 1, start_item=5000))
    # What `run` does before sending: build the first prompts (turn 1 of a session needs no
    # history; later turns are built from answers, which need a server).
    builder = PromptBuilder(profile, EstimateCounter(), salt="fuzz")
    for request in [r for r in first if r.turn == 1][:PROMPTS]:
        builder.build(request).payload(profile.model)
    return "valid", f"{planner.load_kind}, {len(stages)} stages"


def _child(path: str, write_fd: int) -> None:
    try:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")   # reset the peak RSS to the current
        base_rss = _vm_kb("VmRSS")
        limit = (_vm_kb("VmSize") + MEMORY_MB * 1024) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        start = time.perf_counter()
        try:
            kind, detail = _exercise(path)
        except BaseException:   # noqa: BLE001 - any escape is the finding
            kind, detail = "traceback", traceback.format_exc()[-3000:]
        seconds = time.perf_counter() - start
        peak_mb = max(0, _vm_kb("VmHWM") - base_rss) / 1024
        os.write(write_fd, json.dumps({"kind": kind, "detail": detail, "seconds": seconds,
                                       "peak_mb": peak_mb}).encode())
    finally:
        os._exit(0)


def run_case(case: Case) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="servelab-fuzz-") as tmp:
        folder = Path(tmp)
        (folder / "traces").symlink_to(REPO / "traffic_profiles" / "traces")
        for name, body in case.files.items():
            (folder / name).write_bytes(body)
        path = folder / "profile.yaml"
        path.write_bytes(case.text.encode("utf-8", "surrogatepass"))
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(str(path), write_fd)
        os.close(write_fd)
        chunks, deadline = [], time.monotonic() + HANG_S
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return Outcome("hang", f"no answer within {HANG_S:g} s", HANG_S)
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        if not chunks:
            return Outcome("died", f"child exit status {status}")
        return Outcome(**json.loads(b"".join(chunks)))


def warm_up() -> None:
    """Import and exercise everything once in the parent, so forked cases pay only their own
    work (pydantic builds its validators and numpy its generators on first use)."""
    for case_path in SHIPPED[:3]:
        _exercise(str(case_path))


# ---- the 2,000-case run -----------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    import argparse

    from hypothesis import HealthCheck, given, settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="number of cases (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the slowest and the most memory-hungry case")
    args = parser.parse_args(argv)
    warm_up()
    outcomes: list[tuple[Outcome, Case]] = []

    @settings(max_examples=args.n, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=["generate"])
    @given(cases())
    def collect(case):
        outcomes.append((run_case(case), case))

    from hypothesis import seed as hseed
    hseed(args.seed)(collect)()
    counts: dict = {}
    for o, _ in outcomes:
        counts[o.kind] = counts.get(o.kind, 0) + 1
    slowest = max(outcomes, key=lambda oc: oc[0].seconds)
    biggest = max(outcomes, key=lambda oc: oc[0].peak_mb)
    print(f"{len(outcomes)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"max time {slowest[0].seconds:.3f} s ({slowest[0].kind}: {slowest[0].detail[:120]})")
    print(f"max memory growth {biggest[0].peak_mb:.1f} MB ({biggest[0].kind}: "
          f"{biggest[0].detail[:120]})")
    if "-v" in sys.argv or "--verbose" in sys.argv:
        print(f"\n--- slowest\n{slowest[1]!r}\n--- biggest\n{biggest[1]!r}")
    for o, case in outcomes:
        if o.kind in FAILURES:
            print(f"\n--- {o.kind}\n{o.detail}\n{case!r}")
    return 1 if any(o.kind in FAILURES for o, _ in outcomes) else 0


if __name__ == "__main__":
    try:
        import servelab  # noqa: F401 - installed (editable) or on PYTHONPATH
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
