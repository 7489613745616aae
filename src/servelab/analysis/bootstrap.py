"""The bootstrap of one group at one stage, over the views' own per-request columns.

``load_stage`` reads, per run, the counted requests of ``request_metrics`` (ok, slo_met, ttft_ms,
tpot_ms, e2e_ms: the view's definitions, not re-derived), their chunk gaps from ``itl_chunks``
(itl_ms and its token weight) and the window and in-window tokens from ``stage_summary``.
``Estimator`` then evaluates the compared metrics over weighted copies of those rows: all
weights 1 gives the pooled figure of a group of repeats; a resample (runs drawn, then requests
within each drawn run) gives one bootstrap replicate. For one run with all weights 1 the figures
equal stage_summary's (tests/analysis/test_compare.py checks it).
"""
from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

from .stats import weighted_quantiles

# metric -> (request_metrics column, or 'itl' for itl_chunks.itl_ms weighted by tokens; q)
PERCENTILES = {
    "ttft_p50_ms": ("ttft_ms", 0.5),
    "ttft_p99_ms": ("ttft_ms", 0.99),
    "tpot_p50_ms": ("tpot_ms", 0.5),
    "e2e_p99_ms": ("e2e_ms", 0.99),
    "itl_p50_ms": ("itl", 0.5),
    "itl_p99_ms": ("itl", 0.99),
}


@dataclass
class StageData:
    """Raw rows of one group at one stage, pooled over its runs (requests in run order)."""

    run_sizes: list[int]
    windows: np.ndarray  # per run: measured window (s)
    window_tokens: np.ndarray  # per run: output tokens that arrived in the window
    ok: np.ndarray
    slo_met: np.ndarray
    columns: dict[str, np.ndarray]  # ttft_ms, tpot_ms, e2e_ms per request (NaN when undefined)
    itl_values: np.ndarray  # per chunk gap: gap / tokens
    itl_request: np.ndarray  # index of the gap's request in the pooled arrays
    itl_tokens: np.ndarray  # tokens of the chunk (the gap's weight)


def load_stage(con: duckdb.DuckDBPyConnection, run_ids: list[str], stage: int, class_name: str) -> StageData:
    class_filter = "" if class_name == "(all)" else "AND coalesce(class_name, '(none)') = ?"
    extra = [] if class_name == "(all)" else [class_name]
    sizes, windows, tokens, parts, itl_parts = [], [], [], [], []
    offset = 0
    for run_id in run_ids:
        req = con.execute(
            "SELECT ok, slo_met, ttft_ms, tpot_ms, e2e_ms FROM request_metrics "
            f"WHERE run_id = ? AND stage = ? AND measured AND NOT dropped {class_filter} ORDER BY request_id",
            [run_id, stage, *extra],
        ).fetchnumpy()
        # The gaps of each request, tagged with the request's position in `req` (same order).
        itl = con.execute(
            f"""WITH r AS (
                    SELECT request_id, row_number() OVER (ORDER BY request_id) - 1 AS idx FROM request_metrics
                    WHERE run_id = ? AND stage = ? AND measured AND NOT dropped {class_filter})
                SELECT r.idx, c.itl_ms, c.tokens FROM itl_chunks c JOIN r USING (request_id)
                WHERE c.run_id = ? AND c.stage = ? AND c.measured AND c.ok""",
            [run_id, stage, *extra, run_id, stage],
        ).fetchnumpy()
        summary = con.execute(
            "SELECT window_s, output_tokens_in_window FROM stage_summary WHERE run_id = ? AND stage = ? AND class_name = ?",
            [run_id, stage, class_name],
        ).fetchone()
        windows.append(summary[0] if summary and summary[0] else np.nan)
        tokens.append(summary[1] if summary else 0.0)
        n = len(req["ok"])
        sizes.append(n)
        parts.append(req)
        itl_parts.append((np.asarray(itl["idx"], dtype=np.int64) + offset, itl["itl_ms"], itl["tokens"]))
        offset += n

    def column(name, parts=parts):
        arrays = [np.ma.filled(np.ma.asarray(p[name], dtype=float), np.nan) for p in parts]
        return np.concatenate(arrays) if arrays else np.zeros(0)

    def flags(name):
        arrays = [np.ma.filled(np.ma.asarray(p[name]), False).astype(bool) for p in parts]
        return np.concatenate(arrays) if arrays else np.zeros(0, dtype=bool)

    return StageData(
        run_sizes=sizes,
        windows=np.array(windows, dtype=float),
        window_tokens=np.array(tokens, dtype=float),
        ok=flags("ok"),
        slo_met=flags("slo_met"),
        columns={k: column(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms")},
        itl_values=np.concatenate([np.asarray(v, dtype=float) for _, v, _ in itl_parts]) if itl_parts else np.zeros(0),
        itl_request=np.concatenate([i for i, _, _ in itl_parts]) if itl_parts else np.zeros(0, dtype=np.int64),
        itl_tokens=np.concatenate([np.asarray(k, dtype=np.int64) for _, _, k in itl_parts]) if itl_parts else np.zeros(0, dtype=np.int64),
    )


class Estimator:
    """Every compared metric of one group at one stage, for the original sample (all weights 1,
    every run once) or for a bootstrap resample (request and run multiplicities)."""

    def __init__(self, data: StageData):
        self.data = data
        self.n = int(data.ok.size)
        self.sorted = {}
        for name, values in data.columns.items():
            usable = data.ok & ~np.isnan(values)
            idx = np.nonzero(usable)[0]
            order = idx[np.argsort(values[idx], kind="stable")]
            self.sorted[name] = (values[order], order)
        order = np.argsort(data.itl_values, kind="stable")
        self.itl_sorted = (data.itl_values[order], data.itl_request[order], data.itl_tokens[order])

    def evaluate(self, request_counts: np.ndarray, run_counts: np.ndarray, itl: bool = True) -> dict[str, np.ndarray]:
        """request_counts: (B, n) multiplicities; run_counts: (B, runs); itl=False skips the ITL
        percentiles (NaN), the costly ones: they read every chunk gap."""
        d = self.data
        out: dict[str, np.ndarray] = {}
        for metric, (column, q) in PERCENTILES.items():
            if column == "itl" and not itl:
                out[metric] = np.full(request_counts.shape[0], np.nan)
                continue
            if column == "itl":
                values, req, k = self.itl_sorted
                weights = request_counts[:, req] * k[None, :]
            else:
                values, order = self.sorted[column]
                weights = request_counts[:, order]
            out[metric] = weighted_quantiles(values, weights, [q])[:, 0]
        total = request_counts.sum(axis=1).astype(float)
        met = (request_counts * d.slo_met[None, :]).sum(axis=1)
        failed = (request_counts * ~d.ok[None, :]).sum(axis=1)
        window = (run_counts * np.nan_to_num(d.windows, nan=0.0)[None, :]).sum(axis=1)
        tokens = (run_counts * d.window_tokens[None, :]).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["slo_attainment"] = np.where(total > 0, met / total, np.nan)
            out["error_rate"] = np.where(total > 0, failed / total, np.nan)
            out["goodput"] = np.where(window > 0, met / window, np.nan)
            out["output_tokens_per_s"] = np.where(window > 0, tokens / window, np.nan)
        return out

    def point(self) -> dict[str, float]:
        res = self.evaluate(np.ones((1, self.n), dtype=np.int64), np.ones((1, len(self.data.run_sizes)), dtype=np.int64))
        return {k: float(v[0]) for k, v in res.items()}

    def resample(self, rng: np.random.Generator, boot: int) -> dict[str, np.ndarray]:
        runs = len(self.data.run_sizes)
        starts = np.concatenate([[0], np.cumsum(self.data.run_sizes)])
        request_counts = np.zeros((boot, self.n), dtype=np.int32)
        if runs > 1:
            run_counts = rng.multinomial(runs, np.full(runs, 1 / runs), size=boot)
        else:
            run_counts = np.ones((boot, 1), dtype=np.int64)
        for j in range(runs):
            size = self.data.run_sizes[j]
            if size == 0:
                continue
            for b in np.nonzero(run_counts[:, j])[0]:
                request_counts[b, starts[j]:starts[j + 1]] = rng.multinomial(run_counts[b, j] * size, np.full(size, 1 / size))
        # Weighted quantiles build (batch x samples) matrices: keep each batch near 4M cells. The ITL
        # percentiles read every chunk gap per resample, so a stage with millions of gaps gets
        # fewer ITL resamples (at least 50; about 4e8 cell operations in all).
        width = max(self.n, self.itl_sorted[0].size, 1)
        step = max(1, 4_000_000 // width)
        itl_boot = min(boot, max(50, int(4e8 // max(self.itl_sorted[0].size, 1))))
        parts = [self.evaluate(request_counts[i:i + step], run_counts[i:i + step], itl=i < itl_boot)
                 for i in range(0, boot, step)]
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if runs == 1:
            # One run: its window and token count are fixed, so the bootstrap says nothing about the
            # run-to-run noise of throughput; leave it unknown rather than falsely exact.
            out["output_tokens_per_s"] = np.full(boot, np.nan)
        return out
