"""What the master knows of each worker: its counters as reported, the batches stored, whether
it drained; and, at the end, the loss accounting that turns this into ``run_workers`` rows and
notes (no row is lost silently: a lost worker's spool is read when it is on this host)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from servelab.store.rows import WorkerAccount


@dataclass
class Tally:
    worker: str
    node_id: str
    slot: int
    host: str | None = None
    started: int = 0        # worker_seq values handed out, at the last report
    produced: int = 0       # rows spooled, at the last report
    stored: int = 0         # rows the master stored
    batches: int = 0
    drained: dict | None = None   # the worker's DRAINED report
    spool_path: str | None = None
    lost: bool = False
    stored_batches: set = field(default_factory=set)

    def counts(self, data: dict) -> None:
        self.started = max(self.started, data["started"])
        self.produced = max(self.produced, data["produced"])


class WorkerAccounts:
    """Worker ``wN`` is the N-th Locust client id in sorted order (``local`` without workers)."""

    def __init__(self, nodes: list[str]):
        self.slots = {node: i for i, node in enumerate(nodes)}
        self._by_name = {f"w{i}": Tally(f"w{i}", node, i) for node, i in self.slots.items()}

    def get(self, worker: str | None) -> Tally | None:
        return self._by_name.get(worker)

    def all(self) -> list[Tally]:
        return list(self._by_name.values())

    def produced(self) -> int:
        return sum(a.produced for a in self._by_name.values())

    def stored(self) -> int:
        return sum(a.stored for a in self._by_name.values())

    def undrained(self, live_nodes: set[str] | None) -> list[Tally]:
        """Workers still connected (``live_nodes`` None: a local run) that have not drained."""
        return [a for a in self._by_name.values() if a.drained is None
                and (live_nodes is None or a.node_id in live_nodes)]

    def drained(self, data: dict) -> None:
        acct = self._by_name.get(data.get("worker"))
        if acct is not None:
            acct.drained = data
            acct.host = data.get("host")
            acct.spool_path = data.get("spool_path")
            acct.counts(data)

    def settle(self, run_id: str, spool_dir: str) -> tuple[list[WorkerAccount], list[str], set]:
        """The run_workers rows, the notes on losses, and the token-count sources reported."""
        rows, notes, sources = [], [], set()
        for a in self._by_name.values():
            in_flight_lost = 0
            state = "finished"
            if a.drained is None:
                state = "lost"
                in_flight_lost = _settle_lost(a, run_id, spool_dir, notes)
            else:
                if a.drained.get("count_source"):
                    sources.add(a.drained["count_source"])
                if a.drained.get("aborted"):
                    notes.append(f"worker {a.worker}: {a.drained['aborted']} requests were still "
                                 "in flight at the drain deadline and were recorded as aborted")
                if not a.drained.get("all_acked"):
                    notes.append(f"worker {a.worker}: not every batch was acknowledged")
            rows.append(WorkerAccount(run_id, a.worker, a.host, a.produced, a.stored,
                                      in_flight_lost, state, a.spool_path))
        return rows, notes, sources


def _settle_lost(a: Tally, run_id: str, spool_dir: str, notes: list[str]) -> int:
    """A worker that never drained: exact figures from its spool when it is on this host, else
    its last report. Returns the requests that were in flight and are lost."""
    from servelab.store.spool import read_spool

    a.lost = True
    a.spool_path = a.spool_path or str((Path(spool_dir) / run_id / a.worker).resolve())
    exact = None
    try:
        exact = read_spool(a.spool_path)
    except (OSError, ValueError, KeyError):
        pass
    if exact is not None and exact.meta.get("run_id") == run_id:
        a.produced = max(a.produced, len(exact.seqs))
        in_flight_lost = exact.in_flight_lost
        a.host = a.host or exact.meta.get("host")
        notes.append(f"worker {a.worker} was lost: {a.produced} rows produced, "
                     f"{a.stored} stored, {a.produced - a.stored} left in its spool "
                     f"{a.spool_path} (load them with `servelab ingest "
                     f"{a.spool_path}`), {in_flight_lost} requests in flight lost")
        return in_flight_lost
    in_flight_lost = max(0, a.started - a.produced)
    notes.append(f"worker {a.worker} was lost: at its last report {a.produced} "
                 f"rows produced and {in_flight_lost} in flight; {a.stored} "
                 "stored; its spool is on its own host")
    return in_flight_lost
