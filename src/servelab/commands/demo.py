"""``servelab demo``: the main job end to end, on both of servelab's paths (what ``make demo`` runs).

1. Describe every shipped traffic profile (what it sends, its load plan, planned time).
2. MEASURED: a BF16 / FP8 / GPTQ-Int4 matrix on ``traffic_profiles/demo_measured.yaml`` against
   simulated vLLM processes on an L40S (one ``servelab sim`` child per variant, started and stopped
   by the matrix's ``sim`` back-end; Locust sending every request; each one recorded in DuckDB),
   greedy-output fidelity against BF16, the matrix table and the comparison.
3. PREDICTED: the same variants on the write-up's sweep (``quant_sweep.yaml``, 1-300 users) in
   virtual time (the matrix's ``predict`` back-end), stored as runs flagged ``predicted``.
4. The answer, computed from the stored rows of both (analysis/answer.py): who leads throughput and
   latency at which load, the crossover, each variant's SLO frontier and the load that misses it,
   every line saying measured or predicted; the report opens with it and its figure.
"""
from __future__ import annotations

import time


def register(sub) -> None:
    p = sub.add_parser("demo", help="measure a BF16/FP8/GPTQ-Int4 matrix on simulator processes, predict the "
                       "write-up's 1-300 user sweep, and answer which precision wins at which load")
    p.add_argument("--db", metavar="PATH",
                   help="DuckDB file the demo adds its runs to (default: OUT/servelab.duckdb, started "
                   "afresh each run, the last run's kept as OUT/previous.duckdb)")
    p.add_argument("--out", default="results/demo", metavar="DIR",
                   help="where the report and the matrix tables go (default %(default)s)")
    p.add_argument("--hardware", default="L40S", help="simulated GPU (default %(default)s)")
    p.add_argument("--variants", default="bf16,fp8,gptq_int4",
                   help="variants to compare, the first is the baseline (default %(default)s)")
    p.add_argument("--measured-profile", default="demo_measured.yaml", metavar="FILE",
                   help="profile of the measured path (a name under traffic_profiles/ or a path; "
                   "default %(default)s)")
    p.add_argument("--predicted-profile", default="quant_sweep.yaml", metavar="FILE",
                   help="profile of the predicted path (default %(default)s: the write-up's sweep)")
    p.add_argument("--fidelity", default="fidelity/prompts.jsonl", metavar="PROMPTS",
                   help="prompt set for greedy-output fidelity against the baseline ('' for none; "
                   "default %(default)s)")
    p.add_argument("--skip-profiles", action="store_true", help="do not print the profiles")
    p.set_defaults(func=run)


def _banner(text: str) -> None:
    print("\n" + "=" * 100 + f"\n{text}\n" + "=" * 100, flush=True)


def _profile(name: str) -> str:
    from pathlib import Path

    from servelab.core.paths import profiles_dir

    return name if Path(name).is_file() else str(profiles_dir() / name)


def _options(args):
    from pathlib import Path

    from servelab.commands.servers import variant_list
    from servelab.core.paths import project_root
    from servelab.orchestration.demo_paths import DemoOptions

    fid = args.fidelity or None
    if fid and not Path(fid).is_file() and (project_root() / fid).is_file():
        fid = str(project_root() / fid)
    variants = variant_list(args.variants)
    db = Path(args.db) if args.db else _fresh_db(Path(args.out) / "servelab.duckdb")
    return DemoOptions(variants, args.hardware, db, Path(args.out),
                       _profile(args.measured_profile), _profile(args.predicted_profile), fid)


def _fresh_db(path):
    """The demo's own file starts empty, the last one renamed beside it: every view read scans
    the whole file, so demo after demo in one file would each take longer than the last."""
    if not path.exists():
        return path
    previous = path.with_name("previous.duckdb")
    for suffix in ("", ".wal"):  # an older WAL must not be replayed onto the newer file
        previous.with_name(previous.name + suffix).unlink(missing_ok=True)
    for suffix in ("", ".wal"):
        old = path.with_name(path.name + suffix)
        if old.exists():
            old.replace(previous.with_name(previous.name + suffix))
    return path


def run(args) -> int:
    from servelab.commands.profiles import show_all_profiles
    from servelab.orchestration import demo_paths

    started = time.monotonic()
    opt = _options(args)
    db = opt.db
    if not args.skip_profiles:
        _banner("1/4  the shipped traffic profiles (servelab profiles show FILE)")
        status = show_all_profiles()
        if status:
            return status
    _banner(f"2/4  MEASURED: {args.variants} on simulated {args.hardware} processes, requests sent by Locust "
            f"and stored in {db}\n     (servelab matrix --backend sim --profile {args.measured_profile}, "
            "then greedy-output fidelity)")
    measured, m_status = demo_paths.measured(opt)
    _banner(f"3/4  PREDICTED: the same variants on the write-up's sweep in virtual time, no server\n"
            f"     (servelab matrix --backend predict --profile {args.predicted_profile})")
    predicted, p_status = demo_paths.predicted(opt)
    text, report = demo_paths.answer(opt, measured.run_ids, predicted.run_ids)
    _banner("4/4  THE ANSWER: which precision wins at which load, computed from the stored rows of both "
            f"paths\n     (stage_summary, slo_frontier_at and compare's winners, read from {db})")
    print(text)
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s"
          + (f"; the report opens with this answer: {report}" if report else ""), flush=True)
    if predicted.run_ids:
        print(f"the predicted sweep's own report: .venv/bin/servelab report {' '.join(predicted.run_ids)} "
              f"--db {db} --out {opt.out / 'predicted'}")
    print(f".venv/bin/duckdb {db} -c 'SELECT * FROM slo_frontier_at(0.95)'", flush=True)
    return m_status or p_status
