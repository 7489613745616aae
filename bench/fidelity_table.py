#!/usr/bin/env python
"""Before/after tables from two printouts of bench/fidelity_capture.py (issue 22's README).

    python bench/fidelity_table.py BEFORE.txt AFTER.txt [--title bf16]

For each load level (users) and figure, the range of predicted/measured ratios over the runs of
the capture (rag_chat, code_gen, phases_*), before -> after, with how many of the level's cells
miss their target (15% for TTFT p50, TPOT p50, tok/s; 25% for TTFT p99, ITL p99) each time.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

FIGURES = ("ttft_p50", "ttft_p99", "tpot_p50", "itl_p99", "tok_s")
TARGETS = dict(ttft_p50=0.15, ttft_p99=0.25, tpot_p50=0.15, itl_p99=0.25, tok_s=0.15)


def ratios(path: Path) -> dict[int, dict[str, list[float]]]:
    """{users: {figure: [ratio per run]}} of the printout's (all) rows."""
    out: dict[int, dict[str, list[float]]] = {}
    users = None
    for line in path.read_text().splitlines():
        head = re.match(r"\s*(\d+) \(all\)", line)
        if head:
            users = int(head.group(1))
        elif users is not None and line.strip().startswith("ratio"):
            values = re.findall(r"(\d+\.\d+|-)", line)
            for fig, v in zip(FIGURES, values):
                if v != "-":
                    out.setdefault(users, {}).setdefault(fig, []).append(float(v))
            users = None
    return out


def cell(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"


def misses(values: list[float], fig: str) -> int:
    return sum(abs(v - 1) > TARGETS[fig] for v in values)


def table(before: dict, after: dict) -> list[str]:
    rows = ["| users | " + " | ".join(FIGURES) + " | outside target |",
            "|---|" + "---|" * (len(FIGURES) + 1)]
    for users in sorted(set(before) | set(after)):
        b, a = before.get(users, {}), after.get(users, {})
        cells = [f"{cell(b[f]) if f in b else '-'} -> {cell(a[f]) if f in a else '-'}"
                 for f in FIGURES]
        nb = sum(misses(b.get(f, []), f) for f in FIGURES)
        na = sum(misses(a.get(f, []), f) for f in FIGURES)
        rows.append(f"| {users} | " + " | ".join(cells) + f" | {nb} -> {na} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    print("\n".join(table(ratios(args.before), ratios(args.after))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
