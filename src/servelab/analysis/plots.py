"""The report's figures (matplotlib, Agg backend), each drawn from the SQL views.

Every function takes already-fetched rows (lists of dicts) and a path, writes one PNG and
returns it; nothing here queries the database, so the figures show exactly the view figures.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter  # noqa: E402

DPI = 110


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _save(fig, path: Path, tight: bool = True) -> Path:
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _load_label(kinds: set[str]) -> str:
    if kinds <= {"concurrency"}:
        return "concurrency (users)"
    if kinds <= {"rate", "trace"}:
        return "offered rate (requests/s)"
    return "load level (users or requests/s)"


def _series(rows: list[dict], key: str):
    pts = sorted((r["level"], r[key]) for r in rows if _finite(r["level"]) and _finite(r.get(key)))
    return [p[0] for p in pts], [p[1] for p in pts]


def throughput_vs_load(series: dict[str, list[dict]], path: Path) -> Path:
    """series: label -> stage_summary '(all)' rows of one run. Goodput on a second axis."""
    fig, ax = plt.subplots(figsize=(7, 4))
    good = ax.twinx()
    kinds = set()
    for i, (label, rows) in enumerate(series.items()):
        kinds |= {r["kind"] for r in rows if r["kind"]}
        x, y = _series(rows, "output_tokens_per_s")
        ax.plot(x, y, marker="o", color=f"C{i % 10}", label=label)
        x, y = _series(rows, "goodput")
        good.plot(x, y, marker="x", linestyle=":", color=f"C{i % 10}", alpha=0.7, label=f"{label} goodput")
    ax.set_xlabel(_load_label(kinds))
    ax.set_ylabel("output tokens/s (solid)")
    good.set_ylabel("goodput, requests/s meeting every SLO (dotted)")
    ax.set_title("Throughput and goodput vs load (measured windows)")
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()
    extra = good.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], loc="upper left", fontsize=7)
    return _save(fig, path)


def latency_vs_load(series: dict[str, list[dict]], path: Path, ttft_slo_ms: float | None = None) -> Path:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    kinds = set()
    for i, (label, rows) in enumerate(series.items()):
        kinds |= {r["kind"] for r in rows if r["kind"]}
        color = f"C{i % 10}"
        for ax, metric in ((a1, "ttft"), (a2, "itl")):
            x, y = _series(rows, f"{metric}_p50_ms")
            ax.plot(x, y, marker="o", color=color, label=f"{label} p50")
            x, y = _series(rows, f"{metric}_p99_ms")
            ax.plot(x, y, marker="s", linestyle="--", color=color, label=f"{label} p99")
    if ttft_slo_ms:
        a1.axhline(ttft_slo_ms, color="red", linewidth=1, linestyle=":", label=f"TTFT SLO {ttft_slo_ms:g} ms")
    a1.set_title("TTFT p50 / p99 vs load")
    a2.set_title("ITL p50 / p99 vs load (per-token view)")
    for ax in (a1, a2):
        ax.set_xlabel(_load_label(kinds))
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def pareto(series: dict[str, list[dict]], path: Path) -> Path:
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
    ax.set_xlabel("output tokens/s per user (1000 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("Latency-throughput trade-off (labels: load level)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def itl_cdf(curves: dict[str, dict[str, list[tuple[float, float]]]], path: Path) -> Path:
    """curves: run label -> {line label -> [(ms, cumulative share)]}; one panel per run."""
    n = max(len(curves), 1)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    for ax, (run_label, lines) in zip(axes[0], curves.items()):
        bases = list(dict.fromkeys(k.replace(" (chunk view)", "") for k in lines))
        for line_label, pts in lines.items():
            chunk = line_label.endswith(" (chunk view)")
            color = f"C{bases.index(line_label.replace(' (chunk view)', '')) % 10}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="--" if chunk else "-",
                    color=color, label=line_label)
        ax.set_xscale("log")
        ax.set_xlabel("inter-token latency (ms, log)")
        ax.set_ylabel("share of samples")
        ax.set_title(f"ITL CDF: {run_label}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return _save(fig, path)


def timeline(client: list[dict], server: list[dict], stages: list[dict], started_unix: float, title: str,
             path: Path) -> Path:
    """Client latency and throughput on top, the server's state under it, on one time axis."""
    panels = ["latency", "tokens", "queue", "kv", "preempt"]
    has_health = any(r.get("cpu_percent_max") is not None for r in client)
    if has_health:
        panels.append("client")
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.0 * len(panels)), sharex=True)
    ax = dict(zip(panels, axes))

    def xs(rows, key):
        pts = [(r["t_rel_s"], r[key]) for r in rows if _finite(r.get("t_rel_s")) and _finite(r.get(key))]
        return [p[0] for p in pts], [p[1] for p in pts]

    for key, label, style in (("ttft_p50_ms", "TTFT p50", "-"), ("ttft_p99_ms", "TTFT p99", "--"),
                              ("itl_p99_ms", "ITL p99 (per token)", ":")):
        x, y = xs(client, key)
        ax["latency"].plot(x, y, style, label=label)
    ax["latency"].set_ylabel("client ms")
    if any(_finite(r.get("ttft_p99_ms")) and r["ttft_p99_ms"] > 0 for r in client):
        ax["latency"].set_yscale("log")
        # 1-2-5 ticks: a latency range inside one decade would otherwise get no labelled tick
        ax["latency"].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax["latency"].yaxis.set_major_formatter(ScalarFormatter())
        ax["latency"].yaxis.set_minor_formatter(NullFormatter())
    x, y = xs(client, "output_tokens")
    ax["tokens"].plot(x, y, label="client: output tokens/s")
    x, y = xs(server, "generation_tokens_per_s")
    if x:
        ax["tokens"].plot(x, y, "--", label="server: generation tokens/s")
    ax["tokens"].set_ylabel("tokens/s")
    for key, label in (("running", "running"), ("waiting", "waiting")):
        x, y = xs(server, key)
        ax["queue"].plot(x, y, label=label)
    ax["queue"].set_ylabel("requests")
    x, y = xs(server, "kv_cache_usage")
    ax["kv"].plot(x, [100 * v for v in y], color="C3", label="KV-cache use (mean of engines)")
    ax["kv"].set_ylabel("KV %")
    ax["kv"].set_ylim(0, 105)
    x, y = xs(server, "preemptions_per_s")
    ax["preempt"].bar(x, y, width=1.0, color="C4", label="preemptions/s")
    ax["preempt"].set_ylabel("preempt/s")
    if has_health:
        x, y = xs(client, "cpu_percent_max")
        ax["client"].plot(x, y, color="C5", label="generator CPU % (worst worker)")
        x, y = xs(client, "loop_lag_max_ms")
        if x:
            twin = ax["client"].twinx()
            twin.plot(x, y, ":", color="C6", label="event-loop lag ms (worst worker)")
            twin.set_ylabel("lag ms")
            twin.legend(fontsize=7, loc="upper left")
        ax["client"].set_ylabel("CPU %")
    for s in stages:
        if _finite(s.get("measure_start_unix")) and _finite(s.get("measure_end_unix")):
            for a in axes:
                a.axvspan(s["measure_start_unix"] - started_unix, s["measure_end_unix"] - started_unix,
                          color="green", alpha=0.06)
        if _finite(s.get("started_unix")):
            axes[0].axvline(s["started_unix"] - started_unix, color="grey", linewidth=0.6)
            axes[0].annotate(f"stage {s['stage']} ({s['level']:g})" if _finite(s.get("level")) else f"stage {s['stage']}",
                             (s["started_unix"] - started_unix, 1), xycoords=("data", "axes fraction"),
                             fontsize=7, va="top", xytext=(2, -2), textcoords="offset points")
    for a in axes:
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds since the run started (green: measured windows)")
    axes[0].set_title(title)
    # Fixed margins: tight_layout would lay out six shared-axis panels twice for no visible gain.
    fig.subplots_adjust(left=0.08, right=0.93, top=0.96, bottom=0.06, hspace=0.12)
    return _save(fig, path, tight=False)
