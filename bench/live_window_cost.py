#!/usr/bin/env python
"""What the master's live window costs a second at 256 streams (issue 20). Its request figures
are the views' SQL (servelab_live_figures) over the rows the writer stored, run in the
writer's database thread when someone asks: the status file's headline (every second; a
statement every ``STATUS_REFRESH_S``), and, while the LLM tab is open, its view every 1.5 s
(a statement at most every ``VIEW_REFRESH_S``). Simulated seconds of traffic, each second's rows
stored as the writer stores them (its Store, with the ITL sketches) and marked as a write;
every request streams 256 one-token chunks 11 ms apart after a 100 ms TTFT, so 256 streams
finish about 87 requests (22 k chunks) a second.

Printed, in ms of CPU per simulated second (``time.thread_time`` of the thread that runs the
statements, the database thread in a run; the event loop's share is the view's assembly):
``unwatched`` (status file only) and ``watched`` (status file and one LLM tab), and one
statement's cost. The first ``--warm`` seconds are not counted (the table fills up).

Usage: python bench/live_window_cost.py [--streams 256] [--seconds 40] [--warm 12]
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import deque
from pathlib import Path

from servelab.analysis.views import open_results_db
from servelab.loadgen.master import live_figures
from servelab.loadgen.master.live import LiveWindow
from servelab.store.db import Store
from servelab.store.rows import ClassRow, RequestRow, RunRow

T0 = 1_700_000_000.0
SLOS = {"chat": (300.0, 25.0, 60.0, None), "batch": (None, None, None, 4000.0)}


class StoredRows:
    """The writer's side as the live window sees it: its marks and its statement."""

    def __init__(self, con):
        self.con = con
        self.marks: deque = deque([(T0 - 1, 0, 0, 0)], maxlen=1024)
        self.statements = 0

    def live_figures(self, spans, firsts):
        self.statements += 1
        return live_figures.query(self.con, "r", spans, firsts)


def _row(rng: random.Random, i: int, t: float) -> RequestRow:
    ttft = rng.uniform(80.0, 120.0)
    offsets = [ttft + 11.0 * k + rng.uniform(-1.0, 1.0) for k in range(256)]
    return RequestRow(run_id="r", request_id=f"q{i}", worker="w0", worker_seq=i,
                      class_name=rng.choice(("chat", "batch")), stage=0, warmup=False,
                      sent_unix=t - offsets[-1] / 1000, ttft_ms=ttft, e2e_ms=offsets[-1],
                      chunk_offsets_ms=offsets, chunk_tokens=[1] * 256, output_tokens=256)


def run(streams: int, seconds: int, warm: int, watched: bool, folder: Path) -> dict:
    rng = random.Random(7)
    con = open_results_db(folder / f"w{int(watched)}.duckdb")
    store = Store(con, threads=1)
    store.append_rows("runs", [RunRow("r", started_unix=T0, status="running")])
    store.append_rows("run_classes", [ClassRow("r", c, 1.0, *s) for c, s in SLOS.items()])
    rows = StoredRows(con)
    clock = [T0]
    live = LiveWindow(source=rows, clock=lambda: clock[0])
    per_s = streams / (0.1 + 0.011 * 255)            # requests finished per second
    n = 0
    cpu_ms = 0.0
    next_view = T0
    for s in range(seconds):
        clock[0] = T0 + s + 0.5
        batch = [_row(rng, n + k, clock[0]) for k in range(round(per_s))]
        n += len(batch)
        store.append_rows("requests", batch)
        rows.marks.append((clock[0], *con.execute(
            "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM itl_sketches), 0"
        ).fetchone()))
        if s == warm:
            rows.statements = 0
        t0 = time.thread_time()
        for quarter in range(4):                      # the status file's second, the tab's polls
            clock[0] = T0 + s + 0.5 + quarter / 4
            live.tick()
            if quarter == 0:
                live.headline()
            if watched and clock[0] >= next_view:
                live.view([])
                next_view = clock[0] + 1.5
        if s >= warm:
            cpu_ms += 1000 * (time.thread_time() - t0)
    counted = seconds - warm
    fig = live.figures()
    store.close()
    return {"ms_per_s": cpu_ms / counted, "statements_per_s": rows.statements / counted,
            "requests_per_s": fig["requests_per_s"], "itl_p99_ms": fig["itl_p99_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--warm", type=int, default=12)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'mode':<10} {'CPU ms/s':>9} {'statements/s':>13} {'ms/statement':>13} "
              f"{'requests/s':>11} {'ITL p99 ms':>11}")
        for watched in (False, True):
            got = run(a.streams, a.seconds, a.warm, watched, Path(tmp))
            per = got["ms_per_s"] / got["statements_per_s"] if got["statements_per_s"] else 0
            print(f"{'watched' if watched else 'unwatched':<10} {got['ms_per_s']:>9.1f} "
                  f"{got['statements_per_s']:>13.2f} {per:>13.1f} {got['requests_per_s']:>11.0f} "
                  f"{got['itl_p99_ms']:>11.2f}")


if __name__ == "__main__":
    main()
