"""A run's record of what the endpoints servelab reads answered (``/metrics`` every second,
``/v1/models`` at the start): one ``endpoint_events`` row per answer servelab could not use,
counts per endpoint and outcome, and the newest of each, for the run's notes and the LLM tab's
server panel. A quirk of a page that was stored anyway (``scraper.QUIRKS``) is counted for the
notes and gets a row the first time only: it can come with every scrape of a healthy server.
Lives in the event loop; the scraper hands over what the database thread reported.
"""
from __future__ import annotations

import time

from servelab.core import bounded_http
from servelab.loadgen.master.scraper import ENDPOINT as METRICS, OUTCOMES as METRIC_OUTCOMES
from servelab.store.rows import EndpointEvent

DETAIL_CHARS = 300
# What the run did instead of using an endpoint's answer (a reader can say its own).
INSTEAD = {METRICS: "Those seconds have no server metrics (no request row was lost for it)"}


def _meaning(endpoint: str, outcome: str) -> str:
    if endpoint == METRICS and outcome in METRIC_OUTCOMES:
        return METRIC_OUTCOMES[outcome]
    return bounded_http.describe(outcome)


class EndpointLog:
    """``write(fn)``: queue ``fn(store)`` in the run's database (the writer's ``call``)."""

    def __init__(self, run_id: str, write=None, clock=time.time):
        self.run_id = run_id
        self.write = write
        self.clock = clock
        self.stats: dict[str, dict] = {}

    def _entry(self, endpoint: str) -> dict:
        return self.stats.setdefault(endpoint, {"reads": 0, "counts": {}, "quirks": {},
                                                "last": None, "last_failure": None,
                                                "instead": INSTEAD.get(endpoint)})

    def seen(self, endpoint: str, outcome: str) -> bool:
        """Whether ``outcome`` was recorded for ``endpoint`` before (a log line once each)."""
        e = self.stats.get(endpoint)
        return bool(e) and (outcome in e["counts"] or outcome in e["quirks"])

    def ok(self, endpoint: str, t_unix: float | None = None) -> None:
        e = self._entry(endpoint)
        e["reads"] += 1
        e["counts"]["ok"] = e["counts"].get("ok", 0) + 1
        e["last"] = {"t_unix": t_unix or self.clock(), "outcome": "ok", "detail": None}

    def record_all(self, events, instead: str = "prompts counted by the next counter") -> None:
        """Events a worker reported at its drain ({t_unix, endpoint, outcome, detail}): a
        /tokenize that failed mid-run, so far."""
        for e in events:
            self.record(e["endpoint"], e["outcome"], e.get("detail") or "",
                        t_unix=e.get("t_unix"), instead=instead)

    def record(self, endpoint: str, outcome: str, detail: str, t_unix: float | None = None,
               was_ok: bool = False, instead: str | None = None) -> None:
        """A failed read: counted, newest, and a row. ``was_ok``: the read was counted ok first
        (a page handed to the writer that its parser then refused); ``instead``: what the run
        did without the answer, for the notes."""
        t = t_unix or self.clock()
        e = self._entry(endpoint)
        if instead:
            e["instead"] = instead
        if was_ok and e["counts"].get("ok"):
            e["counts"]["ok"] -= 1
        else:
            e["reads"] += 1
        e["counts"][outcome] = e["counts"].get(outcome, 0) + 1
        event = {"t_unix": t, "outcome": outcome, "detail": (detail or "")[:DETAIL_CHARS]}
        if e["last_failure"] is None or e["last_failure"]["t_unix"] <= t:
            e["last_failure"] = event
        if e["last"] is None or e["last"]["t_unix"] <= t:
            e["last"] = event
        self._row(endpoint, event)

    def quirk(self, endpoint: str, outcome: str, n: int, t_unix: float | None = None) -> None:
        """A page stored with a quirk; ``n``: how many samples had it."""
        e = self._entry(endpoint)
        first = outcome not in e["quirks"]
        e["quirks"][outcome] = e["quirks"].get(outcome, 0) + 1
        if first:
            self._row(endpoint, {"t_unix": t_unix or self.clock(), "outcome": outcome,
                                 "detail": f"{n} sample(s) in this page; later pages counted "
                                           f"in the run's notes"})

    def _row(self, endpoint: str, event: dict) -> None:
        if self.write is None:
            return
        row = EndpointEvent(self.run_id, event["t_unix"], endpoint, event["outcome"],
                            event["detail"])
        self.write(lambda store: store.append_rows("endpoint_events", [row]))

    # ---- output ---------------------------------------------------------------------------
    def view(self) -> dict:
        """Per endpoint: reads, counts per outcome, quirks, the newest answer and failure."""
        return {ep: {k: (dict(v) if isinstance(v, dict) else v) for k, v in e.items()}
                for ep, e in sorted(self.stats.items())}

    def notes(self) -> list[str]:
        """One note per endpoint with failures (each outcome named, and what servelab did
        instead), one per quirk. No "; " inside a note: the notes are joined with it."""
        out = []
        for endpoint, e in sorted(self.stats.items()):
            failed = {k: n for k, n in e["counts"].items() if k != "ok" and n}
            if failed:
                noun = "scrape" if endpoint == METRICS else "read"
                parts = [f"{n} {_meaning(endpoint, k)} ({k})" for k, n in
                         sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))]
                reads, instead = e["reads"], e["instead"] or "The run went on without them"
                out.append(f"{endpoint}: {reads} {noun}{'s' if reads != 1 else ''}, "
                           f"{e['counts'].get('ok', 0)} usable: " + ", ".join(parts)
                           + f". {instead}")
            for k, n in sorted(e["quirks"].items()):
                out.append(f"{endpoint}: {n} stored page(s) {_meaning(endpoint, k)} ({k})")
        return out
