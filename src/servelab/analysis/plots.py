"""The report's load-sweep and distribution figures (matplotlib, Agg backend), each drawn from
rows the report fetched once from the SQL views (report_data.py); nothing here queries.

Every function writes one PNG and returns (path, facts): facts are read back from the drawn axes
(scale, series per panel, the SLO line), so the page and its tests state what the figure shows,
not what it was asked to show. A panel with nothing to draw says why inside the figure.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import (FixedLocator, LogLocator, NullFormatter, NullLocator,  # noqa: E402
                               ScalarFormatter)

DPI = 110
NO_LEVELS = "no stage has a load level with requests"


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _save(fig, path: Path, tight: bool = True) -> Path:
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _empty(ax, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True,
            color="#5b6477")


def _frame(ax, title: str, ylabel: str, xlabel: str | None = None, empty: str | None = None) -> None:
    """One panel's title, axis labels and grid; ``empty`` says why the panel has nothing to show."""
    if empty is not None:
        _empty(ax, empty)
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)


def _load_axis(ax, levels: set[float], kinds: set[str]) -> str:
    """Load on a log2 axis (sweeps double: 1, 2, 4, ... 300), ticked at the levels run; a linear
    axis when a level is 0 or negative (log cannot show it). Returns the scale used."""
    ax.set_xlabel(_load_label(kinds))
    positive = sorted(v for v in levels if v > 0)
    if not positive or len(positive) < len(levels):
        return ax.get_xscale()
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(positive))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in positive], fontsize=7)
    return "log2"


def _load_label(kinds: set[str]) -> str:
    if kinds <= {"concurrency"}:
        return "concurrency (users)"
    if kinds <= {"rate", "trace"}:
        return "offered rate (requests/s)"
    return "load level (users or requests/s)"


def _series(rows: list[dict], key: str):
    pts = sorted((r["level"], r[key]) for r in rows if _finite(r["level"]) and _finite(r.get(key)))
    return [p[0] for p in pts], [p[1] for p in pts]


def _levels_kinds(series: dict[str, list[dict]]) -> tuple[set[float], set[str]]:
    levels = {r["level"] for rows in series.values() for r in rows if _finite(r["level"])}
    return levels, {r["kind"] for rows in series.values() for r in rows if r.get("kind")}


def throughput_vs_load(series: dict[str, list[dict]], path: Path) -> tuple[Path, dict]:
    """series: label -> stage_summary '(all)' rows of one run. Goodput on a second axis."""
    fig, ax = plt.subplots(figsize=(7, 4))
    good = ax.twinx()
    levels, kinds = _levels_kinds(series)
    for i, (label, rows) in enumerate(series.items()):
        x, y = _series(rows, "output_tokens_per_s")
        ax.plot(x, y, marker="o", color=f"C{i % 10}", label=label)
        x, y = _series(rows, "goodput")
        good.plot(x, y, marker="x", linestyle=":", color=f"C{i % 10}", alpha=0.7, label=f"{label} goodput")
    scale = _load_axis(ax, levels, kinds)
    _frame(ax, "Throughput and goodput vs load (measured windows)", "output tokens/s (solid)",
           empty=None if levels else NO_LEVELS)
    good.set_ylabel("goodput, requests/s meeting every SLO (dotted)")
    handles = ax.get_legend_handles_labels()
    extra = good.get_legend_handles_labels()
    if handles[0]:
        ax.legend(handles[0] + extra[0], handles[1] + extra[1], loc="upper left", fontsize=7)
    return _save(fig, path), {"xscale": scale, "series": len(ax.get_lines())}


def _slo_line(ax, slo: float | None, name: str) -> str:
    """The SLO as a line when it falls inside the data's range; else a note at the edge it lies
    beyond, so the panel stays scaled to the data (an SLO far above would flatten every curve)."""
    if not slo:
        return "none"
    lo, hi = ax.get_ylim()
    if lo <= slo <= hi:
        ax.axhline(slo, color="red", linewidth=1, linestyle=":", label=f"{name} SLO {slo:g} ms")
        ax.set_ylim(lo, hi)
        return "line"
    above = slo > hi
    ax.annotate(f"{name} SLO {slo:g} ms {'above' if above else 'below'} this range",
                (0.99, 0.98 if above else 0.02), xycoords="axes fraction", ha="right",
                va="top" if above else "bottom", fontsize=7, color="red")
    return "above" if above else "below"


def latency_vs_load(series: dict[str, list[dict]], path: Path, slos: dict[str, float | None]) -> tuple[Path, dict]:
    """TTFT and ITL p50 (solid) and p99 (dashed) per level; slos: {'ttft': ms, 'itl': ms}."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    levels, kinds = _levels_kinds(series)
    for i, (label, rows) in enumerate(series.items()):
        color = f"C{i % 10}"
        for ax, metric in ((a1, "ttft"), (a2, "itl")):
            x, y = _series(rows, f"{metric}_p50_ms")
            ax.plot(x, y, marker="o", color=color, label=f"{label} p50")
            x, y = _series(rows, f"{metric}_p99_ms")
            ax.plot(x, y, marker="s", linestyle="--", color=color, label=f"{label} p99")
    facts = {}
    for ax, metric, name in ((a1, "ttft", "TTFT"), (a2, "itl", "ITL")):
        facts["xscale"] = _load_axis(ax, levels, kinds)
        if not any(len(line.get_xdata()) for line in ax.get_lines()):
            _empty(ax, f"no {name} figures: no stage completed a request" + (" with two chunks" if metric == "itl" else ""))
        facts[f"{metric}_slo"] = _slo_line(ax, slos.get(metric), name)
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    a1.set_title("TTFT p50 / p99 vs load")
    a2.set_title("ITL p50 / p99 vs load (per-token view)")
    return _save(fig, path), facts


def attainment_vs_load(series: dict[str, list[dict]], path: Path, target: float) -> tuple[Path, dict]:
    """SLO attainment per level, with the frontier's target line."""
    fig, ax = plt.subplots(figsize=(7, 4))
    levels, kinds = _levels_kinds(series)
    for i, (label, rows) in enumerate(series.items()):
        x, y = _series(rows, "slo_attainment")
        ax.plot(x, [100 * v for v in y], marker="o", color=f"C{i % 10}", label=label)
    scale = _load_axis(ax, levels, kinds)
    _frame(ax, "SLO attainment vs load", "SLO attainment (% of requests meeting every SLO)",
           empty=None if levels else NO_LEVELS)
    ax.axhline(100 * target, color="red", linewidth=1, linestyle=":", label=f"target {target:.0%}")
    ax.set_ylim(-3, 103)
    ax.legend(fontsize=7, loc="lower left")
    return _save(fig, path), {"xscale": scale, "series": len(series)}


def pareto(series: dict[str, list[dict]], path: Path) -> tuple[Path, dict]:
    """Output tokens/s per GPU (system) against output tokens/s per user (1000 / mean TPOT)."""
    fig, ax = plt.subplots(figsize=(7, 5))
    points = []
    for label, rows in series.items():
        pts = sorted(
            (r["output_tokens_per_s_per_user"], r["output_tokens_per_s_per_gpu"], r["level"])
            for r in rows
            if _finite(r.get("output_tokens_per_s_per_user")) and _finite(r.get("output_tokens_per_s_per_gpu"))
        )
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        for x, y, level in pts:
            if _finite(level):
                ax.annotate(f"{level:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        points.extend(pts)
    # The frontier: points no other point beats on both axes.
    frontier = sorted(p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q[:2] != p[:2] for q in points))
    if len(frontier) > 1:
        ax.plot([p[0] for p in frontier], [p[1] for p in frontier], color="grey", linewidth=3, alpha=0.3,
                label="Pareto frontier")
    _frame(ax, "Latency-throughput trade-off (labels: load level)", "output tokens/s per GPU",
           xlabel="output tokens/s per user (1000 / mean TPOT)",
           empty=None if points else "no stage has both tokens/s per user (needs TPOT) and per GPU "
           "(needs runs.gpus)")
    if points:
        ax.legend(fontsize=8)
    return _save(fig, path), {"series": len({p for p in series if series[p]}), "points": len(points)}


def cdf_overlay(panels: list[dict], path: Path) -> tuple[Path, dict]:
    """panels: [{'level': x, 'ttft': {label: [(ms, share)]}, 'itl': {...}}]: one row per load
    level, TTFT left and ITL right, every variant overlaid; each column shares its x axis."""
    rows = max(len(panels), 1)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.2 * rows), squeeze=False, sharex="col", sharey=True)
    labels = list(dict.fromkeys(k for p in panels for m in ("ttft", "itl") for k in p[m]))
    overlaid = []
    for row, panel in zip(axes, panels):
        for ax, metric, name in ((row[0], "ttft", "TTFT"), (row[1], "itl", "ITL (per token)")):
            for label, pts in panel[metric].items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{labels.index(label) % 10}",
                        drawstyle="steps-post" if metric == "itl" else "default", label=label)
            if not panel[metric]:
                _empty(ax, f"no {name} samples at this load")
            overlaid.append(len(panel[metric]))
            ax.set_title(f"{name} CDF at load {panel['level']:g}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            if panel[metric]:
                ax.legend(fontsize=7, loc="lower right")
    if not panels:
        _empty(axes[0][0], "the runs share no load level, so their distributions cannot be set side by side")
        _empty(axes[0][1], "")
    for ax in axes[:, 0]:
        ax.set_ylabel("share of samples")
    has = [any(p[m] for p in panels) for m in ("ttft", "itl")]
    for col, metric, ok in ((0, "ttft", has[0]), (1, "itl", has[1])):
        if ok:
            axes[0][col].set_xscale("log")
            # Plain numbers at 1-2-5 steps: the default's minor labels run into each other
            # ("3x10^2 4x10^2") on a narrow TTFT span.
            axes[0][col].xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axes[0][col].xaxis.set_major_formatter(ScalarFormatter())
            axes[0][col].xaxis.set_minor_formatter(NullFormatter())
        axes[-1][col].set_xlabel(f"{'time to first token' if metric == 'ttft' else 'inter-token latency'} (ms"
                                 + (", log)" if ok else ")"))
    return _save(fig, path), {"levels": [p["level"] for p in panels], "overlaid": max(overlaid, default=0),
                              "xscale": "log" if has[0] else "linear"}
