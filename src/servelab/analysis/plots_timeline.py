"""The report's timeline figure: a run's client latency and throughput over the server's queue,
KV-cache use and preemptions on one time axis (matplotlib, Agg; rows already fetched)."""
from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from .plots import _finite, _save, plt


def timeline(client: list[dict], server: list[dict], stages: list[dict], started_unix: float, title: str,
             path: Path, engine: list[dict] | None = None) -> Path:
    """Client latency and throughput on top, the server's state under it, on one time axis; with
    ``engine`` rows (engine_timeline: iteration lines, GPU samples) a panel of those too."""
    panels = ["latency", "tokens", "queue", "kv", "preempt"] + (["engine"] if engine else [])
    has_health = any(r.get("cpu_percent_max") is not None for r in client)
    if has_health:
        panels.append("client")
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.0 * len(panels)), sharex=True)
    ax = dict(zip(panels, axes))
    _latency(ax["latency"], client)
    _throughput(ax["tokens"], client, server)
    _server_state(ax["queue"], ax["kv"], ax["preempt"], server)
    if engine:
        _engine(ax["engine"], engine)
    if has_health:
        _generator_health(ax["client"], client)
    _mark_stages(axes, stages, started_unix)
    for a in axes:
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds since the run started (green: measured windows)")
    axes[0].set_title(title)
    # Fixed margins: tight_layout would lay out six shared-axis panels twice for no visible gain.
    fig.subplots_adjust(left=0.08, right=0.93, top=0.96, bottom=0.06, hspace=0.12)
    return _save(fig, path, tight=False)


def _xs(rows, key):
    pts = [(r["t_rel_s"], r[key]) for r in rows if _finite(r.get("t_rel_s")) and _finite(r.get(key))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _latency(a, client) -> None:
    for key, label, style in (("ttft_p50_ms", "TTFT p50", "-"), ("ttft_p99_ms", "TTFT p99", "--"),
                              ("itl_p99_ms", "ITL p99 (per token)", ":")):
        x, y = _xs(client, key)
        a.plot(x, y, style, label=label)
    a.set_ylabel("client ms")
    if any(_finite(r.get("ttft_p99_ms")) and r["ttft_p99_ms"] > 0 for r in client):
        a.set_yscale("log")
        # 1-2-5 ticks: a latency range inside one decade would otherwise get no labelled tick
        a.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.yaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_minor_formatter(NullFormatter())


def _throughput(a, client, server) -> None:
    x, y = _xs(client, "output_tokens")
    a.plot(x, y, label="client: output tokens/s")
    x, y = _xs(server, "generation_tokens_per_s")
    if x:
        a.plot(x, y, "--", label="server: generation tokens/s")
    a.set_ylabel("tokens/s")


def _server_state(queue, kv, preempt, server) -> None:
    for key, label in (("running", "running"), ("waiting", "waiting")):
        x, y = _xs(server, key)
        queue.plot(x, y, label=label)
    queue.set_ylabel("requests")
    x, y = _xs(server, "kv_cache_usage")
    kv.plot(x, [100 * v for v in y], color="C3", label="KV-cache use (mean of engines)")
    kv.set_ylabel("KV %")
    kv.set_ylim(0, 105)
    x, y = _xs(server, "preemptions_per_s")
    preempt.bar(x, y, width=1.0, color="C4", label="preemptions/s")
    preempt.set_ylabel("preempt/s")


def _engine(a, engine) -> None:
    for key, label in (("context_tokens", "engine: context tokens/s"),
                       ("generation_tokens", "engine: generation tokens/s")):
        x, y = _xs(engine, key)
        a.plot(x, y, label=label)
    a.set_ylabel("tokens/s")
    _twin_line(a, *_xs(engine, "power_w"), "C3", "GPU power W", "W")


def _generator_health(a, client) -> None:
    x, y = _xs(client, "cpu_percent_max")
    a.plot(x, y, color="C5", label="generator CPU % (worst worker)")
    _twin_line(a, *_xs(client, "loop_lag_max_ms"), "C6", "event-loop lag ms (worst worker)", "lag ms")
    a.set_ylabel("CPU %")


def _twin_line(a, x, y, color: str, label: str, ylabel: str) -> None:
    """A second quantity on its own right-hand axis (dotted), its legend apart from the panel's;
    nothing when it has no samples."""
    if x:
        twin = a.twinx()
        twin.plot(x, y, ":", color=color, label=label)
        twin.set_ylabel(ylabel)
        twin.legend(fontsize=7, loc="upper left")


def _mark_stages(axes, stages, started_unix: float) -> None:
    """Measured windows shaded on every panel; each stage's start marked on the top one."""
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
