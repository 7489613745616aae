"""The answer's figure: output tokens/s against load, one panel per path (predicted first, each
titled measured or predicted), one line per variant in the same colour in every panel, the
crossover shaded between the two loads where the leader changes, and each variant's first load
that misses the SLO target ringed. Drawn from the rows answer.py read; nothing here queries."""
from __future__ import annotations

from pathlib import Path

from .answer import THROUGHPUT, Answer
from .plots import _empty, _finite, _load_axis, _save, plt


def _colours(answer: Answer) -> dict[str, str]:
    names: list[str] = []
    for path in answer.paths:
        names += [label for label in path.rows if label not in names]
    return {label: f"C{i % 10}" for i, label in enumerate(names)}


def _panel(ax, path, colours: dict[str, str]) -> dict:
    levels = set()
    misses = 0
    for label, rows in path.rows.items():
        pts = [(r["level"], r[THROUGHPUT]) for r in rows if _finite(r["level"]) and _finite(r[THROUGHPUT])]
        if not pts:
            continue
        levels |= {x for x, _ in pts}
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=colours[label], label=label)
        fail = next((f.row.first_failing for f in path.frontier if f.row.label == label), None)
        at = [y for x, y in pts if x == fail]
        if at:
            misses += 1
            ax.plot([fail], [min(at)], marker="o", markersize=13, markerfacecolor="none",
                    markeredgecolor="red", linestyle="none")
    for c in path.crossovers():
        ax.axvspan(c.before.level, c.after.level, color="#f2c94c", alpha=0.25)
        ax.annotate(f"{c.now} passes\n{c.was}", (c.after.level, 0.04), xycoords=("data", "axes fraction"),
                    ha="right", fontsize=7)
    kinds = {r["kind"] for rows in path.rows.values() for r in rows if r.get("kind")}
    scale = _load_axis(ax, levels, kinds)
    if not levels:
        _empty(ax, "no stage has a load level with requests")
    where = f" on {path.hardware}" if path.hardware else ""
    how = "virtual time, no server" if path.kind == "predicted" else "requests sent and timed"
    ax.set_title(f"{path.kind.upper()} ({how}): {path.profile}{where}", fontsize=9)
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="upper left", fontsize=7)
    return {"xscale": scale, "series": len(path.rows), "misses": misses, "crossovers": len(path.crossovers())}


def crossover_figure(answer: Answer, path: Path) -> tuple[Path, dict]:
    """One PNG; facts: panels, their kinds, crossovers shaded and missed loads ringed."""
    n = max(1, len(answer.paths))
    fig, axes = plt.subplots(1, n, figsize=(6.2 * n, 4), squeeze=False)
    facts = {"panels": n, "kinds": ",".join(p.kind for p in answer.paths), "crossovers": 0, "misses": 0}
    colours = _colours(answer)
    for ax, p in zip(axes[0], answer.paths):
        got = _panel(ax, p, colours)
        facts["crossovers"] += got["crossovers"]
        facts["misses"] += got["misses"]
    if not answer.paths:
        _empty(axes[0][0], "no runs")
    fig.suptitle("Which variant leads output tokens/s at which load (shaded: the crossover; "
                 "ringed: the first load missing the SLO target)", fontsize=9)
    return _save(fig, path), facts


__all__ = ["crossover_figure"]
