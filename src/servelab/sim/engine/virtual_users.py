"""Virtual users: the load generator's users in virtual time, the one user model that ``servelab
predict`` and the published-table comparison (``orchestration.calibrate_published``,
tests/sim_engine) drive engines with.

A user sends a session's turns in order, each once the previous answer arrived and the turn's
think time passed. A closed-loop user (``add_user``) takes its next session when one ends, until
its stop time; an open-loop session (``add_session``) starts at its arrival time, optionally under
an ``InFlightCap``: its first turn waits for a slot (``Submitted.scheduled_s`` keeps when it was
meant to go) and is dropped if still waiting at ``give_up_s`` (``VirtualResult.dropped``).

A turn with ``resend_history`` sends the whole conversation so far (earlier prompts and answers,
as equal token ids so the prefix cache can hit) plus its own new tokens, as a chat client does.
A request longer than ``max-model-len`` is rejected as vLLM's 400 without reaching an engine
(``VirtualUsers.rejected``); its user goes on 1 ms later.

What comes back is plain records (``VirtualResult`` from the driver, ``Submitted`` per request
with the caller's ``tag``); turning them into stored rows is the caller's business.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from servelab.sim.engine.engine import Engine
from servelab.sim.engine.virtual import (
    ClientRecord,
    InFlightCap,
    VirtualRequest,
    VirtualResult,
    VirtualRunner,
)

_HISTORY_ID_BASE = 1 << 41  # conversation token ids, above the runner's own id ranges
REJECT_PAUSE_S = 0.001      # a rejected request's user sends its next one this much later


@dataclass
class UserTurn:
    """One request of a session. ``think_s`` is the pause after the previous answer (none before
    a user's very first request); ``tag`` is the caller's, handed back in ``Submitted``."""
    request: VirtualRequest
    think_s: float = 0.0
    resend_history: bool = False
    tag: object = None


@dataclass
class Submitted:
    """A request a user sent, or tried to (a rejected one never reached an engine)."""
    request_id: str
    turn: UserTurn
    sent_s: float
    scheduled_s: float | None  # open loop: the session's arrival time (its first turn only)


@dataclass
class _User:
    stop_s: float
    next_session: Callable[[], list[UserTurn] | None] | None  # None: one session, then done
    session: list[UserTurn] = field(default_factory=list)
    turn: int = 0
    history: list[int] = field(default_factory=list)
    started: bool = False
    scheduled_s: float | None = None
    cap: InFlightCap | None = None
    give_up_s: float | None = None


class VirtualUsers:
    """Users on top of one ``VirtualRunner``: add them, then ``run``."""

    def __init__(self, runner: VirtualRunner):
        self.runner = runner
        self.max_model_len = min(e.config.max_model_len for e in runner.engines)
        self.submitted: dict[str, Submitted] = {}
        self.rejected: list[Submitted] = []
        self._waiting_on: dict[str, _User] = {}
        self._next_id = 0
        runner.on_finish = self._finished

    def add_user(self, start_s: float, stop_s: float,
                 next_session: Callable[[], list[UserTurn] | None]) -> None:
        """A closed-loop user: sessions from ``next_session`` (None: no more) until ``stop_s``."""
        self._next_turn(_User(stop_s, next_session), start_s)

    def add_session(self, turns: list[UserTurn], at_s: float, cap: InFlightCap | None = None,
                    give_up_s: float | None = None) -> None:
        """An open-loop arrival: one session starting at ``at_s``."""
        self._next_turn(_User(float("inf"), None, turns, scheduled_s=at_s, cap=cap,
                              give_up_s=give_up_s), at_s)

    def run(self, until_s: float | None = None) -> VirtualResult:
        return self.runner.run(until_s)

    def _finished(self, rec: ClientRecord, t: float) -> None:
        user = self._waiting_on.pop(rec.request_id, None)
        if user is not None:
            self._next_turn(user, t)

    def _request(self, turn: UserTurn, history: list[int]) -> tuple[VirtualRequest, list[int]]:
        """The request to send, and the conversation after its answer."""
        req = turn.request
        if not turn.resend_history:
            return req, history
        base = _HISTORY_ID_BASE + self._next_id
        self._next_id += req.prompt_len + req.output_len
        ids = history + list(range(base, base + req.prompt_len))
        answer = list(range(base + req.prompt_len, base + req.prompt_len + req.output_len))
        return replace(req, prompt_len=len(ids), prompt_token_ids=ids), ids + answer

    def _next_turn(self, user: _User, now: float) -> None:
        while now < user.stop_s:
            if user.turn >= len(user.session):
                session = user.next_session() if user.next_session is not None else None
                if session is None:
                    return
                user.session, user.turn, user.history = session, 0, []
            turn = user.session[user.turn]
            first = user.turn == 0
            user.turn += 1
            sent = now + (turn.think_s if user.started else 0.0)
            if sent >= user.stop_s:
                return
            user.started = True
            req, user.history = self._request(turn, user.history)
            scheduled = user.scheduled_s if first else None
            if req.prompt_len + req.output_len > self.max_model_len:
                rid = req.request_id or f"rejected-{len(self.rejected)}"
                self.rejected.append(Submitted(rid, turn, sent, scheduled))
                now = sent + REJECT_PAUSE_S
                continue
            rid = self.runner.submit(req, sent, user.cap, user.give_up_s if first else None)
            self.submitted[rid] = Submitted(rid, turn, sent, scheduled)
            self._waiting_on[rid] = user
            return


def run_open_loop(engines: list[Engine], requests: Iterable[VirtualRequest], until_s: float | None = None,
                  sample_interval_s: float = 1.0, max_in_flight: int | None = None,
                  **frontend) -> VirtualResult:
    """Send each request at its ``arrival_s``; with ``max_in_flight``, arrivals that find that
    many in flight wait for a slot (``ClientRecord.scheduled_s`` keeps the arrival time)."""
    users = VirtualUsers(VirtualRunner(engines, sample_interval_s, **frontend))
    cap = InFlightCap(max_in_flight) if max_in_flight is not None else None
    for req in requests:
        users.add_session([UserTurn(req)], req.arrival_s, cap)
    return users.run(until_s)


def run_closed_loop(engines: list[Engine], users: int,
                    requests: Iterator[VirtualRequest] | Callable[[int], VirtualRequest],
                    duration_s: float, think_time_s: float = 0.0, ramp_s: float = 0.0,
                    drain: bool = False, sample_interval_s: float = 1.0, **frontend) -> VirtualResult:
    """``users`` clients each send a request, wait for it to finish, think, and send the next,
    until ``duration_s``. ``requests`` yields the requests in order (shared by all users) or maps a
    running index to one. With ``drain`` the run continues until in-flight requests finish."""
    model = VirtualUsers(VirtualRunner(engines, sample_interval_s, **frontend))
    if callable(requests):
        counter = itertools.count()
        next_request = lambda: requests(next(counter))  # noqa: E731
    else:
        it = iter(requests)
        next_request = lambda: next(it, None)  # noqa: E731

    def next_session() -> list[UserTurn] | None:
        req = next_request()
        return None if req is None else [UserTurn(req, think_time_s)]

    for u in range(users):
        model.add_user(ramp_s * u / users if users else 0.0, duration_s, next_session)
    return model.run(None if drain else duration_s)
