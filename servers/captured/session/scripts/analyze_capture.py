"""Here (no GPU): figures for servers/captured/bench/side_by_side.md from the captured files.

Run with a Python 3.12 that has duckdb 2.0.1 (the device's version) on its path:
  PYTHONPATH=/tmp/dd /root/.pyenv/versions/3.12.1/bin/python3 .device/analyze_capture.py
"""
import csv
import gzip
import json
import os
import re
import shutil
import tempfile

import duckdb

C = "/work/main/servers/captured"
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')
HISTS = {"ttft": "vllm:time_to_first_token_seconds", "tpot": "vllm:request_time_per_output_token_seconds",
         "itl": "vllm:inter_token_latency_seconds", "e2e": "vllm:e2e_request_latency_seconds",
         "queue": "vllm:request_queue_time_seconds"}


def parse_prom(text):
    out = {}
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        m = LINE.match(ln)
        if not m:
            continue
        name, labels, val = m.groups()
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        out[(name, lab.get("le"))] = out.get((name, lab.get("le")), 0.0) + float(val)
    return out


def hist(snap, base):
    buckets = sorted(((float(le), v) for (n, le), v in snap.items() if n == base + "_bucket"),
                     key=lambda x: x[0])
    return buckets, snap.get((base + "_sum", None), 0.0), snap.get((base + "_count", None), 0.0)


def hist_diff(a, b, base):
    ba, sa, ca = hist(a, base)
    bb, sb, cb = hist(b, base)
    da = dict(ba)
    return [(le, v - da.get(le, 0.0)) for le, v in bb], sb - sa, cb - ca


def quantile(buckets, q):
    """histogram_quantile(): linear interpolation inside the bucket (Prometheus' rule)."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return prev_le


def server_row(a, b):
    row = {}
    for k, base in HISTS.items():
        bk, s, n = hist_diff(a, b, base)
        row[k + "_n"] = n
        row[k + "_mean_ms"] = 1000 * s / n if n else None
        row[k + "_p50_ms"] = 1000 * quantile(bk, 0.5) if n else None
        row[k + "_p99_ms"] = 1000 * quantile(bk, 0.99) if n else None
    row["gen_tokens"] = b.get(("vllm:generation_tokens_total", None), 0) - a.get(("vllm:generation_tokens_total", None), 0)
    row["prompt_tokens"] = b.get(("vllm:prompt_tokens_total", None), 0) - a.get(("vllm:prompt_tokens_total", None), 0)
    row["requests"] = (b.get(("vllm:request_success_total", None), 0) - a.get(("vllm:request_success_total", None), 0))
    return row


def load(path):
    with open(path) as f:
        return parse_prom(f.read())


def open_db(gz):
    tmp = tempfile.mkdtemp()
    p = os.path.join(tmp, "db.duckdb")
    with gzip.open(gz) as src, open(p, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return duckdb.connect(p, read_only=True)


def servelab_server_rows(con):
    """Per stage: histogram difference between the last scrapes at or before the measured window's
    start and end (servelab scrapes /metrics once a second into server_metrics)."""
    rows = {}
    stages = con.sql("SELECT stage, level, measure_start_unix, measure_end_unix FROM stages ORDER BY stage").fetchall()
    for stage, level, t0, t1 in stages:
        snaps = []
        for t in (t0, t1):
            ts = con.execute("SELECT max(t_unix) FROM server_metrics WHERE t_unix <= ?", [t]).fetchone()[0]
            data = con.execute("SELECT name, labels['le'] AS le, sum(value) FROM server_metrics WHERE t_unix = ? "
                               "GROUP BY ALL", [ts]).fetchall()
            snaps.append({(n, le): v for n, le, v in data})
        rows[int(level)] = server_row(*snaps)
    return rows


def fmt(v, d=1):
    return "-" if v is None else f"{v:,.{d}f}"



SERVER_KEYS = ("requests", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p50_ms", "itl_p99_ms",
               "ttft_mean_ms", "tpot_mean_ms", "itl_mean_ms")


def server_md(conc, label, s) -> str:
    """One table row of vLLM's own histograms (/metrics) over a window."""
    return (f"| {conc} | {label} | {s['requests']:.0f} | {fmt(s['ttft_p50_ms'])} (mean {fmt(s['ttft_mean_ms'])}) | "
            f"{fmt(s['ttft_p99_ms'])} | {fmt(s['tpot_p50_ms'], 2)} (mean {fmt(s['tpot_mean_ms'], 2)}) | "
            f"{fmt(s['itl_p50_ms'], 2)} (mean {fmt(s['itl_mean_ms'], 2)}) | {fmt(s['itl_p99_ms'], 2)} | - |")


def server_csv(v, conc, source, s) -> dict:
    return {"variant": v, "level": conc, "source": source, **{k: s.get(k) for k in SERVER_KEYS}}


def bench_figures(j) -> dict:
    """A `vllm bench serve` result under stage_summary's names."""
    return {"requests": j["completed"], "ttft_p50_ms": j["p50_ttft_ms"], "ttft_p99_ms": j["p99_ttft_ms"],
            "tpot_p50_ms": j["p50_tpot_ms"], "itl_p50_ms": j["p50_itl_ms"], "itl_p99_ms": j["p99_itl_ms"],
            "output_tokens_per_s": j["output_throughput"], "ttft_mean_ms": j["mean_ttft_ms"],
            "tpot_mean_ms": j["mean_tpot_ms"], "itl_mean_ms": j["mean_itl_ms"]}


def client_md(conc, label, c) -> str:
    """One table row of a client's figures (stage_summary's names) over a level."""
    return (f"| {conc} | {label} | {c['requests']} | {fmt(c['ttft_p50_ms'])} | "
            f"{fmt(c['ttft_p99_ms'])} | {fmt(c['tpot_p50_ms'], 2)} | {fmt(c['itl_p50_ms'], 2)} | "
            f"{fmt(c['itl_p99_ms'], 2)} | {fmt(c['output_tokens_per_s'])} |")


def export_csv(con, v):
    """The variant's requests and server_metrics as gzipped CSV, readable without DuckDB 2.x."""
    for table, fn in (("requests", "servelab_requests.csv.gz"), ("server_metrics", "servelab_server_metrics.csv.gz")):
        rows = con.sql(f"SELECT * FROM {table}")
        with gzip.open(f"{C}/{v}/{fn}", "wt", newline="") as f:
            w = csv.writer(f)
            w.writerow([d[0] for d in rows.description])
            for r in rows.fetchall():
                w.writerow(r)


def main():
    out_csv = []
    md = []
    for v in ("bf16", "fp8"):
        B = f"{C}/bench/{v}"
        prev = load(f"{C}/{v}/metrics_after_warmup.txt")
        bench, srv_bench = {}, {}
        for lv in ("c1", "c16", "c64", "c256"):
            with open(f"{B}/{lv}.json") as f:
                bench[lv] = json.load(f)
            cur = load(f"{B}/{lv}.metrics_after.txt")
            srv_bench[lv] = server_row(prev, cur)
            prev = cur
        con = open_db(f"{C}/{v}/servelab_duckdb-2.0.1.duckdb.gz")
        sl = {int(r[0]): dict(zip([d[0] for d in con.description], r[1:])) for r in []}
        q = con.sql("SELECT level, requests, completed, errors, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, itl_p50_ms, "
                    "itl_p99_ms, itl_chunk_p50_ms, itl_chunk_p99_ms, output_tokens_per_s, prompt_tokens_mean "
                    "FROM stage_summary WHERE class_name = '(all)' ORDER BY stage")
        cols = [d[0] for d in q.description]
        sl = {int(r[0]): dict(zip(cols, r)) for r in q.fetchall()}
        srv_sl = servelab_server_rows(con)
        md.append(f"\n## {v}\n")
        md.append("| level | source | requests | TTFT p50 | TTFT p99 | TPOT p50 | ITL p50 | ITL p99 | output tok/s |")
        md.append("|---|---|---|---|---|---|---|---|---|")
        for lv, conc in (("c1", 1), ("c16", 16), ("c64", 64), ("c256", 256)):
            b = bench_figures(bench[lv])
            md.append(client_md(conc, "vllm bench serve (client)", b))
            s = srv_bench[lv]
            md.append(server_md(conc, "server /metrics during that bench level", s))
            out_csv.append({"variant": v, "level": conc, "source": "vllm_bench_client", **b})
            out_csv.append(server_csv(v, conc, "server_hist_during_bench_level", s))
            if conc in sl:
                r = sl[conc]
                c = {"requests": r["completed"], **{k: r[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                                                                      "itl_p50_ms", "itl_p99_ms", "output_tokens_per_s")}}
                md.append(client_md(conc, "servelab (client, measured window)", c))
                s = srv_sl[conc]
                md.append(server_md(conc, "server /metrics during servelab's window", s))
                out_csv.append({"variant": v, "level": conc, "source": "servelab_client", **c})
                out_csv.append(server_csv(v, conc, "server_hist_during_servelab_window", s))
        # totals over the whole server life (before -> after)
        tot = server_row(load(f"{C}/{v}/metrics_before.txt"), load(f"{C}/{v}/metrics_after.txt"))
        md.append(f"\nWhole server life ({v}, metrics_before.txt -> metrics_after.txt: warm-up + all bench levels "
                  f"with their test prompts + the whole servelab run incl. warm-ups): {tot['requests']:.0f} requests, "
                  f"{tot['prompt_tokens']:.0f} prompt tokens, {tot['gen_tokens']:.0f} generated tokens; TTFT mean "
                  f"{fmt(tot['ttft_mean_ms'])} ms, TPOT mean {fmt(tot['tpot_mean_ms'], 2)} ms, ITL mean "
                  f"{fmt(tot['itl_mean_ms'], 2)} ms, queue time mean {fmt(tot['queue_mean_ms'], 1)} ms.")
        export_csv(con, v)
    keys = ["variant", "level", "source", "requests", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p50_ms",
            "itl_p99_ms", "output_tokens_per_s", "ttft_mean_ms", "tpot_mean_ms", "itl_mean_ms"]
    with open(f"{C}/bench/side_by_side.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        for r in out_csv:
            w.writerow({k: r.get(k) for k in keys})
    with open(f"{C}/bench/side_by_side_tables.md.part", "w") as f:
        f.write("\n".join(md) + "\n")
    # short variants: requests + server_metrics exports too
    for v in ("spec_ngram", "tuned", "kv_fp8", "no_prefix_cache"):
        export_csv(open_db(f"{C}/{v}/servelab_duckdb-2.0.1.duckdb.gz"), v)


if __name__ == "__main__":
    main()
