"""``servelab profiles validate|show|sample``: check, describe and preview traffic profiles."""
from __future__ import annotations

import sys

SAMPLE_FIELDS = ["index", "stage", "class", "prompt_tokens", "output_tokens", "prefix_group",
                 "session", "turn", "think_time_s", "arrival_s"]


def register(sub) -> None:
    p = sub.add_parser("profiles", help="validate, describe and preview traffic profiles",
                       description="Traffic profiles (traffic_profiles/*.yaml) say what is sent "
                       "and how load is applied; see docs/profiles.md.")
    actions = p.add_subparsers(dest="profiles_action", metavar="ACTION")
    p.set_defaults(func=lambda args: _usage(p))

    v = actions.add_parser("validate", help="check profiles; exit 0 if all are valid, else 2")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.set_defaults(func=validate_cmd)

    s = actions.add_parser("show", help="per-class lengths and SLOs, the load plan's stages, the "
                           "total planned time and the expected request count")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--seed", type=int, help="override the profile's seed")
    s.set_defaults(func=show_cmd)

    m = actions.add_parser("sample", help="print the first N requests the generator would send")
    m.add_argument("file", metavar="FILE")
    m.add_argument("-n", "--count", type=int, default=20, metavar="N",
                   help="number of requests (default 20)")
    m.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    m.add_argument("--seed", type=int, help="override the profile's seed")
    m.add_argument("--workers", type=int, default=1, metavar="N",
                   help="split the sequence over N workers (request i goes to worker i %% N)")
    m.add_argument("--worker", type=int, default=0, metavar="I",
                   help="print worker I's share (0-based; with --workers)")
    m.set_defaults(func=sample_cmd)


def _usage(parser) -> int:
    parser.print_help()
    return 2


def validate_cmd(args) -> int:
    from servelab.profiles import ProfileError, load_profile

    bad = 0
    for name in args.files:
        try:
            profile = load_profile(name)
        except ProfileError as exc:
            bad += 1
            print(exc, file=sys.stderr)
            continue
        print(f"{name}: ok ({profile.name}: {len(profile.classes)} class(es), "
              f"{profile.load.kind} plan)")
    if bad:
        print(f"{bad} of {len(args.files)} profile(s) invalid", file=sys.stderr)
    return 2 if bad else 0


def show_cmd(args) -> int:
    from servelab.profiles import load_profile
    from servelab.profiles.summary import summarize

    print(summarize(load_profile(args.file), seed=args.seed))
    return 0


def show_all_profiles() -> int:
    """Print every shipped profile's summary (traffic_profiles/*.yaml); 2 if any is invalid."""
    from servelab.core.paths import profiles_dir
    from servelab.profiles import ProfileError, load_profile
    from servelab.profiles.summary import summarize

    files = sorted(profiles_dir().glob("*.yaml"))
    if not files:
        print(f"no profiles found in {profiles_dir()}", file=sys.stderr)
        return 2
    status = 0
    for i, path in enumerate(files):
        if i:
            print("\n" + "-" * 100 + "\n")
        try:
            print(summarize(load_profile(path)))
        except ProfileError as exc:
            print(exc, file=sys.stderr)
            status = 2
    return status


def sample_cmd(args) -> int:
    import csv
    import json

    from servelab.core.errors import ServelabError
    from servelab.profiles import load_profile
    from servelab.profiles.planner import RequestPlanner

    if args.count < 0:
        raise ServelabError("-n: found a negative count; allowed 0 or more")
    if args.workers < 1 or not 0 <= args.worker < args.workers:
        raise ServelabError(f"--worker {args.worker} --workers {args.workers}: allowed "
                            "--workers >= 1 and 0 <= --worker < --workers")
    planner = RequestPlanner(load_profile(args.file), args.seed)
    rows = []
    for stage, req in _first_requests(planner, args.worker, args.workers):
        if len(rows) >= args.count:
            break
        rows.append({"index": req.index, "stage": stage, "class": req.class_name,
                     "prompt_tokens": req.prompt_tokens, "output_tokens": req.output_tokens,
                     "prefix_group": req.prefix_group, "session": req.session_id,
                     "turn": req.turn, "think_time_s": round(req.think_time_s, 3),
                     "arrival_s": None if req.arrival_s is None else round(req.arrival_s, 6)})
    if args.format == "jsonl":
        for row in rows:
            print(json.dumps(row))
    else:
        writer = csv.DictWriter(sys.stdout, SAMPLE_FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return 0


def _first_requests(planner, worker: int, workers: int):
    """(stage, request) in sending order: open-loop stages one after another, else the sequence."""
    if planner.load_kind in ("rate", "trace"):
        for stage in planner.stages():
            for req in planner.iter_arrivals(stage.index, worker, workers):
                yield stage.index, req
    else:
        for req in planner.requests(worker, workers):
            yield None, req
