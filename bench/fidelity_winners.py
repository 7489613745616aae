#!/usr/bin/env python
"""Which variant wins, predicted against measured, from two printouts of bench/fidelity_capture.py.

    python bench/fidelity_winners.py BF16.txt FP8.txt

For every run-level both printouts have (the phases runs match by their profile, phases_bf16 ~
phases_fp8) and each of TTFT p50, TPOT p50 (lower wins) and output tokens/s (higher wins), the
winner the measured figures name and the one the predicted figures name; it prints the ones that
differ and how many agree (issue 22's README, "Which variant wins").
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from fidelity_table import FIGURES  # noqa: E402  (a sibling script: the printout's columns)

COMPARED = {"ttft_p50": -1, "tpot_p50": -1, "tok_s": 1}   # the sign that makes higher better


def figures(path: Path) -> dict[tuple[str, int], dict[str, dict[str, float]]]:
    """{(run, users): {"measured"/"predicted": {figure: value}}} of the printout's (all) rows."""
    out: dict = {}
    run = key = None
    for line in path.read_text().splitlines():
        head = re.match(r"^(\S+)\s+\(ratio = ", line)
        if head:
            run = re.sub(r"_(bf16|fp8|gptq_int4|awq_int4)$", "", head.group(1))
            continue
        row = re.match(r"\s*(\d+) \(all\)\s+\d+ measured(.*)", line)
        if row:
            key = (run, int(row.group(1)))
            out[key] = {"measured": _values(row.group(2))}
        elif key is not None and line.strip().startswith("predicted"):
            out[key]["predicted"] = _values(line.split("predicted", 1)[1])
            key = None
    return out


def _values(text: str) -> dict[str, float]:
    return {c: float(v) for c, v in zip(FIGURES, text.split()) if v != "-"}


def winners(a: dict, b: dict, names=("bf16", "fp8")) -> tuple[int, list[str]]:
    """How many comparisons name the measured winner, and a line for each that does not."""
    right, wrong = 0, []
    for key in sorted(set(a) & set(b)):
        for fig, sign in COMPARED.items():
            pick = {}
            for side in ("measured", "predicted"):
                x, y = a[key][side][fig], b[key][side][fig]
                pick[side] = names[0] if sign * x > sign * y else names[1]
            if pick["measured"] == pick["predicted"]:
                right += 1
            else:
                wrong.append(f"{key[0]} {key[1]} users {fig}: measured {names[0]} "
                             f"{a[key]['measured'][fig]} / {names[1]} {b[key]['measured'][fig]}, "
                             f"predicted {a[key]['predicted'][fig]} / "
                             f"{b[key]['predicted'][fig]}")
    return right, wrong


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    args = ap.parse_args(argv)
    a, b = figures(args.first), figures(args.second)
    right, wrong = winners(a, b)
    for line in wrong:
        print("wrong:", line)
    print(f"winner right in {right} of {right + len(wrong)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
