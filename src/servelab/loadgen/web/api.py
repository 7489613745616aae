"""servelab's JSON API under ``/servelab/api`` (docs/api.md): the current run's status, the live
window, the recorded runs and a run's stage summary, and read-only queries for servelab's own
readers while this master holds the database.

Mounted on Locust's web UI (behind ``--web-login`` when it is on), or, headless, on a small
server of its own on 127.0.0.1 (``--api-port``; port 0: an ephemeral port whose every route
asks for the run's token, so only the sidecar's readers use it). Reads never run on the event
loop: on a cursor of the writer's connection in a thread of their own while a run holds the
file (``store.read_side``), else on a short read-only open.
"""
from __future__ import annotations

import hmac
import json
import logging
import sys
from functools import wraps
from pathlib import Path

import duckdb
import gevent
from flask import Blueprint, Flask, Response, request
from gevent import pywsgi

from servelab.core.paths import default_db
from servelab.store import read_side as reads, readers

log = logging.getLogger("servelab.loadgen")
PREFIX = "/servelab/api"
MAX_ROWS = 2_000_000   # a bigger result would cost the master seconds of CPU beside the run
RUNS_SQL = "SELECT * FROM run_overview ORDER BY started_unix, run_id"
STAGES_SQL = ("SELECT * FROM stage_summary WHERE run_id = ? "
              "ORDER BY stage, class_name = '(all)' DESC, class_name")
SERVER_SQL = "SELECT * FROM server_stage_summary WHERE run_id = ? ORDER BY stage"
try:   # Locust allows every origin on its app; these answers are for this host's own readers
    from flask_cors.core import FLASK_CORS_EVALUATED
except ImportError:   # pragma: no cover - flask_cors is a Locust dependency
    FLASK_CORS_EVALUATED = "_FLASK_CORS_EVALUATED"


class ApiError(Exception):
    def __init__(self, code: int, message: str, kind: str = "error"):
        super().__init__(message)
        self.code, self.kind = code, kind


class _Busy(Exception):
    """A run's writer is opening the file in this process: read through it instead."""


def mount(web_ui, master) -> None:
    """The API on Locust's web UI, and the URL the sidecar gives readers."""
    base = (getattr(web_ui.environment.parsed_options, "web_base_path", "") or "").rstrip("/")
    api = Api(master)
    web_ui.app.register_blueprint(api.blueprint(base + PREFIX, web_ui.auth_required_if_enabled,
                                                token_everywhere=False))
    host = web_ui.host or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "::": "::1"}.get(host, host)
    scheme = "https" if web_ui.tls_cert and web_ui.tls_key else "http"
    reads.Endpoint.url = f"{scheme}://{_host(host)}:{web_ui.port}{base}{PREFIX}"


def serve_headless(environment, master) -> None:
    """The API on a server of its own on 127.0.0.1 (``--api-port``; 0: ephemeral, token only)."""
    port = int(getattr(environment.parsed_options, "api_port", 0) or 0)
    app = Flask("servelab.api")
    app.register_blueprint(Api(master).blueprint(PREFIX, None, token_everywhere=port == 0))
    server = pywsgi.WSGIServer(("127.0.0.1", port), app, log=None, error_log=log)
    try:
        server.start()
    except OSError as exc:
        print(f"servelab: --api-port {port}: cannot listen on 127.0.0.1:{port} ({exc}); give a "
              "free port, or 0 for one the sidecar announces", file=sys.stderr, flush=True)
        sys.exit(2)
    reads.Endpoint.url = f"http://127.0.0.1:{server.server_port}{PREFIX}"
    log.info("servelab: JSON API on %s%s", reads.Endpoint.url,
             " (the run's token on every route)" if port == 0 else "")


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _reply(body, code: int = 200) -> Response:
    return Response(json.dumps(readers.plain(body), allow_nan=False, default=_scalar),
                    status=code, mimetype="application/json")


def _scalar(value):
    item = getattr(value, "item", None)   # numpy numbers in a figure
    return item() if callable(item) else str(value)


def _token(req) -> str:
    auth = req.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def _dicts(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _resolve(con, ref: str) -> str:
    """A run id from an exact id, ``latest`` or a unique prefix (as ``servelab summary`` takes)."""
    if ref == "latest":
        row = con.execute("SELECT run_id FROM runs ORDER BY started_unix DESC NULLS LAST, "
                          "run_id DESC LIMIT 1").fetchone()
    else:
        row = con.execute("SELECT run_id FROM runs WHERE run_id = ?", [ref]).fetchone()
    if row:
        return row[0]
    found = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE starts_with(run_id, ?) ORDER BY started_unix", [ref]
    ).fetchall()] if ref != "latest" else []
    if len(found) == 1:
        return found[0]
    if found:
        raise ApiError(400, f"run '{ref}' is ambiguous: it starts {len(found)} run ids; give "
                       "more characters", "ambiguous_run")
    raise ApiError(404, f"no run '{ref}' in the database; GET {PREFIX}/runs lists them",
                   "no_such_run")


class Api:
    def __init__(self, master):
        self.master = master

    def blueprint(self, prefix: str, login, token_everywhere: bool) -> Blueprint:
        bp = Blueprint("servelab_api", __name__, url_prefix=prefix)

        def view(fn, needs_login=True):
            @wraps(fn)
            def answer(*args, **kwargs):
                try:
                    if token_everywhere:
                        self._check_token()
                    return fn(*args, **kwargs)
                except ApiError as exc:
                    return _reply({"error": exc.kind, "message": str(exc)}, exc.code)
                except Exception as exc:  # noqa: BLE001 - a JSON answer, never an HTML page
                    log.exception("servelab: %s %s failed", request.method, request.path)
                    return _reply({"error": type(exc).__name__, "message": str(exc)}, 500)
            return login(answer) if login is not None and needs_login else answer

        bp.add_url_rule("/status", "status", view(self.status))
        bp.add_url_rule("/live", "live", view(self.live))
        bp.add_url_rule("/runs", "runs", view(self.runs))
        bp.add_url_rule("/runs/<ref>/stages", "stages", view(self.stages))
        # The CLI cannot log in to the web UI: its token (from the 0600 sidecar) is the login.
        bp.add_url_rule("/query", "query", view(self.query, needs_login=False), methods=["POST"])

        @bp.after_request
        def no_cors(resp):
            # Locust's app answers every origin; a web page in this user's browser must not
            # read results through these routes.
            setattr(resp, FLASK_CORS_EVALUATED, True)
            resp.headers["Cache-Control"] = "no-store"
            return resp

        return bp

    # ---- where reads go -------------------------------------------------------------------
    def _db_path(self) -> str:
        c = self.master.collector
        opts = self.master.env.parsed_options
        return (c.settings.db if c.settings else None) or getattr(opts, "db", None) \
            or str(default_db())

    def _run_reads(self):
        c = self.master.collector
        w = c.writer
        if c.active and w is not None and not w.reads.closed:
            return w.reads
        return None

    def _check_token(self) -> reads.ReadSide:
        side = self._run_reads()
        if side is None or side.token is None:
            raise ApiError(409, f"no run holds {self._db_path()} now: open it directly "
                           "(servelab's commands do so by themselves)", "no_run")
        given = _token(request)
        if not given or not hmac.compare_digest(given.encode(), side.token.encode()):
            raise ApiError(403, "this route needs the run's token: 'Authorization: Bearer "
                           f"TOKEN', TOKEN from {readers.sidecar_path(self._db_path())}",
                           "forbidden")
        return side

    def read(self, fn):
        """``fn(con)`` on the run's read cursor, or on a short open between runs."""
        for _ in range(20):
            side = self._run_reads()
            if side is not None:
                try:
                    return side.run(fn)
                except reads.ReaderClosed:
                    continue
                except reads.ReadTimeout as exc:
                    raise ApiError(504, str(exc), "timeout") from None
            try:
                # gevent's own pool: its threads never hold the process up at exit
                return gevent.get_hub().threadpool.spawn(self._read_file, fn).get()
            except _Busy:
                gevent.sleep(0.05)
        raise ApiError(503, "the database is opening or closing for a run; ask again", "busy")

    def _read_file(self, fn):
        path = self._db_path()
        if not Path(path).is_file():
            raise ApiError(404, f"no database at {path} yet: it is created by the first run",
                           "no_database")
        try:
            return reads.read_file(path, fn)
        except duckdb.ConnectionException as exc:
            if "different configuration" in str(exc):
                raise _Busy() from None
            raise
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise ApiError(503, f"{path} is held by another process ({exc})",
                               "locked") from None
            raise

    # ---- routes ---------------------------------------------------------------------------
    def status(self):
        c = self.master.collector
        if c.record is None:
            body = {"state": "idle", "run_id": None}
        elif c.active:
            body = c.status()
        else:
            body = {"state": "finished", "run_id": c.run_id, "flags": c.flags, "notes": c.notes}
        ui_status = getattr(self.master, "ui_status", None)
        if ui_status is not None:
            body.update(ui_status())
        body["db"] = self._db_path()
        return _reply(body)

    def live(self):
        """The master's live window (``Collector.live_view``); ``?since=T_UNIX``: only the
        series points newer than T (a chart polling every second asks for what it lacks)."""
        c = self.master.collector
        since = request.args.get("since")
        try:
            since = float(since) if since not in (None, "") else None
        except ValueError:
            raise ApiError(400, f"since={since!r}: give the t_unix of the newest point you "
                           "hold (a number), or leave it out for the whole series",
                           "bad_request") from None
        return _reply(c.live_view(since))

    def runs(self):
        try:
            return _reply({"runs": self.read(lambda con: _dicts(con, RUNS_SQL))})
        except ApiError as exc:
            if exc.kind == "no_database":
                return _reply({"runs": []})
            raise

    def stages(self, ref: str):
        def fn(con):
            run_id = _resolve(con, ref)
            return {"run_id": run_id, "stages": _dicts(con, STAGES_SQL, [run_id]),
                    "server": _dicts(con, SERVER_SQL, [run_id])}

        return _reply(self.read(fn))

    def query(self):
        side = self._check_token()
        try:
            body = readers.decode(request.get_data() or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON ({exc}): send "
                           '{"sql": "SELECT ...", "params": [...]}', "bad_request") from None
        if not isinstance(body, dict) or not isinstance(body.get("sql"), str):
            raise ApiError(400, 'the body needs "sql": the text of a SELECT statement',
                           "bad_request")
        params = body.get("params") or []
        if not isinstance(params, list):
            raise ApiError(400, '"params" must be a list (one value per ? in the SQL)',
                           "bad_request")
        try:
            code, payload = side.run(lambda cur: _query(side, cur, body["sql"], params))
        except reads.ReaderClosed:
            raise ApiError(409, "the run ended during the query: open the file directly",
                           "no_run") from None
        except reads.ReadTimeout as exc:
            raise ApiError(504, str(exc), "timeout") from None
        return Response(payload, status=code, mimetype="application/json")


def _query(side, cur, sql: str, params: list) -> tuple[int, bytes]:
    """In the read thread: check, run, fetch and encode (the event loop only sends the bytes)."""
    from servelab.store.read_guard import Guard, Refused

    def error(code, kind, message):
        return code, json.dumps({"error": kind, "message": message}).encode()

    try:
        if side.guard is None:
            side.guard = Guard(cur)
        side.guard.check(sql)
        cur.execute(sql, params)
        if cur.description is None:
            return 200, b'{"columns": null, "rows": []}'
        rows = cur.fetchmany(MAX_ROWS + 1)
    except Refused as exc:
        return error(400, "refused", str(exc))
    except duckdb.Error as exc:
        if side.closed:   # interrupted by the run's end: the reader now opens the file itself
            return error(409, "no_run", "the run ended during the query: open the file directly")
        return error(400, type(exc).__name__, str(exc))
    if len(rows) > MAX_ROWS:
        return error(413, "too_many_rows", f"the result has more than {MAX_ROWS} rows: add a "
                     "LIMIT or an aggregate, or wait for the run to end and read the file")
    types = [str(d[1]) for d in cur.description]
    out = {"columns": [[d[0], t] for d, t in zip(cur.description, types)],
           "rows": readers.encode_rows(rows, types)}
    return 200, json.dumps(out, allow_nan=False, separators=(",", ":")).encode()
