"""The ``servelab`` console script: a thin argparse front over the command modules."""
from __future__ import annotations

import argparse
import importlib
import sys

from servelab import __version__
from servelab.commands import call

# Order is the order shown by --help.
COMMAND_MODULES = [
    "servelab.commands.demo",
    "servelab.commands.profiles",
    "servelab.commands.servers",
    "servelab.commands.sim",
    "servelab.commands.run",
    "servelab.commands.search",
    "servelab.commands.analysis",
    "servelab.commands.telemetry",
    "servelab.commands.calibrate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servelab",
        description="Measure LLM serving: traffic profiles, a simulated vLLM server, Locust load "
        "tests recorded in DuckDB, and comparisons of server variants.",
    )
    parser.add_argument("--version", action="version", version=f"servelab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error("unrecognized arguments: " + " ".join(extra))
    if getattr(args, "accepts_extra", False):
        args.extra = extra
    return call(args)


if __name__ == "__main__":
    sys.exit(main())
