"""The live window's arithmetic: the per-request metrics of a batch of workers' samples, gathered
in one-second buckets, and the figures of a set of buckets.

Every definition is the SQL views' own (README "Metrics"; analysis/10_request_metrics.sql,
22_itl_tokens.sql, 25_itl_stage_quantiles.sql, 30_stage_summary.sql), so a live figure and the
stored stage's figure differ only in which requests they count (here: those that finished in the
window, warm-up included, because the live view shows what is happening now):

- ok = no error_kind; a dropped open-loop arrival is no request (counted in ``dropped``).
- TTFT, TPOT = (E2E - TTFT) / (output_tokens - 1), E2E: percentiles (quantile_cont) over ok ones.
- ITL = the token view: each chunk gap g_i spread over the k_i tokens of the later chunk, pooled
  over ok requests, percentiles read from the same DDSketch buckets (1 %) as itl_stage_quantiles
  (store/db.py's SKETCH_* constants).
- output tokens: coalesce(usage output_tokens, the chunks' token count) of every request.
- slo_met = ok and every SLO its class sets is met (TTFT, TPOT, worst per-token gap, E2E);
  goodput = slo_met requests / s; SLO attainment = slo_met / requests (failures included).

A sample is what ``worker/recorder.py`` ships per request: (class_name, error_kind, ttft_ms,
e2e_ms, output_tokens, chunk_offsets_ms, chunk_tokens, arrival_status).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from servelab.core.quantiles import quantiles_cont
from servelab.store.db import SKETCH_GAMMA, SKETCH_NEGATIVE_BASE, SKETCH_ZERO_BIN

GAMMA = SKETCH_GAMMA
_LN_GAMMA = math.log(GAMMA)
ZERO_BIN = SKETCH_ZERO_BIN  # the bucket of a 0 gap
QS = (0.5, 0.99)
# A bucket's ITL sketch is a dense histogram over the bins of gaps from 1e-3 ms to 1e7 ms (the
# others, 0 and negative gaps included, in a Counter): adding a batch is one bincount, and a
# window's figure sums ten small arrays. Sorting the pooled bins instead (np.unique) took 20-50
# ms a second at 256 streams, in the event loop the streams are read in: it doubled ITL p99.
DENSE_LO = -400
DENSE_SPAN = 1300


class Bucket:
    """What the requests reported in one second contribute to the figures."""

    __slots__ = ("requests", "completed", "dropped", "errors", "ttft", "tpot", "e2e", "itl_hist",
                 "itl_other", "output_tokens", "slo_met", "classes")

    def __init__(self):
        self.requests = self.completed = self.dropped = self.slo_met = 0
        self.errors: Counter = Counter()
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.e2e: list[float] = []
        self.itl_hist: np.ndarray | None = None   # bin - DENSE_LO -> samples
        self.itl_other: Counter = Counter()        # bins outside the dense range -> samples
        self.output_tokens = 0.0
        self.classes: dict[str, list[int]] = {}   # class -> [requests, slo_met]


def sketch_bins(v: np.ndarray) -> np.ndarray:
    """store/db.py's bucket of each finite value: ceil(log_gamma v), 0 -> ZERO_BIN, v < 0 below."""
    out = np.full(v.shape, ZERO_BIN, dtype=np.int64)
    pos, neg = v > 0, v < 0
    out[pos] = np.ceil(np.log(v[pos]) / _LN_GAMMA)
    out[neg] = SKETCH_NEGATIVE_BASE - np.ceil(np.log(-v[neg]) / _LN_GAMMA)
    return out


def bin_values(bins: np.ndarray) -> np.ndarray:
    """servelab_sketch_value: the value a bucket stands for (2 gamma^i / (gamma + 1))."""
    b = bins.astype(np.float64)
    return np.where(bins == ZERO_BIN, 0.0,
                    np.where(bins < ZERO_BIN,
                             -2 * GAMMA ** (SKETCH_NEGATIVE_BASE - b) / (GAMMA + 1),
                             2 * GAMMA ** np.minimum(b, 1e6) / (GAMMA + 1)))


def add_itl(bucket: Bucket, bins: np.ndarray, counts: np.ndarray) -> None:
    """Samples (bins, counts) into the bucket's histogram."""
    i = bins - DENSE_LO
    dense = (i >= 0) & (i < DENSE_SPAN)
    hist = np.bincount(i[dense], weights=counts[dense], minlength=DENSE_SPAN)
    bucket.itl_hist = hist if bucket.itl_hist is None else bucket.itl_hist + hist
    if not dense.all():
        for b, c in zip(bins[~dense].tolist(), counts[~dense].tolist()):
            bucket.itl_other[b] += c


def itl_quantiles(buckets: list[Bucket], qs=QS) -> list[float | None]:
    """The pooled ITL sketch of ``buckets``, read as itl_stage_quantiles reads its sketch."""
    hists = [b.itl_hist for b in buckets if b.itl_hist is not None]
    other: Counter = Counter()
    for b in buckets:
        other.update(b.itl_other)
    if not hists and not other:
        return [None for _ in qs]
    hist = np.sum(hists, axis=0) if hists else np.zeros(DENSE_SPAN)
    used = np.flatnonzero(hist)
    bins = np.concatenate((used + DENSE_LO, np.fromiter(other, np.int64, len(other))))
    n = np.concatenate((hist[used], np.fromiter(other.values(), np.float64, len(other))))
    order = np.argsort(bins, kind="stable")
    return sorted_quantiles(bins[order], n[order], qs)


def sorted_quantiles(uniq: np.ndarray, n: np.ndarray, qs=QS) -> list[float | None]:
    """itl_stage_quantiles' percentile over distinct sorted bins ``uniq`` with counts ``n``:
    quantile_cont's interpolation between the order statistics at floor(h) and floor(h)+1
    (h = (total-1) q), each read from its bucket."""
    if uniq.size == 0:
        return [None for _ in qs]
    cum = np.cumsum(n)
    total = cum[-1]
    if total <= 0:
        return [None for _ in qs]
    values = bin_values(uniq)
    out = []
    for q in qs:
        h = (total - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, total - 1)
        a, b = values[np.searchsorted(cum, [lo, hi], side="right")]
        out.append(float(a + (b - a) * (h - lo)))
    return out


def _weights(offsets: list, tokens: list | None) -> list:
    """chunk_weights' source: chunk_tokens[i] per chunk (NULL past its end)."""
    if tokens is not None and len(tokens) == len(offsets):
        return tokens
    tokens = list(tokens or ())[:len(offsets)]
    return tokens + [None] * (len(offsets) - len(tokens))


def _chunks(samples: list) -> tuple[list, list, np.ndarray, np.ndarray]:
    """Per request with chunks: the chunk token total and the worst per-token gap; and the pooled
    token-view ITL buckets of the ok ones (values, counts)."""
    idx = [i for i, s in enumerate(samples) if s[5]]
    totals: list = [None] * len(samples)
    worst: list = [None] * len(samples)
    if not idx:
        return totals, worst, np.empty(0, np.int64), np.empty(0)
    lens = np.fromiter((len(samples[i][5]) for i in idx), np.int64, len(idx))
    size = int(lens.sum())
    flat: list = []
    for i in idx:   # list concatenation and one conversion: the cheapest way into numpy
        flat += samples[i][5]
    offs = np.array(flat, dtype=np.float64)
    k = np.ones(size)
    at = 0
    for i, n in zip(idx, lens.tolist()):
        tokens = samples[i][6]
        # the usual case, one token per chunk, costs a C-level count and no conversion
        if not (tokens and len(tokens) == n and tokens.count(1) == n):
            k[at:at + n] = np.array(_weights(samples[i][5], tokens), dtype=np.float64)
        at += n
    k = np.maximum(np.nan_to_num(k, nan=1.0), 1.0)      # greatest(coalesce(k, 1), 1)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    for j, tot in zip(idx, np.add.reduceat(k, starts)):
        totals[j] = float(tot)
    valid = np.ones(max(size - 1, 0), dtype=bool)
    valid[(starts[1:] - 1)] = False                    # a gap across two requests is no gap
    per_token = (np.diff(offs) / k[1:])[valid]
    weight = k[1:][valid]
    gaps = np.maximum(lens - 1, 0)
    gap_starts = np.concatenate(([0], np.cumsum(gaps)[:-1]))
    ok_mask = np.zeros(per_token.size, dtype=bool)
    with_gaps = gaps > 0
    if with_gaps.any():
        maxima = np.maximum.reduceat(per_token, gap_starts[with_gaps]) if per_token.size else []
        for j, m in zip(np.asarray(idx)[with_gaps], maxima):
            worst[j] = float(m)
        for j, s0, g in zip(idx, gap_starts, gaps):
            if g and samples[j][1] is None:
                ok_mask[s0:s0 + g] = True
    ok_mask &= np.isfinite(per_token)
    return totals, worst, sketch_bins(per_token[ok_mask]), weight[ok_mask]


def _slo_met(slo, ttft, tpot, out, worst, e2e) -> bool:
    """request_metrics.slo_met for an ok request; ``slo`` = (ttft, tpot, itl, e2e) ms or None."""
    if slo is None:
        return True
    s_ttft, s_tpot, s_itl, s_e2e = slo
    if s_ttft is not None and not (ttft is not None and ttft <= s_ttft):
        return False
    if s_tpot is not None and out is not None and out > 1 and not (tpot is not None
                                                                   and tpot <= s_tpot):
        return False
    if s_itl is not None and worst is not None and worst > s_itl:
        return False
    return s_e2e is None or (e2e is not None and e2e <= s_e2e)


def add_samples(bucket: Bucket, samples: list, slos: dict) -> None:
    """One batch's samples into ``bucket`` (``slos``: class -> (ttft, tpot, itl, e2e) ms)."""
    totals, worst, bins, counts = _chunks(samples)
    if bins.size:
        add_itl(bucket, bins, counts)
    for s, total, w in zip(samples, totals, worst):
        cls, error_kind, ttft, e2e, out = s[0] or "(none)", s[1], s[2], s[3], s[4]
        if s[7] == "dropped":
            bucket.dropped += 1
            continue
        if total is not None:
            bucket.output_tokens += out if out is not None else total
        bucket.requests += 1
        c = bucket.classes.get(cls)
        if c is None:
            c = bucket.classes[cls] = [0, 0]
        c[0] += 1
        if error_kind is not None:
            bucket.errors[error_kind] += 1
            continue
        bucket.completed += 1
        tpot = (e2e - ttft) / (out - 1) if (out is not None and out > 1 and e2e is not None
                                            and ttft is not None) else None
        if ttft is not None:
            bucket.ttft.append(ttft)
        if e2e is not None:
            bucket.e2e.append(e2e)
        if tpot is not None:
            bucket.tpot.append(tpot)
        if _slo_met(slos.get(cls), ttft, tpot, out, w, e2e):
            bucket.slo_met += 1
            c[1] += 1


def quantiles(values: list, qs=QS) -> list[float | None]:
    # None, not NaN: the view is JSON
    return [None if x != x else x for x in quantiles_cont(values, qs)]


def quantile(values: list, q: float) -> float | None:
    return quantiles(values, (q,))[0]


def figures(buckets: list[Bucket], span_s: float) -> dict:
    """The figures of the requests in ``buckets``, rates over ``span_s`` seconds."""
    ttft = [x for b in buckets for x in b.ttft]
    tpot = [x for b in buckets for x in b.tpot]
    e2e = [x for b in buckets for x in b.e2e]
    itl = itl_quantiles(buckets)
    ttft_p50, ttft_p99 = quantiles(ttft, (0.5, 0.99))
    requests = sum(b.requests for b in buckets)
    slo_met = sum(b.slo_met for b in buckets)
    errors: Counter = Counter()
    classes: dict[str, list[int]] = {}
    for b in buckets:
        errors.update(b.errors)
        for cls, (n, met) in b.classes.items():
            c = classes.setdefault(cls, [0, 0])
            c[0] += n
            c[1] += met
    per_s = 1.0 / span_s if span_s > 0 else None

    def rate(x):
        return None if per_s is None else x * per_s

    return {
        "requests": requests, "completed": sum(b.completed for b in buckets),
        "errors": sum(errors.values()), "errors_by_kind": dict(errors),
        "dropped": sum(b.dropped for b in buckets),
        "ttft_p50_ms": ttft_p50, "ttft_p99_ms": ttft_p99,
        "itl_p50_ms": itl[0], "itl_p99_ms": itl[1],
        "tpot_p50_ms": quantile(tpot, 0.5), "e2e_p50_ms": quantile(e2e, 0.5),
        "output_tokens_per_s": rate(sum(b.output_tokens for b in buckets)),
        "requests_per_s": rate(requests), "errors_per_s": rate(sum(errors.values())),
        "goodput": rate(slo_met), "slo_attainment": slo_met / requests if requests else None,
        "classes": {cls: {"requests": n, "slo_met_requests": met, "goodput": rate(met),
                          "slo_attainment": met / n if n else None}
                    for cls, (n, met) in sorted(classes.items())},
    }
