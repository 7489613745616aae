"""``servelab calibrate``: fit the simulator's cost model to a running server (argument parsing
only; ``orchestration.calibrate`` does the work)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="probe a running server and fit the simulator's cost coefficients",
        description="Sends probe traffic that isolates each term of the simulator's cost model "
        "(prefill against prompt length and batch tokens, decode against batch size and context, "
        "mixed steps, the fixed per-step cost, spec-decode acceptance), reads the server's own "
        "/metrics around each probe, fits the coefficients by least squares and writes "
        "servers/calibration/<hardware>-<model>-<variant>.yaml, which sim, predict and preflight "
        "then use for that configuration.")
    p.add_argument("--target", required=True, help="base URL of the running server, e.g. "
                   "http://127.0.0.1:8000 (started with the variant's flags)")
    p.add_argument("--variant", required=True, help="the servers/variants name or YAML file the "
                   "server runs")
    p.add_argument("--hardware", required=True, help="the GPU it runs on (servers/hardware/)")
    p.add_argument("--out", help="calibration file to write (default "
                   "servers/calibration/<hardware>-<model>-<variant>.yaml)")
    p.add_argument("--repeat", type=int, default=1, help="passes over the probe set (default 1)")
    p.add_argument("--output-tokens", type=int, default=32, help="output tokens of each decode "
                   "probe request (default 32)")
    p.set_defaults(func=run)


def run(args) -> int:
    from servelab.core.errors import ServelabError
    from servelab.orchestration.calibrate import calibrate
    from servelab.specs.hardware import load_hardware
    from servelab.specs.variants import load_variant

    if args.repeat < 1 or args.output_tokens < 2:
        raise ServelabError("--repeat must be at least 1 and --output-tokens at least 2")
    load_hardware(args.hardware)  # a bad name fails before any traffic
    variant = load_variant(args.variant)
    path = calibrate(variant, args.hardware, args.target, args.out, args.repeat,
                     args.output_tokens)
    print(f"wrote {path}")
    return 0
