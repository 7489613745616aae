"""``servelab search``: the highest load that meets an SLO attainment target, found by probing
one level at a time (orchestration.search) instead of sweeping every level."""
from __future__ import annotations

import contextlib
import json
import sys

from servelab.loadgen.search_rules import (DEFAULT_MAX_ERROR_RATE, DEFAULT_RESOLUTION,
                                           DEFAULT_TARGET, STOPS)


def register(sub) -> None:
    from servelab.commands.run import add_run_flags

    p = sub.add_parser(
        "search", help="find the highest load that keeps a share of requests within their SLOs",
        description="Probe load levels one stage at a time (the profile's warm-up and hold, its "
        "classes' SLOs), bisecting between the last level that met the SLO attainment target and "
        "the first that missed, down to --resolution; every probe is a stage (kind 'search') of "
        "one run. With --variant and the hardware known (--hardware; without --target the "
        "simulator's), the first probe is at the limit `servelab predict` finds in virtual time. "
        "Exit 0: a limit found; 1: the run or the server ended the search early; 2: bad input; "
        "3: no level meets the target.")
    add_run_flags(p)
    for action in p._actions:
        if action.dest == "workers":
            # A verdict reads the generator's health: in one process the master's database work
            # shows as loop lag of the users' event loop, so the users get a process of their own.
            action.default = 1
            action.help = ("Locust worker processes, or 'auto' (default 1: the users apart from "
                           "the master, whose database work would show as generator lag; 0: "
                           "one process)")
    p.add_argument("--slo-attainment", type=float, default=DEFAULT_TARGET, metavar="SHARE",
                   help=f"share of requests that must meet every SLO of their class (default "
                   f"{DEFAULT_TARGET:g})")
    p.add_argument("--over", choices=["concurrency", "rate"], help="search users or requests/s "
                   "(default: the profile's plan)")
    p.add_argument("--min", type=float, dest="low", metavar="N", help="lowest level (default: "
                   "the profile's lowest)")
    p.add_argument("--max", type=float, dest="high", metavar="N", help="highest level (default: "
                   "the profile's highest)")
    p.add_argument("--resolution", type=float, default=DEFAULT_RESOLUTION, metavar="STEP",
                   help=f"neighbouring levels this far apart, as a share (default "
                   f"{DEFAULT_RESOLUTION:g}: 10%%); the search stops when the limit is bracketed "
                   "by neighbours")
    p.add_argument("--max-error-rate", type=float, default=DEFAULT_MAX_ERROR_RATE, metavar="R",
                   help="a probe whose failed requests pass this share misses, whatever its "
                   f"attainment (default {DEFAULT_MAX_ERROR_RATE:g})")
    p.add_argument("--warmup", type=float, metavar="S", help="seconds of warm-up per probe "
                   "(default: the profile's)")
    p.add_argument("--hold", type=float, metavar="S", help="seconds measured per probe "
                   "(default: the profile's hold or duration)")
    p.add_argument("--no-prediction", action="store_true", help="start with a bisection from "
                   "the middle of the range, not at the predicted limit")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text (default), or one JSON object on stdout for CI (the run's own "
                   "output goes to stderr)")
    p.set_defaults(func=run)


def run(args) -> int:
    from servelab.commands.run import run_options
    from servelab.orchestration.runner import RunOptions
    from servelab.orchestration.search import SearchOptions, search

    if args.variant:  # an unknown name is an error listing the known ones (exit 2)
        from servelab.specs.variants import load_variant

        load_variant(args.variant)
    if not 0.0 <= args.max_error_rate <= 1.0:
        print(f"servelab: --max-error-rate {args.max_error_rate:g}: give a share between 0 and "
              "1, e.g. 0.05", file=sys.stderr)
        return 2
    opt = SearchOptions(RunOptions(**run_options(vars(args))), args.over, args.slo_attainment,
                        args.low, args.high, args.resolution, args.max_error_rate,
                        not args.no_prediction, args.warmup, args.hold)
    quiet_stdout = contextlib.redirect_stdout(sys.stderr) if args.format == "json" \
        else contextlib.nullcontext()
    with quiet_stdout:
        outcome = search(opt)
    if args.format == "json":
        print(json.dumps(outcome.as_json(), indent=2))
    else:
        print(render(outcome))
    return outcome.exit_code()


def render(outcome) -> str:
    """The search path (level, attainment with its interval, verdict per probe) and the answer."""
    s, plan, a = outcome.stored, outcome.plan, outcome.answer
    unit = plan.unit
    lines = [f"search over {plan.over}: {len(plan.levels)} levels from {plan.levels[0]:g} to "
             f"{plan.levels[-1]:g} {unit}, target {s.target:.0%} of requests within their "
             f"SLOs; first probe: {outcome.seed_note}",
             f"{'probe':>5} {'stage':>5} {'level':>9} {'requests':>8} {'attainment':>10}  "
             f"{'95% interval':<15} verdict"]
    for i, p in enumerate(s.probes, 1):
        iv = p.interval
        att = "-" if p.attainment is None else f"{p.attainment:.1%}"
        ivs = "-" if iv is None else f"{iv[0]:.1%}-{iv[1]:.1%}"
        lines.append(f"{i:>5} {p.stage:>5} {p.level:>9g} {p.requests:>8} {att:>10}  {ivs:<15} "
                     f"{p.label()}")
    lines.append(_answer_line(a, unit, s))
    lines.append(f"stopped: {STOPS.get(a.stop, 'the run ended before the search did')}")
    lines.append(f"requests: {s.requests:,} sent by the search ({len(s.probes)} probes); run "
                 f"{s.run_id}")
    pred = outcome.prediction
    if pred is not None:
        off = pred.off_by(a.limit)
        how_far = "" if off is None else f", {off:+.0%} from the limit found"
        lines.append(f"prediction: {'none' if pred.limit is None else f'{pred.limit:g}'} {unit}"
                     f"{how_far} ({pred.cost_model}); in virtual time a bisection of these "
                     f"levels took {pred.bisection_probes} probes, the seeded search "
                     f"{pred.seeded_probes}; this search took {len(s.probes)}")
    if s.off_path:
        lines.append(f"note: stages {', '.join(map(str, s.off_path))} are not where the rules, "
                     "replayed on the stored rows, would have probed (a verdict changed after "
                     "its decision, e.g. rows stored late)")
    return "\n".join(lines)


def _answer_line(a, unit: str, s) -> str:
    def lv(v):
        return "-" if v is None else f"{v:g}"

    span = f"interval [{lv(a.low)}, {lv(a.high)}) {unit}"
    if a.stop == "none_meets":
        best = (f"; the best was {a.best.level:g} {unit} at {a.best.attainment:.1%}"
                if a.best else "")
        return f"limit: none: no level meets {s.target:.0%}{best}"
    if a.limit is None:
        return f"limit: not found ({span})"
    why = f"; the high end missed because {a.high_cause}" if a.high_cause else ""
    return f"limit: {a.limit:g} {unit} ({span}: each end a level decided at 95%{why})"
