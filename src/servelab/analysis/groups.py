"""The groups a comparison sets side by side: the runs being compared, grouped by configuration
(variant, profile, hardware, model); runs of one configuration are repeats of one group."""
from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from servelab.core.errors import ServelabError

from .db import fetch_dicts


@dataclass
class Group:
    label: str
    run_ids: list[str]
    variant: str | None = None
    profile: str | None = None
    flags: list[str] = field(default_factory=list)  # union of its runs' run_overview.flags

    @property
    def header(self) -> str:
        """The label as a table column shows it: flagged groups carry their flags, so a number
        from an unverified or mismatched server is never read as a clean one."""
        return self.label + (f" [{', '.join(self.flags)}]" if self.flags else "")


def attach_flags(con: duckdb.DuckDBPyConnection, groups: list[Group]) -> None:
    """Each group's flags: every flag any of its runs carries (run_overview.flags), in first-seen order."""
    rows = {r["run_id"]: r["flags"] or [] for r in fetch_dicts(
        con, "SELECT run_id, flags FROM run_overview WHERE list_contains(?, run_id)",
        [[r for g in groups for r in g.run_ids]])}
    for g in groups:
        g.flags = list(dict.fromkeys(f for r in g.run_ids for f in rows.get(r, [])))


def _config_key(row: dict) -> tuple:
    return (row["variant"], row["profile_name"], row["hardware"], row["model"])


def groups_for_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> list[Group]:
    """Given runs, grouped by configuration: runs sharing variant, profile, hardware and model
    are repeats of one group."""
    rows = {r["run_id"]: r for r in fetch_dicts(
        con, "SELECT run_id, variant, profile_name, hardware, model FROM runs WHERE list_contains(?, run_id)", [run_ids])}
    by_key: dict[tuple, Group] = {}
    for run_id in run_ids:
        row = rows[run_id]
        key = _config_key(row)
        if key not in by_key:
            by_key[key] = Group(label="", run_ids=[], variant=row["variant"], profile=row["profile_name"])
        by_key[key].run_ids.append(run_id)
    groups = list(by_key.values())
    if len(groups) < 2 <= len(run_ids):
        # All given runs share one configuration: the user wants them compared one by one.
        groups = [Group(label="", run_ids=[r], variant=rows[r]["variant"], profile=rows[r]["profile_name"])
                  for r in run_ids]
    variants = [g.variant for g in groups]
    for g in groups:
        if g.variant and variants.count(g.variant) == 1:
            g.label = g.variant
        elif len(g.run_ids) == 1:
            g.label = g.run_ids[0] if not g.variant else f"{g.variant}@{g.run_ids[0]}"
        else:
            g.label = f"{g.variant or 'runs'}({','.join(r[:8] for r in g.run_ids)})"
    return groups


def groups_for_variants(con: duckdb.DuckDBPyConnection, variants: list[str], profile: str | None = None) -> list[Group]:
    """Completed runs of each variant on one profile: the given profile, else the most recently
    run profile that every variant has completed runs of."""
    runs = fetch_dicts(
        con,
        "SELECT run_id, variant, profile_name, started_unix FROM runs "
        "WHERE list_contains(?, variant) AND status = 'completed' ORDER BY started_unix",
        [variants],
    )
    missing = [v for v in variants if not any(r["variant"] == v for r in runs)]
    if missing:
        raise ServelabError(
            f"--variants: no completed run of {', '.join(missing)} in the database; "
            "`servelab runs` lists the variants that were run"
        )
    if profile is None:
        common = set.intersection(*({r["profile_name"] for r in runs if r["variant"] == v} for v in variants))
        if not common:
            raise ServelabError(
                "--variants: these variants were never run with the same traffic profile, so their stages "
                "do not correspond; run them on one profile, or pass the run ids to compare"
            )
        latest = {p: max(r["started_unix"] or 0 for r in runs if r["profile_name"] == p) for p in common}
        profile = max(latest, key=latest.get)
    groups = []
    for v in variants:
        ids = [r["run_id"] for r in runs if r["variant"] == v and r["profile_name"] == profile]
        if not ids:
            raise ServelabError(f"--variants: variant {v} has no completed run with profile {profile}")
        groups.append(Group(label=v, run_ids=ids, variant=v, profile=profile))
    return groups
