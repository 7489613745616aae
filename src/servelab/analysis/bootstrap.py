"""The bootstrap of one group at one stage, over the views' own per-request columns.

``load_stage`` reads, per run, the counted requests of ``request_metrics`` (ok, slo_met, ttft_ms,
tpot_ms, e2e_ms: the view's definitions, not re-derived), their chunk gaps from ``itl_chunks``
(itl_ms and its token weight) and the window and in-window tokens from ``stage_summary``.
``load_stages`` reads the same rows for every run and stage of a comparison in three queries, and
takes ITL from each request's DDSketch (``itl_sketches``, token view) instead of its chunk gaps: a
request becomes a row of bucket counts, so a resample's merged sketch is one matrix product
(request multiplicities x bucket counts) and its percentiles are read from the buckets as
``itl_stage_quantiles`` reads them (within 1%, the view's own method; point and interval then agree
with stage_summary's sketched figure). ``load_stage`` keeps the exact gaps for ``--exact``.
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
    # Sketched ITL (load_stages): the stage's buckets' values, ascending, and per request its
    # count in each bucket (requests x buckets); None where the exact gaps above are used.
    itl_bin_values: np.ndarray | None = None
    itl_bins: np.ndarray | None = None


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


def load_stages(con: duckdb.DuckDBPyConnection, groups: list[list[str]], class_name: str) -> dict[tuple[int, int], StageData]:
    """(group index, stage) -> the group's StageData at that stage, with ITL sketched, for every
    stage any of its runs has: the same rows as load_stage, read for all runs at once."""
    run_ids = [r for g in groups for r in g]
    class_filter = "" if class_name == "(all)" else "AND coalesce(class_name, '(none)') = ?"
    extra = [] if class_name == "(all)" else [class_name]
    req = con.execute(
        "SELECT run_id, stage, ok, slo_met, ttft_ms, tpot_ms, e2e_ms FROM request_metrics "
        f"WHERE list_contains(?, run_id) AND measured AND NOT dropped {class_filter} "
        "ORDER BY run_id, stage, request_id", [run_ids, *extra]).fetchnumpy()
    # Each request's buckets, tagged with its position among its run's stage's requests (the
    # order above), with the value a bucket stands for from the view's own macro.
    bins = con.execute(
        f"""WITH r AS (
                SELECT run_id, request_id, stage, ok,
                       row_number() OVER (PARTITION BY run_id, stage ORDER BY request_id) - 1 AS idx
                FROM request_metrics
                WHERE list_contains(?, run_id) AND measured AND NOT dropped {class_filter}),
            b AS (
                SELECT r.run_id, r.stage, r.idx, unnest(map_keys(s.token_sketch)) AS bin,
                       unnest(map_values(s.token_sketch)) AS n
                FROM itl_sketches s JOIN r USING (run_id, request_id) WHERE r.ok AND s.gaps > 0)
            SELECT run_id, stage, idx, bin, servelab_sketch_value(bin) AS value, n FROM b""",
        [run_ids, *extra]).fetchnumpy()
    summary = {(r, st): (w, t) for r, st, w, t in con.execute(
        "SELECT run_id, stage, window_s, output_tokens_in_window FROM stage_summary "
        "WHERE list_contains(?, run_id) AND class_name = ?", [run_ids, class_name]).fetchall()}
    stage_list = sorted({st for _, st in summary} | set(np.unique(np.asarray(req["stage"])).tolist()))
    req_key = _keys(req["run_id"], req["stage"])
    bin_key = _keys(bins["run_id"], bins["stage"])
    out = {}
    for gi, members in enumerate(groups):
        for stage in stage_list:
            if not any((r, stage) in summary for r in members):
                continue
            out[(gi, stage)] = _stage_from_rows(members, stage, req, req_key, bins, bin_key, summary)
    return out


def _keys(run_col, stage_col) -> np.ndarray:
    return np.array([f"{r}\x00{s}" for r, s in zip(np.asarray(run_col), np.asarray(stage_col))], dtype=object)


def _stage_from_rows(members, stage, req, req_key, bins, bin_key, summary) -> StageData:
    sizes, windows, tokens, picks, bin_parts = [], [], [], [], []
    offset = 0
    for run_id in members:
        key = f"{run_id}\x00{stage}"
        rows = np.nonzero(req_key == key)[0]
        window, in_window = summary.get((run_id, stage), (None, None))
        windows.append(window if window else np.nan)
        tokens.append(in_window or 0.0)
        sizes.append(rows.size)
        picks.append(rows)
        b = np.nonzero(bin_key == key)[0]
        bin_parts.append((np.asarray(bins["idx"])[b].astype(np.int64) + offset, np.asarray(bins["bin"])[b],
                          np.asarray(bins["value"], dtype=float)[b], np.asarray(bins["n"], dtype=float)[b]))
        offset += rows.size
    take = np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)

    def column(name):
        return np.ma.filled(np.ma.asarray(req[name], dtype=float), np.nan)[take]

    def flag(name):
        return np.ma.filled(np.ma.asarray(req[name]), False).astype(bool)[take]

    idx = np.concatenate([p[0] for p in bin_parts])
    codes = np.concatenate([p[1] for p in bin_parts]).astype(np.int64)
    values = np.concatenate([p[2] for p in bin_parts])
    counts = np.concatenate([p[3] for p in bin_parts])
    # Bucket codes sort as their values do (negative codes below zero's, zero's below positive).
    uniq, first, col = np.unique(codes, return_index=True, return_inverse=True)
    matrix = np.zeros((offset, uniq.size))
    np.add.at(matrix, (idx, col), counts)
    return StageData(
        run_sizes=sizes, windows=np.array(windows, dtype=float), window_tokens=np.array(tokens, dtype=float),
        ok=flag("ok"), slo_met=flag("slo_met"), columns={k: column(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms")},
        itl_values=np.zeros(0), itl_request=np.zeros(0, dtype=np.int64), itl_tokens=np.zeros(0, dtype=np.int64),
        itl_bin_values=values[first], itl_bins=matrix)


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
            if column == "itl" and d.itl_bins is not None:
                # A resample's merged sketch: each bucket's count summed over the drawn requests.
                values = d.itl_bin_values
                weights = np.rint(request_counts.astype(float) @ d.itl_bins).astype(np.int64)
            elif column == "itl":
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
            # All resamples that drew run j equally often draw its requests in one call.
            for times in np.unique(run_counts[:, j]):
                rows = np.nonzero(run_counts[:, j] == times)[0]
                if times:
                    request_counts[rows, starts[j]:starts[j + 1]] = rng.multinomial(
                        times * size, np.full(size, 1 / size), size=rows.size)
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
