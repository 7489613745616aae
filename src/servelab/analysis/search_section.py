"""The report's section for a search run (``servelab search``, the plan mode ``search``): the
search path, level against SLO attainment with its Wilson interval per probe, in the order
probed, and the answer with its interval. Empty for any other run.

The probes and the answer are ``loadgen.search_reads.read_stored_search``'s: the rules the
master applied, replayed on the stored rows, so the page says what the command said.
"""
from __future__ import annotations

from pathlib import Path

from .report_html import esc, img, table


def search_section(con, run_id: str, label: str, out_dir: Path, index: int) -> str:
    """HTML for run ``run_id`` if it is a search, else ''."""
    from servelab.loadgen.search_reads import is_search_run, read_stored_search
    from servelab.loadgen.search_rules import STOPS

    if not is_search_run(con, run_id):
        return ""
    s = read_stored_search(con, run_id)
    a = s.answer
    rows = []
    for i, p in enumerate(s.probes, 1):
        iv = p.interval
        rows.append([i, p.stage, f"{p.level:g}", p.requests,
                     "-" if p.attainment is None else f"{p.attainment:.1%}",
                     "-" if iv is None else f"{iv[0]:.1%} - {iv[1]:.1%}", p.label()])
    path, facts = search_path_figure(s, Path(out_dir) / f"search_{index}.png")
    lv = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    limit = ("none: no level meets the target" if a.limit is None else
             f"{a.limit:g} {s.unit}, interval [{lv(a.low)}, {lv(a.high)}) {s.unit}")
    why = STOPS.get(a.stop, "the run ended before the search did")
    seed = (f"first probe at {s.seeded_at:g} {s.unit} (the prediction)" if s.seeded_at
            else "a bisection from the middle of the levels")
    return "\n".join([
        f"<h3>Search: {esc(label)}</h3>",
        f"<p><b>Limit</b> at {s.target:.0%} SLO attainment: {esc(limit)}; stopped: {esc(why)}. "
        f"{len(s.probes)} probes over {len(s.levels)} levels ({s.levels[0]:g} to "
        f"{s.levels[-1]:g} {esc(s.unit)}), {esc(seed)}; {s.requests:,} requests sent.</p>",
        img(path, f"search path of {label}: SLO attainment per probe against its level",
            f"{label}: each probe's SLO attainment (share of its measured requests meeting every "
            f"SLO of their class) with its 95% Wilson interval, numbered in the order probed; "
            f"the dashed line is the {s.target:.0%} target, the shaded band the limit's interval.",
            facts),
        table(["probe", "stage", "level", "requests", "attainment", "95% interval", "verdict"],
              rows, left={6}),
    ])


def search_path_figure(s, path: Path) -> tuple[Path, dict]:
    """Level (log2) against attainment, a Wilson error bar per probe, the target line."""
    from .plots import _load_axis, _save, plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    drawn = 0
    for i, p in enumerate(s.probes, 1):
        if p.attainment is None:
            continue
        lo, hi = p.interval
        colour = "#2e7d32" if p.verdict == "met" else "#c62828"
        err = [[max(0.0, p.attainment - lo)], [max(0.0, hi - p.attainment)]]  # float rounding
        ax.errorbar([p.level], [p.attainment], yerr=err,
                    fmt="o" if not p.cause else "x", color=colour, capsize=3)
        ax.annotate(str(i), (p.level, p.attainment), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
        drawn += 1
    ax.axhline(s.target, ls="--", color="#555", lw=1)
    a = s.answer
    if a.limit is not None:
        ax.axvspan(a.low or s.levels[0], a.high or s.levels[-1], color="#1565c0", alpha=0.08)
        ax.axvline(a.limit, color="#1565c0", lw=1)
    _load_axis(ax, {p.level for p in s.probes}, {s.over})
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("search path: x = missed because of the generator, the host or errors",
                 fontsize=9)
    return _save(fig, path), {"probes": len(s.probes), "drawn": drawn, "target": s.target,
                              "limit": "" if a.limit is None else a.limit}
