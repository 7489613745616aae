"""``servelab demo``: the main job end to end on simulated vLLM servers (what ``make demo`` runs).

1. Describe every shipped traffic profile (what it sends, its load plan, planned time).
2. Run a BF16 / FP8 / GPTQ-Int4 matrix with ``traffic_profiles/smoke.yaml`` against the simulated
   vLLM on an L40S (one ``servelab sim`` child process per variant, started and stopped by the
   matrix's ``sim`` back-end; Locust replaying the profile in its own processes; every
   request recorded in DuckDB), check output fidelity against BF16, print the comparison and write
   the report.
"""
from __future__ import annotations

import time


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on simulator processes (one per variant)")
    p.add_argument("--db", default="results/servelab.duckdb", metavar="PATH",
                   help="DuckDB file the demo records into (default %(default)s)")
    p.add_argument("--out", default="results/demo", metavar="DIR",
                   help="where the matrix report goes (default %(default)s)")
    p.add_argument("--hardware", default="L40S", help="simulated GPU (default %(default)s)")
    p.add_argument("--variants", default="bf16,fp8,gptq_int4",
                   help="variants to compare, the first is the baseline (default %(default)s)")
    p.add_argument("--skip-profiles", action="store_true", help="do not print the profiles")
    p.set_defaults(func=run)


def _banner(text: str) -> None:
    print("\n" + "=" * 100 + f"\n{text}\n" + "=" * 100, flush=True)


def run(args) -> int:
    from servelab.commands.profiles import show_all_profiles
    from servelab.core.paths import profiles_dir

    if not args.skip_profiles:
        _banner("1/2  the shipped traffic profiles (servelab profiles show FILE)")
        status = show_all_profiles()
        if status:
            return status
    _banner(f"2/2  matrix {args.variants} on a simulated {args.hardware}, profile smoke.yaml "
            "(servelab matrix --backend sim)")
    started = time.monotonic()
    status = _servelab(["matrix", "--variants", args.variants,
                        "--profile", str(profiles_dir() / "smoke.yaml"),
                        "--backend", "sim", "--hardware", args.hardware,
                        "--db", args.db, "--out", args.out, "--fidelity"])
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s; explore the results with:\n"
          f"  .venv/bin/servelab runs --db {args.db}\n"
          f"  .venv/bin/servelab summary latest --db {args.db}\n"
          f"  .venv/bin/duckdb {args.db} -c 'SELECT * FROM stage_summary'\n"
          f"  open {args.out}/report.html")
    return status


def _servelab(argv: list[str]) -> int:
    """``servelab matrix ...`` as typed, parsed by the matrix command's own parser."""
    import argparse

    from servelab.commands import call, servers

    parser = argparse.ArgumentParser(prog="servelab")
    servers.register(parser.add_subparsers(dest="command"))
    return call(parser.parse_args(argv))
