"""Every view's figures computed again in plain Python from the raw rows of analysis_rows.py,
following the definitions in the view files' header comments (not the SQL). Percentiles use
the linear interpolation of DuckDB's quantile_cont, implemented here from scratch."""
from __future__ import annotations

import math
from collections import defaultdict

INF = math.inf
QS = (0.5, 0.9, 0.95, 0.99)


def quantile(values, q):
    """Linear interpolation between order statistics floor(h), floor(h)+1 with h = (n-1)q."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    h = (len(v) - 1) * q
    lo = int(math.floor(h))
    hi = min(lo + 1, len(v) - 1)
    a, b = v[lo], v[hi]
    if a == b or h == lo:
        return a
    return a + (b - a) * (h - lo)


def mean(values):
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def index_by(rows, *keys):
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def request_metrics(data):
    stages = index_by(data["stages"], "run_id", "stage")
    classes = index_by(data["run_classes"], "run_id", "class_name")
    out = {}
    for q in data["requests"]:
        ok = q["error_kind"] is None
        offsets = q["chunk_offsets_ms"] or []
        weights = [max(k if k is not None else 1, 1) for k in (q["chunk_tokens"] or [])][: len(offsets)]
        weights += [1] * (len(offsets) - len(weights))
        gaps = [offsets[i] - offsets[i - 1] for i in range(1, len(offsets))]
        per_token = [g / k for g, k in zip(gaps, weights[1:])]
        ttft = q["ttft_ms"] if q["ttft_ms"] is not None else (
            1000 * (q["first_token_unix"] - q["sent_unix"]) if q["first_token_unix"] is not None else None)
        e2e = q["e2e_ms"] if q["e2e_ms"] is not None else (
            1000 * (q["last_token_unix"] - q["sent_unix"]) if q["last_token_unix"] is not None else None)
        out_tokens = q["output_tokens"]
        tpot = (e2e - ttft) / (out_tokens - 1) if (out_tokens is not None and out_tokens > 1) else None
        st = stages.get((q["run_id"], q["stage"]))
        t_in = q["sent_unix"] if q["sent_unix"] is not None else q["scheduled_unix"]
        measured = bool(st and not q["warmup"] and t_in is not None
                        and st["measure_start_unix"] <= t_in < st["measure_end_unix"])
        c = classes.get((q["run_id"], q["class_name"]), {})
        itl_max = max(per_token) if per_token else None

        def judge(slo, passed):
            if slo is None:
                return None
            return ok and passed

        ttft_met = judge(c.get("slo_ttft_ms"), ttft is not None and c.get("slo_ttft_ms") is not None and ttft <= c["slo_ttft_ms"])
        tpot_met = judge(c.get("slo_tpot_ms"), tpot is None or (c.get("slo_tpot_ms") is not None and tpot <= c["slo_tpot_ms"]))
        itl_met = judge(c.get("slo_itl_ms"), itl_max is None or (c.get("slo_itl_ms") is not None and itl_max <= c["slo_itl_ms"]))
        e2e_met = judge(c.get("slo_e2e_ms"), e2e is not None and c.get("slo_e2e_ms") is not None and e2e <= c["slo_e2e_ms"])
        slo_met = ok and all(m is not False for m in (ttft_met, tpot_met, itl_met, e2e_met))
        sched = q["scheduled_unix"]
        out[(q["run_id"], q["request_id"])] = dict(
            run_id=q["run_id"], request_id=q["request_id"], class_name=q["class_name"], stage=q["stage"],
            ok=ok, dropped=q["arrival_status"] == "dropped", measured=measured, ttft_ms=ttft, e2e_ms=e2e,
            tpot_ms=tpot,
            send_lag_ms=1000 * (q["sent_unix"] - sched) if (sched is not None and q["sent_unix"] is not None) else None,
            ttft_sched_ms=1000 * (q["first_token_unix"] - sched) if (sched is not None and q["first_token_unix"] is not None) else None,
            e2e_sched_ms=1000 * (q["last_token_unix"] - sched) if (sched is not None and q["last_token_unix"] is not None) else None,
            n_chunks=len(offsets), chunk_tokens_total=sum(weights) if offsets else None,
            tokens_per_chunk=sum(weights) / len(offsets) if offsets else None,
            itl_chunk_mean_ms=mean(gaps), itl_mean_ms=sum(gaps) / sum(weights[1:]) if gaps else None,
            itl_max_ms=itl_max, ttft_slo_met=ttft_met, tpot_slo_met=tpot_met, itl_slo_met=itl_met,
            e2e_slo_met=e2e_met, slo_met=slo_met, output_tokens=out_tokens, prompt_tokens=q["prompt_tokens"],
            cached_tokens=q["cached_tokens"], arrival_status=q["arrival_status"], error_kind=q["error_kind"],
            sent_unix=q["sent_unix"], offsets=offsets, weights=weights, gaps=gaps, per_token=per_token,
        )
    return out


def chunks(data):
    """One dict per content chunk: the chunk_arrivals view."""
    rows = []
    for m in request_metrics(data).values():
        total = sum(m["weights"])
        for i, (off, k) in enumerate(zip(m["offsets"], m["weights"])):
            usage = m["output_tokens"] if m["output_tokens"] is not None else total
            rows.append(dict(run_id=m["run_id"], request_id=m["request_id"], class_name=m["class_name"],
                             stage=m["stage"], measured=m["measured"], ok=m["ok"], chunk_index=i + 1,
                             arrival_unix=m["sent_unix"] + off / 1000, tokens=k, usage_tokens=k * usage / total,
                             gap_ms=m["gaps"][i - 1] if i else None))
    return rows


def _groups(rows, key_fn):
    """Rows per (run, stage, class) and per (run, stage, '(all)')."""
    out = defaultdict(list)
    for r in rows:
        run, stage, cls = key_fn(r)
        out[(run, stage, cls if cls is not None else "(none)")].append(r)
        out[(run, stage, "(all)")].append(r)
    return out


def stage_summary(data):
    rm = request_metrics(data)
    ch = chunks(data)
    runs = index_by(data["runs"], "run_id")
    counted = _groups([m for m in rm.values() if m["measured"] and not m["dropped"]],
                      lambda m: (m["run_id"], m["stage"], m["class_name"]))
    dropped = _groups([m for m in rm.values() if m["measured"] and m["dropped"]],
                      lambda m: (m["run_id"], m["stage"], m["class_name"]))
    gaps = _groups([c for c in ch if c["gap_ms"] is not None and c["measured"] and c["ok"]],
                   lambda c: (c["run_id"], c["stage"], c["class_name"]))
    window_tokens = defaultdict(float)
    window_keys = set()
    for st in data["stages"]:
        for c in ch:
            if c["run_id"] == st["run_id"] and st["measure_start_unix"] <= c["arrival_unix"] < st["measure_end_unix"]:
                cls = c["class_name"] if c["class_name"] is not None else "(none)"
                for key in ((st["run_id"], st["stage"], cls), (st["run_id"], st["stage"], "(all)")):
                    window_tokens[key] += c["usage_tokens"]
                    window_keys.add(key)
    keys = {(s["run_id"], s["stage"], "(all)") for s in data["stages"]} | set(counted) | set(dropped) | window_keys
    stages = index_by(data["stages"], "run_id", "stage")
    out = {}
    for key in keys:
        run, stage, cls = key
        st = stages[(run, stage)]
        window = st["measure_end_unix"] - st["measure_start_unix"]
        reqs = counted.get(key, [])
        okr = [m for m in reqs if m["ok"]]
        per_token = [v for c in gaps.get(key, []) for v in [c["gap_ms"] / c["tokens"]] * c["tokens"]]
        chunk_gaps = [c["gap_ms"] for c in gaps.get(key, [])]
        errors = [m["error_kind"] for m in reqs if not m["ok"]]
        met = sum(1 for m in reqs if m["slo_met"])
        ttft_adj = [m["ttft_ms"] if m["ok"] else INF for m in reqs]
        e2e_adj = [m["e2e_ms"] if m["ok"] else INF for m in reqs]
        tpot_mean = mean([m["tpot_ms"] for m in okr])
        gpus = runs[run]["gpus"]
        tokens = window_tokens.get(key, 0.0)

        def share(name):
            judged = [m[name] for m in reqs if m[name] is not None]
            return sum(judged) / len(judged) if judged else None

        row = dict(
            kind=st["kind"], level=st["level"], window_s=window, requests=len(reqs), completed=len(okr),
            errors=len(errors), errors_by_kind={k: errors.count(k) for k in set(errors)} or None,
            dropped=len(dropped.get(key, [])), late=sum(1 for m in reqs if m["arrival_status"] == "late"),
            ttft_mean_ms=mean([m["ttft_ms"] for m in okr]),
            itl_mean_ms=mean(per_token), itl_chunk_mean_ms=mean(chunk_gaps),
            tpot_mean_ms=tpot_mean, e2e_mean_ms=mean([m["e2e_ms"] for m in okr]),
            send_lag_max_ms=max([m["send_lag_ms"] for m in reqs if m["send_lag_ms"] is not None], default=None),
            prompt_tokens_mean=mean([m["prompt_tokens"] for m in okr]),
            output_tokens_mean=mean([m["output_tokens"] for m in okr]),
            tokens_per_chunk_mean=mean([m["tokens_per_chunk"] for m in okr]),
            output_tokens_in_window=tokens, output_tokens_per_s=tokens / window,
            output_tokens_per_s_per_gpu=tokens / window / gpus if gpus else None,
            output_tokens_per_s_per_user=1000 / tpot_mean if tpot_mean else None,
            requests_per_s=len(reqs) / window, completed_per_s=len(okr) / window,
            slo_met_requests=met, goodput=met / window,
            slo_attainment=met / len(reqs) if reqs else None,
            ttft_slo_attainment=share("ttft_slo_met"), tpot_slo_attainment=share("tpot_slo_met"),
            itl_slo_attainment=share("itl_slo_met"), e2e_slo_attainment=share("e2e_slo_met"),
            error_rate=len(errors) / len(reqs) if reqs else None,
        )
        cached = [(m["cached_tokens"], m["prompt_tokens"]) for m in reqs if m["cached_tokens"] is not None]
        row["cached_prompt_share"] = (sum(c for c, _ in cached) / sum(p for _, p in cached)) if cached else None
        for name, values in (("ttft", [m["ttft_ms"] for m in okr]), ("tpot", [m["tpot_ms"] for m in okr]),
                             ("e2e", [m["e2e_ms"] for m in okr]), ("itl", per_token)):
            for q in QS:
                row[f"{name}_p{round(q * 100)}_ms"] = quantile(values, q)
        for q in (0.5, 0.99):
            row[f"itl_chunk_p{round(q * 100)}_ms"] = quantile(chunk_gaps, q)
            row[f"send_lag_p{round(q * 100)}_ms"] = quantile([m["send_lag_ms"] for m in reqs], q)
            row[f"ttft_sched_p{round(q * 100)}_ms"] = quantile([m["ttft_sched_ms"] for m in okr], q)
            row[f"e2e_sched_p{round(q * 100)}_ms"] = quantile([m["e2e_sched_ms"] for m in okr], q)
        for q in (0.5, 0.9, 0.99):
            row[f"ttft_p{round(q * 100)}_adj_ms"] = quantile(ttft_adj, q)
            row[f"e2e_p{round(q * 100)}_adj_ms"] = quantile(e2e_adj, q)
        out[key] = row
    return out


def server_timeline(data):
    """Per (run, second): the definitions of server_series + server_timeline."""
    wanted = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "gpu_cache_usage_perc",
              "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
              "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_decode_num_drafts_total",
              "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"}
    kept = {}
    for m in data["server_metrics"]:
        base = m["name"].split(":", 1)[1] if m["name"].startswith("vllm:") else m["name"][5:] if m["name"].startswith("vllm_") else None
        if base not in wanted:
            continue
        key = (m["run_id"], base, tuple(sorted(m["labels"].items())), math.floor(m["t_unix"]))
        if key not in kept or m["t_unix"] > kept[key][0]:
            kept[key] = (m["t_unix"], m["value"])
    series = defaultdict(list)
    for (run, name, labels, second), (t, v) in kept.items():
        series[(run, name, labels)].append((second, t, v))
    rows = defaultdict(lambda: defaultdict(list))  # (run, second) -> name -> [(value, delta, dt, t)]
    for (run, name, labels), points in series.items():
        points.sort()
        prev = None
        for second, t, v in points:
            delta = dt = None
            if prev is not None:
                delta = v - prev[2] if v - prev[2] >= 0 else v
                dt = t - prev[1]
            rows[(run, second)][name].append((v, delta, dt, t))
            prev = (second, t, v)
    out = {}
    for (run, second), by_name in rows.items():
        def gsum(n):
            vals = [x[0] for x in by_name.get(n, [])]
            return sum(vals) if vals else None

        def dsum(n):
            vals = [x[1] for x in by_name.get(n, []) if x[1] is not None]
            return sum(vals) if vals else None

        def rsum(n):
            vals = [x[1] / x[2] for x in by_name.get(n, []) if x[1] is not None]
            return sum(vals) if vals else None

        kv = [x[0] for x in by_name.get("kv_cache_usage_perc", [])] or [x[0] for x in by_name.get("gpu_cache_usage_perc", [])]
        row = dict(
            sample_unix=max(x[3] for xs in by_name.values() for x in xs),
            running=gsum("num_requests_running"), waiting=gsum("num_requests_waiting"),
            engines=len(by_name.get("num_requests_running", [])),
            kv_cache_usage=mean(kv), kv_cache_usage_max=max(kv) if kv else None,
            preemptions=dsum("num_preemptions_total"), preemptions_per_s=rsum("num_preemptions_total"),
            prompt_tokens_per_s=rsum("prompt_tokens_total"), generation_tokens=dsum("generation_tokens_total"),
            generation_tokens_per_s=rsum("generation_tokens_total"),
            prefix_cache_queries=dsum("prefix_cache_queries_total"), prefix_cache_hits=dsum("prefix_cache_hits_total"),
            spec_drafts=dsum("spec_decode_num_drafts_total"), spec_draft_tokens=dsum("spec_decode_num_draft_tokens_total"),
            spec_accepted_tokens=dsum("spec_decode_num_accepted_tokens_total"),
        )
        row["prefix_cache_hit_rate"] = (row["prefix_cache_hits"] / row["prefix_cache_queries"]
                                        if row["prefix_cache_hits"] is not None and row["prefix_cache_queries"] else None)
        row["spec_acceptance_rate"] = (row["spec_accepted_tokens"] / row["spec_draft_tokens"]
                                       if row["spec_accepted_tokens"] is not None and row["spec_draft_tokens"] else None)
        row["spec_mean_acceptance_length"] = (1 + row["spec_accepted_tokens"] / row["spec_drafts"]
                                              if row["spec_accepted_tokens"] is not None and row["spec_drafts"] else None)
        stage = None
        started = [s for s in data["stages"] if s["run_id"] == run and s["started_unix"] <= row["sample_unix"]]
        measured = False
        if started:
            s = max(started, key=lambda s: s["started_unix"])
            if row["sample_unix"] < s["ended_unix"]:
                stage = s["stage"]
            measured = s["measure_start_unix"] <= row["sample_unix"] < s["measure_end_unix"]
        row["stage"] = stage
        row["measured"] = measured
        out[(run, float(second))] = row
        out[(run, float(second))]["_series"] = by_name
    return out


def server_stage_summary(data):
    timeline = server_timeline(data)
    # per-series samples for counters
    kept = {}
    for m in data["server_metrics"]:
        base = m["name"].replace("vllm_", "vllm:", 1) if m["name"].startswith("vllm_") else m["name"]
        key = (m["run_id"], base, tuple(sorted(m["labels"].items())), math.floor(m["t_unix"]))
        if key not in kept or m["t_unix"] > kept[key][0]:
            kept[key] = (m["t_unix"], m["value"])
    series = defaultdict(list)
    for (run, name, labels, _), (t, v) in kept.items():
        series[(run, name, labels)].append((t, v))
    out = {}
    for st in data["stages"]:
        lo, hi = st["measure_start_unix"], st["measure_end_unix"]
        rows = [r for (run, _), r in timeline.items() if run == st["run_id"] and lo <= r["sample_unix"] < hi]
        res = dict(samples=len(rows))
        res["running_mean"] = mean([r["running"] for r in rows])
        res["running_max"] = max([r["running"] for r in rows if r["running"] is not None], default=None)
        res["waiting_mean"] = mean([r["waiting"] for r in rows])
        res["waiting_max"] = max([r["waiting"] for r in rows if r["waiting"] is not None], default=None)
        res["kv_cache_usage_mean"] = mean([r["kv_cache_usage"] for r in rows])
        res["kv_cache_usage_max"] = max([r["kv_cache_usage_max"] for r in rows if r["kv_cache_usage_max"] is not None], default=None)
        inc = defaultdict(float)
        present = set()
        span = None
        for (run, name, labels), points in series.items():
            if run != st["run_id"] or not name.endswith("_total"):
                continue
            points = sorted(points)
            # the delta of each in-window sample is taken against the series' previous sample
            idx = [i for i, (t, _) in enumerate(points) if lo <= t < hi]
            if len(idx) < 2:
                continue
            total = 0.0
            for i in idx[1:]:
                d = points[i][1] - points[i - 1][1]
                total += d if d >= 0 else points[i][1]
            inc[name] += total
            present.add(name)
            s = points[idx[-1]][0] - points[idx[0]][0]
            span = s if span is None else max(span, s)

        def get(n):
            return inc[n] if n in present else None

        res["span_s"] = span
        res["preemptions"] = get("vllm:num_preemptions_total")
        res["preemptions_per_s"] = res["preemptions"] / span if res["preemptions"] is not None and span else None
        gen = get("vllm:generation_tokens_total")
        res["generation_tokens_per_s"] = gen / span if gen is not None and span else None
        q, h = get("vllm:prefix_cache_queries_total"), get("vllm:prefix_cache_hits_total")
        res["prefix_cache_hit_rate"] = h / q if q else None
        d, dt, a = (get("vllm:spec_decode_num_drafts_total"), get("vllm:spec_decode_num_draft_tokens_total"),
                    get("vllm:spec_decode_num_accepted_tokens_total"))
        res["spec_acceptance_rate"] = a / dt if dt else None
        res["spec_mean_acceptance_length"] = 1 + a / d if d else None
        out[(st["run_id"], st["stage"])] = res
    return out


def slo_frontier(data, target=0.9):
    ss = stage_summary(data)
    out = {}
    keys = {(run, cls) for (run, _, cls) in ss}
    for run, cls in keys:
        rows = [r for (rr, _, c), r in ss.items() if rr == run and c == cls and r["requests"] > 0]
        if not rows:
            continue
        classes = [c for c in data["run_classes"] if c["run_id"] == run]
        slos = [c["slo_ttft_ms"] for c in classes if c["slo_ttft_ms"] is not None]
        slo = min(slos, default=None) if cls == "(all)" else next(
            (c["slo_ttft_ms"] for c in classes if c["class_name"] == cls), None)
        levels = sorted({r["level"] for r in rows})
        att = {lv: min(r["slo_attainment"] for r in rows if r["level"] == lv) for lv in levels}
        p99 = {lv: max(r["ttft_p99_adj_ms"] for r in rows if r["level"] == lv and r["ttft_p99_adj_ms"] is not None)
               for lv in levels if any(r["ttft_p99_adj_ms"] is not None for r in rows if r["level"] == lv)}
        good = {lv: min(r["goodput"] for r in rows if r["level"] == lv) for lv in levels}
        first_fail = next((lv for lv in levels if att[lv] < target), None)
        passing = [lv for lv in levels if att[lv] >= target and (first_fail is None or lv < first_fail)]
        knee = next((lv for lv in levels if slo is not None and lv in p99 and p99[lv] > slo), None)
        before = [lv for lv in levels if knee is not None and lv < knee]
        interp = None
        if before and knee is not None and math.isfinite(p99[knee]) and p99[knee] > p99[before[-1]]:
            a = before[-1]
            interp = a + (slo - p99[a]) * (knee - a) / (p99[knee] - p99[a])
        out[(run, cls)] = dict(levels=len(levels), min_level=levels[0], max_level=levels[-1],
                               max_level_meeting_target=passing[-1] if passing else None,
                               goodput_at_max_level=good[passing[-1]] if passing else None,
                               first_failing_level=first_fail, slo_ttft_ms=slo, knee_level=knee,
                               last_level_within_slo=before[-1] if before else None, knee_level_interp=interp)
    return out
