"""``servelab demo``: the main job on the embedded simulator (what ``make demo`` runs)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on the embedded simulator")
    p.set_defaults(func=run)


def run(args) -> int:
    from servelab.commands.profiles import show_all_profiles

    return show_all_profiles()
