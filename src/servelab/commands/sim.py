"""``servelab sim``: the simulated vLLM server (OpenAI API, vLLM's metrics, no GPU).

Any flag ``servelab sim`` does not know is handed to the vLLM serve-args parser, so a variant's
``vllm serve`` flags work unchanged: ``servelab sim --model Qwen/Qwen3-14B-AWQ --max-num-seqs 64``.
"""
from __future__ import annotations

import sys

EPILOG = """\
vLLM serve flags (passed through): --quantization, --speculative-config, --tensor-parallel-size,
--data-parallel-size, --max-num-seqs, --max-num-batched-tokens, --gpu-memory-utilization,
--max-model-len, --[no-]enable-prefix-caching, --served-model-name, --kv-cache-dtype, ...

--faults grammar: KIND=RATE[,KIND=RATE...], RATE a probability per request; kinds http429,
http500, http503, stall=RATE:DURATION (e.g. stall=0.02:2.5s), cut, malformed, error_event.
Example: --faults "http429=0.05,http500=0.02,stall=0.02:2.5s,cut=0.03,malformed=0.02"
"""


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "sim", help="serve a simulated vLLM (OpenAI API, vLLM metrics) on a chosen GPU and model",
        description="A step-level simulation of vLLM's engine behind vLLM's OpenAI-compatible "
        "API, in real time. Unknown flags are vLLM serve flags.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--hardware", help="GPU name from servers/hardware/ (default L40S)")
    p.add_argument("--model", help="Hugging Face id from servers/models/, or a local model "
                   "folder with its config.json, served under that path as vLLM does "
                   "(default Qwen/Qwen2.5-7B-Instruct)")
    p.add_argument("--variant", help="a servers/variants name or YAML file: its model, serve "
                   "args and instance count (flags given here are applied after it, spelled as "
                   "its server kind spells them); an SGLang variant is served in SGLang's "
                   "dialect (log, sglang:* /metrics) with SGLang's scheduling")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--seed", type=int, default=0, help="engine randomness, faults, sampling")
    p.add_argument("--faults", help="fault injection spec (see below)")
    p.add_argument("--instances", type=int, help="independent engines behind the server's "
                   "least-outstanding-requests balancing (default 1, or the variant's)")
    p.add_argument("--output-divergence", type=float, metavar="P",
                   help="probability per output token that the text departs from the BF16 "
                   "baseline (default by precision: bf16 0, fp8 0.002, int4 0.005)")
    p.add_argument("--ready-file", help="write the server's URL to this file once listening")
    p.add_argument("--api-key", nargs="+", action="extend", default=[], metavar="KEY",
                   help="as vLLM: require 'Authorization: Bearer KEY' (any of the keys) on "
                   "/v1, /v2, /inference and /cohere routes, else 401 (default: $VLLM_API_KEY; "
                   "prefer the variable: a command line is visible to every local user)")
    p.add_argument("--timer-guard-ms", type=float, default=1.0, metavar="MS",
                   help="wake this long before each step's end and yield until it passes: "
                   "sub-millisecond delivery for a little CPU (0: plain timers, ~1 ms jitter)")
    p.add_argument("--log-stats-interval", type=float, default=5.0, metavar="S",
                   help="seconds between vLLM-style engine stats lines (0: off)")
    p.add_argument("--enable-logging-iteration-details", action="store_true",
                   help="as vLLM: one 'Iteration(N): ...' line per engine step in the log")
    p.add_argument("--vllm-version", metavar="X.Y.Z",
                   help="the vLLM release whose start-up lines and /metrics names the simulator "
                   "imitates (default: the newest read, see specs/server_kinds/vllm/versions.py)")
    p.set_defaults(func=run, accepts_extra=True)


def run(args) -> int:
    from servelab.sim.server.faults import parse_faults
    from servelab.sim.server.serve import ServeOptions, serve
    from servelab.sim.server.server import resolve_config

    if args.instances is not None and args.instances < 1:
        print("servelab sim: --instances: must be at least 1", file=sys.stderr)
        return 2
    parse_faults(args.faults)  # a bad spec fails before anything starts
    config, instances, salt = resolve_config(args.hardware, args.model, args.extra,
                                             variant=args.variant, instances=args.instances)
    return serve(config, instances, salt, ServeOptions(
        host=args.host, port=args.port, seed=args.seed, faults=args.faults,
        output_divergence=args.output_divergence, timer_guard_ms=args.timer_guard_ms,
        log_stats_interval=args.log_stats_interval, ready_file=args.ready_file,
        api_keys=tuple(args.api_key),
        iteration_details=args.enable_logging_iteration_details,
        vllm_version=args.vllm_version))


def main(argv: list[str] | None = None) -> int:
    """``python -m servelab.commands.sim ...``: the same command without loading the whole CLI
    (what a parent process such as the load generator spawns)."""
    import argparse

    from servelab.commands import call

    parser = argparse.ArgumentParser(prog="servelab")
    register(parser.add_subparsers(dest="command"))
    args, extra = parser.parse_known_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    args.extra = extra
    return call(args)

if __name__ == "__main__":
    sys.exit(main())
