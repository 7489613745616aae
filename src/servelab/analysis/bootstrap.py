"""The bootstrap of one group at one stage, over the views' own per-request columns.

``load_stage`` reads, per run, the counted requests of ``request_metrics`` (ok, slo_met, ttft_ms,
tpot_ms, e2e_ms: the view's definitions, not re-derived), their chunk gaps from ``itl_chunks``
(itl_ms and its token weight) and the window and in-window tokens from ``stage_summary``; every
request is its own resampling block, so ``--exact`` is the plain request bootstrap.

``load_stages`` serves a whole comparison in two reads, at campaign scale (1 M requests x 256
chunks in 10 runs). Resampling a million requests 400 times is 400 M draws and a (resamples x
requests) weight matrix per metric, and that made it slow and large; instead each run's stage is
dealt, in a random order fixed by ``hash(request_id)``, into at most ``BLOCKS`` blocks of equal
size (a stage with fewer requests keeps one request per block: the request bootstrap exactly),
and the bootstrap draws blocks. What is resampled: runs (a group of repeats), then, within each
drawn run, its blocks with replacement, as many as it has. Why the interval stays valid: blocks
of a random partition of exchangeable requests are themselves i.i.d., so this is the cluster
bootstrap, consistent for every compared statistic (ratios of counts, quantiles); over the random
partition its variance is the request bootstrap's. The price is the noise of estimating a spread
from 250 clusters, about 1/sqrt(2 x 250) = 4.5% of an interval's width, below the noise of the
2.5%/97.5% order statistics of 400 resamples (about 7%). tests/analysis/test_bootstrap.py checks
the spreads agree, and that a partition correlated with the values would not pass. ITL comes from
each block's merged DDSketch (``itl_sketches``, token view, summed in SQL with integer keys): a
resample's merged sketch is one matrix product (block multiplicities x bucket counts), read as
``itl_stage_quantiles`` reads buckets, so the pooled point equals the view's sketched figure.
Points do not depend on the blocks: all weights 1 counts every request once.
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
BLOCKS = 250  # most resampling blocks per run and stage (see the module's docstring)


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
    # Sketched ITL (load_stages): the stage's buckets' values, ascending, and per block its
    # count in each bucket (blocks x buckets); None where the exact gaps above are used.
    itl_bin_values: np.ndarray | None = None
    itl_bins: np.ndarray | None = None
    # Resampling blocks: per request its block (pooled numbering, run after run), per run its
    # count of blocks. None: one block per request.
    blocks: np.ndarray | None = None
    run_blocks: list[int] | None = None


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


def _blocked(class_filter: str) -> str:
    """The counted requests of the compared runs, each with its run's position in the list, and its
    block: its rank in a hash order (random, but the same in every read) modulo BLOCKS. Narrow
    integer types: the sketch query groups tens of millions of rows by them (a third faster)."""
    return f"""SELECT (list_position(?, run_id) - 1)::INTEGER AS run, run_id, stage::INTEGER AS stage, request_id,
                   ok, slo_met, ttft_ms, tpot_ms, e2e_ms,
                   ((row_number() OVER (PARTITION BY run_id, stage ORDER BY hash(request_id), request_id) - 1)
                    % {BLOCKS})::SMALLINT AS blk
               FROM request_metrics WHERE list_contains(?, run_id) AND measured AND NOT dropped {class_filter}"""


def load_stages(con: duckdb.DuckDBPyConnection, groups: list[list[str]], class_name: str,
                summary: dict[tuple[str, int], tuple] | None = None) -> dict[tuple[int, int], StageData]:
    """(group index, stage) -> the group's StageData at that stage, ITL sketched and requests in
    blocks, for every stage any of its runs has. `summary`: (run_id, stage) -> (window_s,
    output_tokens_in_window) of stage_summary, when the caller has read it already."""
    run_ids = list(dict.fromkeys(r for g in groups for r in g))
    class_filter = "" if class_name == "(all)" else "AND coalesce(class_name, '(none)') = ?"
    args = [run_ids, run_ids] + ([] if class_name == "(all)" else [class_name])
    req = con.execute(f"SELECT * EXCLUDE (run_id, request_id) FROM ({_blocked(class_filter)}) ORDER BY run, stage",
                      args).fetchnumpy()
    # Each block's merged token sketch: bucket counts summed over its completed requests, keyed
    # by integers only (run position, stage, block, bucket), so the rows come back as numbers.
    bins = con.execute(
        f"""SELECT run, stage, blk, bin, sum(n)::BIGINT AS n FROM (
                SELECT r.run, r.stage, r.blk, unnest(map_keys(s.token_sketch)) AS bin,
                       unnest(map_values(s.token_sketch)) AS n
                FROM itl_sketches s JOIN ({_blocked(class_filter)}) r
                  ON s.run_id = r.run_id AND s.request_id = r.request_id
                WHERE r.ok AND s.gaps > 0)
            GROUP BY run, stage, blk, bin""", args).fetchnumpy()
    if summary is None:
        summary = {(r, st): (w, t) for r, st, w, t in con.execute(
            "SELECT run_id, stage, window_s, output_tokens_in_window FROM stage_summary "
            "WHERE list_contains(?, run_id) AND class_name = ?", [run_ids, class_name]).fetchall()}
    r_run, r_stage = np.asarray(req["run"], dtype=np.int64), np.asarray(req["stage"], dtype=np.int64)
    b_run, b_stage = np.asarray(bins["run"], dtype=np.int64), np.asarray(bins["stage"], dtype=np.int64)
    stages = np.array(sorted({st for _, st in summary} | set(np.unique(r_stage).tolist())), dtype=np.int64)
    segs = len(run_ids) * max(stages.size, 1)
    # Requests: ordered by (run, stage), so a segment's rows are one slice.
    r_seg = r_run * stages.size + np.searchsorted(stages, r_stage)
    bounds = np.searchsorted(r_seg, np.arange(segs + 1))
    # Bucket codes sort as their values do (negative codes below zero's, zero's below positive)
    # and span at most about a million codes, so a count over that range numbers them in order
    # without sorting millions of rows.
    codes = np.asarray(bins["bin"], dtype=np.int64)
    low = int(codes.min()) if codes.size else 0
    present = np.bincount(codes - low) > 0
    uniq, col = np.nonzero(present)[0] + low, (np.cumsum(present) - 1)[codes - low]
    # Bucket rows grouped by (run, stage) with one stable sort, so each stage's matrix is built
    # from its own rows only (memory: one group's stage at a time, not the campaign's).
    b_seg = b_run * stages.size + np.searchsorted(stages, b_stage)
    order = np.argsort(b_seg, kind="stable")
    sketch = {"bounds": np.searchsorted(b_seg[order], np.arange(segs + 1)), "col": col[order],
              "blk": np.asarray(bins["blk"], dtype=np.int64)[order], "n": np.asarray(bins["n"], dtype=float)[order]}
    del bins, codes, col, b_seg, order
    values = np.array([v for (v,) in con.execute(
        "SELECT servelab_sketch_value(b) FROM unnest(?::INTEGER[]) WITH ORDINALITY t(b, i) ORDER BY i",
        [uniq.tolist()]).fetchall()], dtype=float)
    columns = {k: np.ma.filled(np.ma.asarray(req[k], dtype=float), np.nan) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
    flags = {k: np.ma.filled(np.ma.asarray(req[k]), False).astype(bool) for k in ("ok", "slo_met")}
    blk = np.asarray(req["blk"], dtype=np.int64)
    position = {r: i for i, r in enumerate(run_ids)}
    out = {}
    for gi, members in enumerate(groups):
        for si, stage in enumerate(stages.tolist()):
            if any((r, stage) in summary for r in members):
                seg = [position[r] * stages.size + si for r in members]
                out[(gi, stage)] = _stage_from_rows(seg, [summary.get((r, stage), (None, None)) for r in members],
                                                    bounds, columns, flags, blk, sketch, values)
    return out


def _stage_from_rows(seg, windows, bounds, columns, flags, blk, sketch, values) -> StageData:
    rows = [np.arange(bounds[s], bounds[s + 1]) for s in seg]
    sizes = [r.size for r in rows]
    # Blocks of a run: 0..min(n, BLOCKS)-1 (rank % BLOCKS); pooled numbering offsets them per run.
    run_blocks = [min(n, BLOCKS) for n in sizes]
    offsets = np.concatenate([[0], np.cumsum(run_blocks)]).astype(np.int64)
    take = np.concatenate(rows)
    picks = [np.arange(sketch["bounds"][s], sketch["bounds"][s + 1]) for s in seg]
    b_row = np.concatenate([sketch["blk"][p] + offsets[j] for j, p in enumerate(picks)])
    b_col = np.concatenate([sketch["col"][p] for p in picks])
    used, local = np.unique(b_col, return_inverse=True)  # the buckets this group's stage uses
    matrix = np.bincount(b_row * used.size + local, weights=np.concatenate([sketch["n"][p] for p in picks]),
                         minlength=int(offsets[-1]) * used.size).reshape(int(offsets[-1]), used.size)
    return StageData(
        run_sizes=sizes, windows=np.array([w if w else np.nan for w, _ in windows], dtype=float),
        window_tokens=np.array([t or 0.0 for _, t in windows], dtype=float),
        ok=flags["ok"][take], slo_met=flags["slo_met"][take], columns={k: c[take] for k, c in columns.items()},
        itl_values=np.zeros(0), itl_request=np.zeros(0, dtype=np.int64), itl_tokens=np.zeros(0, dtype=np.int64),
        itl_bin_values=values[used], itl_bins=matrix,
        blocks=np.concatenate([blk[r] + offsets[j] for j, r in enumerate(rows)]), run_blocks=run_blocks)


def _cumulative_quantile(sorted_values, cum, q, total):
    """quantile_cont of each row's multiset, from its cumulative counts over `sorted_values`."""
    h = (total - 1) * q
    lo = np.floor(h)
    hi = np.minimum(lo + 1, total - 1)
    i_lo = np.minimum((cum <= lo[:, None]).sum(axis=1), sorted_values.size - 1)
    i_hi = np.minimum((cum <= hi[:, None]).sum(axis=1), sorted_values.size - 1)
    a, b = sorted_values[i_lo], sorted_values[i_hi]
    with np.errstate(invalid="ignore"):
        val = np.where((a == b) | (h == lo), a, a + (b - a) * (h - lo))
    return np.where(total > 0, val, np.nan)


def _block_quantile(values, blk, v, q):
    """quantile_cont of each resample (row of v: block multiplicities) over sorted `values`, whose
    requests lie in blocks `blk`. A resample's order statistics lie near the point's, so only a
    window of ranks around q is expanded into per-request weights; the count before the window is
    one product with the blocks' counts there, and a resample whose ranks fall outside the window
    is recomputed over every rank (exact either way)."""
    n, K = values.size, v.shape[1]
    if n == 0:
        return np.full(v.shape[0], np.nan)
    total = v @ np.bincount(blk, minlength=K)
    half = int(max(64, 5 * np.sqrt(n * q * (1 - q))))
    s = max(0, int(q * (n - 1)) - half)
    e = min(n, int(q * (n - 1)) + half + 2)
    before = v @ np.bincount(blk[:s], minlength=K)
    cum = before[:, None] + np.cumsum(v[:, blk[s:e]], axis=1)
    h = (total - 1) * q
    inside = (np.floor(h) >= before) & (np.minimum(np.floor(h) + 1, total - 1) < cum[:, -1])
    out = _cumulative_quantile(values[s:e], cum, q, total)
    redo = np.nonzero(~inside & (total > 0))[0]
    if redo.size:
        out[redo] = _cumulative_quantile(values, np.cumsum(v[redo][:, blk], axis=1), q, total[redo])
    return out


class Estimator:
    """Every compared metric of one group at one stage, for the original sample (all weights 1,
    every run once) or for a bootstrap resample (block and run multiplicities)."""

    def __init__(self, data: StageData):
        self.data = data
        self.n = int(data.ok.size)
        self.blocks = data.blocks if data.blocks is not None else np.arange(self.n, dtype=np.int64)
        self.run_blocks = data.run_blocks if data.run_blocks is not None else list(data.run_sizes)
        self.k = int(sum(self.run_blocks))
        self.block_requests = np.bincount(self.blocks, minlength=self.k)
        self.block_met = np.bincount(self.blocks, weights=data.slo_met, minlength=self.k)
        self.block_failed = np.bincount(self.blocks, weights=~data.ok, minlength=self.k)
        self.sorted = {}
        for name, values in data.columns.items():
            usable = data.ok & ~np.isnan(values)
            idx = np.nonzero(usable)[0]
            # Any order among ties: tied values are one value, whichever block each belongs to.
            order = idx[np.argsort(values[idx])]
            self.sorted[name] = (values[order], self.blocks[order])
        order = np.argsort(data.itl_values, kind="stable")
        self.itl_sorted = (data.itl_values[order], self.blocks[data.itl_request[order]], data.itl_tokens[order])

    def evaluate(self, block_counts: np.ndarray, run_counts: np.ndarray, itl: bool = True) -> dict[str, np.ndarray]:
        """block_counts: (B, blocks) multiplicities; run_counts: (B, runs); itl=False skips the ITL
        percentiles (NaN), the costly ones where they read every chunk gap (--exact)."""
        d = self.data
        v = block_counts.astype(np.int64)
        out: dict[str, np.ndarray] = {}
        for metric, (column, q) in PERCENTILES.items():
            if column == "itl" and not itl:
                out[metric] = np.full(v.shape[0], np.nan)
            elif column == "itl" and d.itl_bins is not None:
                # A resample's merged sketch: each bucket's count summed over the drawn blocks.
                merged = np.rint(v.astype(float) @ d.itl_bins).astype(np.int64)
                cum = np.cumsum(merged, axis=1)
                total = cum[:, -1] if cum.shape[1] else np.zeros(v.shape[0], dtype=np.int64)
                out[metric] = (_cumulative_quantile(d.itl_bin_values, cum, q, total) if d.itl_bin_values.size
                               else np.full(v.shape[0], np.nan))
            elif column == "itl":
                values, blk, k = self.itl_sorted
                out[metric] = weighted_quantiles(values, v[:, blk] * k[None, :], [q])[:, 0]
            else:
                values, blk = self.sorted[column]
                out[metric] = _block_quantile(values, blk, v, q)
        total = (v @ self.block_requests).astype(float)
        met = v @ self.block_met
        failed = v @ self.block_failed
        window = (run_counts * np.nan_to_num(d.windows, nan=0.0)[None, :]).sum(axis=1)
        tokens = (run_counts * d.window_tokens[None, :]).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["slo_attainment"] = np.where(total > 0, met / total, np.nan)
            out["error_rate"] = np.where(total > 0, failed / total, np.nan)
            out["goodput"] = np.where(window > 0, met / window, np.nan)
            out["output_tokens_per_s"] = np.where(window > 0, tokens / window, np.nan)
        return out

    def point(self) -> dict[str, float]:
        res = self.evaluate(np.ones((1, self.k), dtype=np.int64), np.ones((1, len(self.data.run_sizes)), dtype=np.int64))
        return {k: float(v[0]) for k, v in res.items()}

    def resample(self, rng: np.random.Generator, boot: int) -> dict[str, np.ndarray]:
        """Runs drawn with replacement (a group of repeats), then, within each drawn run, as many
        blocks as it has, once per time the run was drawn."""
        runs = len(self.data.run_sizes)
        starts = np.concatenate([[0], np.cumsum(self.run_blocks)]).astype(np.int64)
        block_counts = np.zeros((boot, self.k), dtype=np.int32)
        if runs > 1:
            run_counts = rng.multinomial(runs, np.full(runs, 1 / runs), size=boot)
        else:
            run_counts = np.ones((boot, 1), dtype=np.int64)
        for j in range(runs):
            size = self.run_blocks[j]
            if size == 0:
                continue
            for times in np.unique(run_counts[:, j]):
                rows = np.nonzero(run_counts[:, j] == times)[0]
                if times:
                    # One bincount for all these resamples: draw r's blocks are offset by r * size.
                    draws = rng.integers(0, size, size=(rows.size, times * size))
                    draws += (np.arange(rows.size) * size)[:, None]
                    block_counts[rows, starts[j]:starts[j + 1]] = np.bincount(
                        draws.ravel(), minlength=rows.size * size).reshape(rows.size, size)
        # Batches of about 4M cells in the widest (batch x columns) matrix. --exact's ITL reads every
        # chunk gap per resample, so a stage with millions of gaps gets fewer ITL resamples (at
        # least 50; about 4e8 cell operations in all).
        gaps = self.itl_sorted[0].size
        bins = 0 if self.data.itl_bins is None else self.data.itl_bins.shape[1]
        step = max(1, 4_000_000 // max(self.k, gaps, bins, 1))
        itl_boot = min(boot, max(50, int(4e8 // max(gaps, 1))))
        parts = [self.evaluate(block_counts[i:i + step], run_counts[i:i + step], itl=i < itl_boot)
                 for i in range(0, boot, step)]
        out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if runs == 1:
            # One run: its window and token count are fixed, so the bootstrap says nothing about the
            # run-to-run noise of throughput; leave it unknown rather than falsely exact.
            out["output_tokens_per_s"] = np.full(boot, np.nan)
        return out
