"""The seed's quantization table from real H200 runs, and the simulator's costs held against it.

    python bench/quant_table.py RESULTS [--out servers/captured/quant_h200] [--no-predict]

RESULTS is what ``bench/h200_int4.sh`` or ``bench/h200_lease.sh`` leaves: one folder per
variant (bf16, fp8, gptq_int4, awq_int4) holding ``run.duckdb`` (or its export by
``bench/capture_export.py``, ``phases_<variant>/``, as ``servers/captured/h200_20261202`` keeps it), ``cmd.txt`` (the exact ``vllm
serve`` line) and ``verify.txt``. For each run it reads ``stage_summary`` per load level
(throughput and latency), then predicts the same profile with the same serve flags in virtual
time (``servelab predict --hardware H200``; the profile is the one stored with the run) and
prints predicted / measured. It writes ``table.csv`` and ``table.md`` into --out and puts the
table into --out's README.md between the ``quant_table`` markers, so one command fills it in.
"""
from __future__ import annotations

import argparse
import csv
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from capture_export import open_export  # noqa: E402  (a sibling script, not a package)
VARIANTS = ("bf16", "fp8", "gptq_int4", "awq_int4")
FIGURES = (("output_tokens_per_s", "tok/s"), ("ttft_p50_ms", "TTFT p50"),
           ("ttft_p99_ms", "TTFT p99"), ("tpot_p50_ms", "TPOT p50"), ("itl_p99_ms", "ITL p99"),
           ("e2e_p50_ms", "E2E p50"))
CHECKED = ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms")
START, END = "<!-- quant_table:start -->", "<!-- quant_table:end -->"
QUERY = """
SELECT r.run_id, r.variant, st.level::INTEGER AS users, s.requests, s.errors,
       {figures}, r.profile_text, r.verification->>'status' AS verify
FROM stage_summary s JOIN stages st USING (run_id, stage) JOIN runs r USING (run_id)
WHERE s.class_name = '(all)' ORDER BY r.run_id, users
"""


def read_runs(db: Path) -> list[dict]:
    """stage_summary rows of every run in ``db`` (copied first: fetched files are read-only and
    opening installs the views), or in a folder ``bench/capture_export.py`` wrote."""
    from servelab.analysis.views import open_results_db

    if db.is_dir():
        con = open_export(db)
        cur = con.execute(QUERY.format(figures=", ".join(f"s.{f}" for f, _ in FIGURES)))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / db.name
        shutil.copy(db, copy)
        con = open_results_db(copy)
        try:
            cur = con.execute(QUERY.format(figures=", ".join(f"s.{f}" for f, _ in FIGURES)))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]
        finally:
            con.close()


def serve_flags(cmd_txt: Path) -> list[str]:
    """The measured server's flags that shape its speed (``cmd.txt``: the shell-quoted line)."""
    words = shlex.split(cmd_txt.read_text())
    keep, out = ("--max-model-len", "--kv-cache-memory-bytes", "--quantization",
                 "--max-num-seqs", "--max-num-batched-tokens"), []
    for i, word in enumerate(words):
        if word in keep and i + 1 < len(words):
            out += [word, words[i + 1]]
    return out


def predict(variant: str, flags: list[str], profile_text: str, tmp: Path) -> list[dict]:
    """The same profile, the same flags, on the simulated H200 in virtual time."""
    spec = yaml.safe_load((REPO / "servers" / "variants" / f"{variant}.yaml").read_text())
    spec["serve_args"] = flags
    spec.pop("model_env", None)   # the HF id of the checkpoint the dummy folder stands for
    vfile, pfile = tmp / f"{variant}.yaml", tmp / f"{variant}_profile.yaml"
    db = tmp / f"{variant}.duckdb"
    vfile.write_text(yaml.safe_dump(spec))
    pfile.write_text(profile_text)
    subprocess.run([sys.executable, "-m", "servelab.cli", "predict", "--variant", str(vfile),
                    "--hardware", "H200", "--profile", str(pfile), "--db", str(db)],
                   check=True, capture_output=True, text=True)
    return read_runs(db)


def _fmt(value, ratio=False) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if ratio else (f"{value:,.0f}" if value >= 100 else f"{value:.1f}")


def build(results: Path, with_predict: bool) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in VARIANTS:
            folder = results / variant
            source = folder / "run.duckdb"
            if not source.is_file():   # kept in the repository: the exported phases run
                source = folder / f"phases_{variant}"
            if not source.exists():
                notes.append(f"{variant}: no {folder / 'run.duckdb'} or {source} (not measured)")
                continue
            measured = [r for r in read_runs(source) if r["variant"] == variant]
            if not measured:
                notes.append(f"{variant}: run.duckdb holds no run of variant {variant}")
                continue
            predicted = {}
            if with_predict:
                flags = serve_flags(folder / "cmd.txt") if (folder / "cmd.txt").is_file() else []
                predicted = {p["users"]: p for p in predict(variant, flags,
                                                            measured[0]["profile_text"], Path(tmp))}
                notes.append(f"{variant}: predicted with serve flags {' '.join(flags) or '(none)'}")
            for m in measured:
                row = {"variant": variant, "users": m["users"], "requests": m["requests"],
                       "errors": m["errors"], "verify": m["verify"]}
                row.update({f: m[f] for f, _ in FIGURES})
                p = predicted.get(m["users"])
                for f in CHECKED:
                    row[f"pred_{f}"] = p[f] if p else None
                    row[f"ratio_{f}"] = (p[f] / m[f]) if p and p[f] is not None and m[f] else None
                rows.append(row)
    return rows, notes


def markdown(rows: list[dict], notes: list[str]) -> str:
    head = ["variant", "users", "requests", *[label for _, label in FIGURES],
            "pred/meas tok/s", "pred/meas TTFT p50", "pred/meas TPOT p50", "pred/meas ITL p99",
            "verify"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["variant"], str(r["users"]), f"{r['requests']}"
                 + (f" ({r['errors']} err)" if r["errors"] else "")]
        cells += [_fmt(r[f]) for f, _ in FIGURES]
        cells += [_fmt(r[f"ratio_{f}"], ratio=True) for f in CHECKED]
        cells.append(r["verify"] or "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Latencies in ms, tok/s = output tokens per second in the stage's window; "
                 "pred/meas = `servelab predict` (virtual time, H200, the run's own profile and "
                 "flags) over the measured figure.")
    for users in sorted({r["users"] for r in rows}):
        at = [r for r in rows if r["users"] == users and r["output_tokens_per_s"]]
        if len(at) > 1:
            best = max(at, key=lambda r: r["output_tokens_per_s"])
            fast = min(at, key=lambda r: r["tpot_p50_ms"] or float("inf"))
            lines.append(f"- {users} users: most tokens/s {best['variant']}, lowest TPOT p50 "
                         f"{fast['variant']}")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def fill_readme(readme: Path, table: str) -> bool:
    if not readme.is_file():
        return False
    text = readme.read_text()
    if START not in text or END not in text:
        return False
    before, rest = text.split(START, 1)
    readme.write_text(before + START + "\n" + table + END + rest.split(END, 1)[1])
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="bench/h200_int4.sh's results folder")
    ap.add_argument("--out", type=Path, default=REPO / "servers" / "captured" / "quant_h200")
    ap.add_argument("--no-predict", action="store_true", help="the measured table only")
    args = ap.parse_args(argv)
    rows, notes = build(args.results, not args.no_predict)
    if not rows:
        print("no runs found: " + "; ".join(notes), file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = markdown(rows, notes)
    (args.out / "table.md").write_text(table)
    filled = fill_readme(args.out / "README.md", table)
    print(table + (f"(filled {args.out / 'README.md'})" if filled else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
