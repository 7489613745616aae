"""Server variants and everything around them: ``variants``, ``compose``, ``preflight``, ``verify``,
``predict``, ``matrix`` and ``fidelity``. Handlers import their modules late (see commands/)."""
from __future__ import annotations

import sys

from servelab.core.timeouts import SERVER_STARTUP_S


def register(sub) -> None:
    p = sub.add_parser("variants", help="list the server variants (servers/variants/*.yaml)")
    p.add_argument("name", nargs="?", help="show one variant in full (name or YAML path)")
    p.set_defaults(func=variants_cmd)

    p = sub.add_parser("compose", help="generate or check docker-compose.yml from the variants")
    p.add_argument("action", choices=["generate", "check"],
                   help="generate: write docker-compose.yml and docker/nginx/*.conf; "
                        "check: exit 1 if the files on disk differ from what would be generated")
    p.set_defaults(func=compose_cmd)

    _add_preflight(sub)
    _add_verify(sub)
    _add_predict(sub)
    _add_matrix(sub)
    _add_fidelity(sub)


def _add_preflight(sub) -> None:
    p = sub.add_parser("preflight", help="check a variant against the GPUs before measuring")
    p.add_argument("variant", help="variant name or YAML path")
    p.add_argument("--gpus", metavar="FILE", help="saved output of `nvidia-smi --query-gpu=index,"
                   "name,compute_cap,memory.total,memory.used --format=csv` (default: run it)")
    p.add_argument("--topology", metavar="FILE", help="saved `nvidia-smi topo -m` output "
                   "(default: run it when --gpus is not given)")
    p.add_argument("--hardware", metavar="NAME", help="servers/hardware name instead of real GPUs")
    p.add_argument("--count", type=int, help="with --hardware: how many such GPUs (default: as "
                   "many as the variant needs)")
    p.add_argument("--profile", metavar="FILE", help="traffic profile whose lengths set the "
                   "concurrency estimate")
    p.add_argument("--url", metavar="URL", help="the variant is already served there (on these "
                   "GPUs): read what it uses from its /metrics instead of refusing for the "
                   "memory it holds")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.set_defaults(func=preflight_cmd)


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="check what a started server really runs against its variant")
    p.add_argument("variant", help="variant name or YAML path")
    p.add_argument("--log", metavar="FILE", help="the server's start-up log")
    p.add_argument("--url", metavar="URL", help="a running server: reads its /metrics")
    p.add_argument("--metrics", metavar="FILE", help="a saved /metrics page (with --log)")
    p.add_argument("--gpus", metavar="FILE", help="saved nvidia-smi CSV of the server's GPUs")
    p.add_argument("--db", metavar="PATH", help="record the verdict on a run in this database")
    p.add_argument("--run", metavar="RUN_ID", help="the run to record the verdict on")
    p.set_defaults(func=verify_cmd)


def _add_predict(sub) -> None:
    p = sub.add_parser("predict", help="run a profile through the simulator's engine in virtual "
                       "time and store it as a run flagged 'predicted'")
    p.add_argument("--variant", required=True, help="variant name or YAML path")
    p.add_argument("--hardware", required=True, metavar="NAME", help="GPU from servers/hardware")
    p.add_argument("--profile", required=True, metavar="FILE", help="traffic profile")
    p.add_argument("--db", metavar="PATH", help="DuckDB file (default results/servelab.duckdb)")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("--tag", action="append", default=[], metavar="K=V", help="tag the run")
    p.set_defaults(func=predict_cmd)


def _add_matrix(sub) -> None:
    p = sub.add_parser("matrix", help="run a traffic profile on several variants in turn and "
                       "compare them (speed, verification, fidelity)")
    p.add_argument("--variants", required=True, help="comma-separated variants, the first is "
                   "the baseline (e.g. bf16,fp8,gptq_int4)")
    p.add_argument("--profile", required=True, metavar="FILE", help="traffic profile")
    _backend_args(p, with_predict=True)
    p.add_argument("--repeat", type=int, default=1, metavar="K",
                   help="measure each variant K times (noise bands in comparisons)")
    p.add_argument("--db", metavar="PATH", help="DuckDB file (default results/servelab.duckdb)")
    p.add_argument("--out", metavar="DIR", help="report folder (default reports/MATRIX_ID)")
    p.add_argument("--gpus", metavar="FILE", help="saved nvidia-smi CSV for preflight "
                   "(local/compose/external; default: run nvidia-smi for local and compose)")
    p.add_argument("--topology", metavar="FILE", help="saved `nvidia-smi topo -m` for preflight")
    p.add_argument("--seed", type=int, help="override the profile's seed")
    p.add_argument("--force", action="store_true", help="run variants that preflight refuses "
                   "(their verification then shows what really ran)")
    p.add_argument("--fidelity", nargs="?", const="fidelity/prompts.jsonl", metavar="PROMPTS",
                   help="also compare greedy outputs against the first variant (default prompt "
                   "set fidelity/prompts.jsonl)")
    p.add_argument("--no-report", action="store_true", help="print the comparison, skip "
                   "report.html and its figures")
    p.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                   help="extra flag for `servelab run`, repeatable (e.g. --run-arg=--workers=2)")
    p.set_defaults(func=matrix_cmd)


def _add_fidelity(sub) -> None:
    p = sub.add_parser("fidelity", help="compare greedy outputs of variants against a baseline")
    p.add_argument("--baseline", required=True, help="baseline variant (e.g. bf16)")
    p.add_argument("--candidates", required=True, help="comma-separated variants to compare")
    p.add_argument("--prompts", metavar="FILE", help="JSONL prompt set (default "
                   "fidelity/prompts.jsonl)")
    _backend_args(p, with_predict=False)
    p.add_argument("--seed", type=int, default=0, help="sampling seed sent with every request")
    p.add_argument("--parallel", type=int, default=8, help="requests in flight per server")
    p.add_argument("--db", metavar="PATH", help="DuckDB file (default results/servelab.duckdb)")
    p.set_defaults(func=fidelity_cmd)


def _backend_args(p, with_predict: bool) -> None:
    choices = ["sim", "predict", "local", "compose", "external"] if with_predict else \
        ["sim", "local", "compose", "external"]
    p.add_argument("--backend", choices=choices, default="sim",
                   help="sim: a simulator process per variant; local: `vllm serve`; compose: "
                   "docker compose --profile X; external: --url" + (
                       "; predict: the simulator's engine in virtual time" if with_predict else ""))
    p.add_argument("--hardware", metavar="NAME", default="L40S",
                   help="simulated GPU (servers/hardware) for sim/predict (default L40S)")
    p.add_argument("--url", metavar="URL", help="--backend external: the running server")
    p.add_argument("--startup-timeout", type=float, default=SERVER_STARTUP_S, metavar="S",
                   help=f"seconds to wait for /health (default {SERVER_STARTUP_S:g}: downloads "
                   "and compilation)")
    p.add_argument("--logs", metavar="DIR", help="where server logs go (default results/logs)")


def variants_cmd(args) -> int:
    from servelab.specs.variants import list_variants, load_variant

    if args.name:
        v = load_variant(args.name)
        print(f"{v.name}: {v.description}")
        print(f"  file       {v.path}")
        env = f" (override with ${v.model_env})" if v.model_env else ""
        print(f"  model      {v.model}{env}")
        print(f"  serve      {' '.join(v.kind.command)} {' '.join(_quote(a) for a in v.server_args())}")
        print(f"  gpus       {v.gpus} ({v.instances} instance(s), TP {v.tensor_parallel_size}, "
              f"DP {v.data_parallel_size})")
        c = v.claims
        print(f"  claims     weights {c.weights}, activations {c.activations}, compute capability "
              f">= {c.min_compute_capability}, speculative {c.speculative}")
        if v.notes:
            print("  notes\n" + "\n".join("    " + line for line in v.notes.splitlines()))
        return 0
    for name in list_variants():
        v = load_variant(name)
        first = v.description.split(". ")[0].split(": ")[0]
        first = first if len(first) <= 72 else first[:71] + "…"
        print(f"{v.name:<14} {v.gpus} GPU  {v.claims.weights + '/' + v.claims.activations:<10} "
              f"{first}")
    return 0


def compose_cmd(args) -> int:
    from servelab.orchestration import compose

    if args.action == "generate":
        written = compose.generate()
        for path in written:
            print(f"wrote {path}")
        if not written:
            print("docker-compose.yml and docker/nginx/ are up to date")
        return 0
    problems = compose.check()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print("servelab compose check: the files above drifted from servers/variants/; run "
              "`servelab compose generate`", file=sys.stderr)
        return 1
    print("docker-compose.yml matches servers/variants/")
    return 0


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def preflight_cmd(args) -> int:
    from servelab.orchestration.preflight_sources import preflight_report
    from servelab.specs.variants import load_variant

    variant = load_variant(args.variant)
    report = preflight_report(variant, gpus_file=args.gpus, topology_file=args.topology,
                              hardware=args.hardware, count=args.count, profile=args.profile,
                              url=args.url)
    print(report.render())
    if report.refused:
        return 1
    return 1 if (args.strict and report.warned) else 0


def verify_cmd(args) -> int:
    from servelab.orchestration import verify as vf
    from servelab.orchestration.gpus import read_gpus
    from servelab.specs.variants import load_variant

    if not (args.log or args.url or args.metrics):
        from servelab.core.errors import ServelabError
        raise ServelabError("give the server's start-up log (--log FILE), a running server "
                            "(--url URL) or a saved /metrics page (--metrics FILE)")
    variant = load_variant(args.variant)
    if args.run and not args.db:
        from servelab.core.paths import default_db
        args.db = str(default_db())
    gpus = read_gpus(args.gpus) if args.gpus else None
    expected = None
    if gpus:
        from servelab.orchestration.preflight_sources import preflight_report

        report = preflight_report(variant, gpus_file=args.gpus)
        expected = report.kv_tokens
    verdict = vf.verify(variant, log_path=args.log, url=args.url, metrics_path=args.metrics,
                        gpus=gpus, expected_kv_tokens=expected)
    print(verdict.summary())
    if args.run:
        vf.record(args.db, args.run, verdict)
        flags = ", ".join(verdict.flags) or "none"
        print(f"recorded on run {args.run} in {args.db} (flags: {flags})")
    return 0 if verdict.status == "verified" else 1


def variant_list(text: str) -> list:
    from servelab.core.errors import ServelabError
    from servelab.specs.variants import load_variant

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ServelabError("name at least one variant, e.g. --variants bf16,fp8")
    if len(set(names)) != len(names):
        raise ServelabError(f"a variant is named twice in {text!r}")
    return [load_variant(n) for n in names]


def fidelity_cmd(args) -> int:
    from pathlib import Path

    from servelab.core.errors import ServelabError
    from servelab.core.paths import default_db
    from servelab.orchestration import fidelity

    baseline = variant_list(args.baseline)
    if len(baseline) != 1:
        raise ServelabError("--baseline takes one variant")
    variants = baseline + variant_list(args.candidates)
    prompts = fidelity.load_prompts(args.prompts)
    db = Path(args.db) if args.db else default_db()
    logs = Path(args.logs) if args.logs else db.parent / "logs"
    outputs = fidelity.collect_from_variants(
        args.backend, variants, prompts, logs, hardware=args.hardware, url=args.url,
        startup_timeout_s=args.startup_timeout, seed=args.seed, parallel=args.parallel)
    base = variants[0].name
    fid, summaries = fidelity.compare_and_record(
        db, prompts, outputs, base, backend=args.backend,
        hardware=args.hardware if args.backend == "sim" else None,
        prompt_set=str(args.prompts or fidelity.DEFAULT_PROMPTS), seed=args.seed)
    print(fidelity.render_summary(base, summaries))
    print(f"stored as {fid} in {db} (table fidelity)")
    return 0


def predict_cmd(args) -> int:
    from servelab.core.paths import default_db
    from servelab.loadgen.options import parse_tags
    from servelab.orchestration.predict import predict, render
    from servelab.specs.variants import load_variant

    variant = load_variant(args.variant)
    db = args.db or str(default_db())
    result = predict(variant, args.hardware, args.profile, db, seed=args.seed,
                     tags=parse_tags(args.tag))
    print(render(result, variant, args.hardware, db))
    return 0


def matrix_cmd(args) -> int:
    from pathlib import Path

    from servelab.commands.run import run_arg_fields
    from servelab.core.paths import default_db, project_root
    from servelab.orchestration import matrix

    variants = variant_list(args.variants)
    run_fields = run_arg_fields(args.run_arg)
    db = Path(args.db) if args.db else default_db()
    fid = args.fidelity
    if fid and not Path(fid).is_file() and (project_root() / fid).is_file():
        fid = str(project_root() / fid)
    opt = matrix.MatrixOptions(
        profile=args.profile, backend=args.backend, hardware=args.hardware, repeat=args.repeat,
        db=db, url=args.url, gpus_file=args.gpus, topology_file=args.topology, seed=args.seed,
        startup_timeout_s=args.startup_timeout, force=args.force, fidelity_prompts=fid,
        run_fields=run_fields, logs=Path(args.logs) if args.logs else None)
    result = matrix.run_matrix(variants, opt)
    return matrix.finish(result, db, args.out, report=not args.no_report)
