"""The start form and ``/swarm``'s checks (Locust's web UI, master or local process).

Locust's ``/swarm`` writes any posted field that names a parsed option into the options, so an
anonymous post could choose where the master creates folders and a DuckDB file (``db``), or
which headers go to the target. Here only the form's own fields pass; the profile must load and
the target must answer before a run starts, and the refusal's message is what the UI shows.
The form also says what the plan mode will run (stages, levels, total time), and the mode picks
the shape: the profile's ``ProfileShape`` or ``ManualShape`` (users by hand, LLM users only).
"""
from __future__ import annotations

import logging
import math
import os
from urllib.parse import urlsplit

from flask import jsonify, request
from werkzeug.datastructures import ImmutableMultiDict

from servelab.core import bounded_http, credentials
from servelab.core.errors import ServelabError

log = logging.getLogger("servelab.loadgen")
PROBE_TIMEOUT_S = 3.0
LOCUST_FIELDS = {"user_count", "spawn_rate", "host", "profile", "run_time"}
PICKER_FIELDS = {"user_classes", "shape_class"}   # only with --class-picker
EDITABLE = {"user_count", "spawn_rate"}           # what may change while a run is on
IDLE_STATES = {"ready", "stopped"}
FIXES = {
    "db": "the database is the command line's: start Locust with --db PATH (or set SERVELAB_DB)",
    "spool_dir": "start Locust with --spool-dir PATH (or set SERVELAB_SPOOL)",
    "header": "start Locust with --header 'NAME: VALUE' (or set SERVELAB_HEADERS); a key goes "
              "in the form's api_key field",
    "run_id": "each start gets a new run id; give --run-id on the command line to choose one",
    "status_file": "start Locust with --status-file PATH",
}


class Refused(Exception):
    pass


def install(web_ui, master) -> None:
    guard = Guard(web_ui, master)
    app = web_ui.app
    # Wrapped inside Locust's own login check: with --web-login nobody anonymous gets as far
    # as these checks (the target probe included).
    view = app.view_functions["locust.swarm"]
    app.view_functions["locust.swarm"] = web_ui.auth_required_if_enabled(guard.wrap(view))
    update_shape = web_ui._update_shape_class

    def shape_by_mode(name):
        # --class-picker: the picked shape class, unless it contradicts the mode ("Default" is
        # no shape: users of every class, the old 8-asked-4-sending bug).
        update_shape(name)
        master.use_mode(guard.posted_mode or _mode(web_ui.environment))

    web_ui._update_shape_class = shape_by_mode
    update_args = web_ui.update_template_args

    def with_plan():
        update_args()
        extra = web_ui.template_args.get("extra_options", {})
        opts = web_ui.environment.parsed_options
        for name, field in extra.items():
            # Locust shows the command line's values; a page opened (or reloaded) after a start
            # must show what runs, or its Edit form posts the command line's mode and options.
            if name in guard.secrets:
                # Locust would put a secret given on the command line (--api-key) into the page:
                # anyone who can open the UI could read it. An empty field keeps it.
                field["default_value"] = ""
            elif hasattr(opts, name):
                field["default_value"] = getattr(opts, name)
        if "mode" in extra:
            extra["mode"]["help_text"] = plan_help(web_ui.environment)

    web_ui.update_template_args = with_plan
    with_plan()


class Guard:
    def __init__(self, web_ui, master):
        from locust import argument_parser

        self.web_ui = web_ui
        self.master = master
        self.env = web_ui.environment
        parser = argument_parser.get_parser()
        self.form_options = set(parser.args_included_in_web_ui) - \
            set(argument_parser.default_args_dict())
        self.secrets = set(parser.secret_args_included_in_web_ui)
        self.posted_mode: str | None = None

    def wrap(self, view):
        def guarded(*args, **kwargs):
            try:
                self.posted_mode = self.check(request.form)
            except Refused as exc:
                log.warning("servelab: /swarm refused: %s", exc)
                return refusal(str(exc))
            self.master.use_mode(self.posted_mode)
            _keep_secrets(self.secrets)
            try:
                return view(*args, **kwargs)
            finally:
                self.posted_mode = None

        guarded.__name__ = getattr(view, "__name__", "swarm")
        return guarded

    def check(self, form) -> str:
        """The mode this post runs in, or ``Refused`` with the message the UI shows."""
        allowed = LOCUST_FIELDS | self.form_options
        if self.web_ui.userclass_picker_is_active:
            allowed |= PICKER_FIELDS
        for key in form:
            if key not in allowed:
                raise Refused(f"{key} cannot be set from the web UI: {self._fix(key)}")
        state = getattr(self.env.runner, "state", "ready")
        mode = form.get("mode") or _mode(self.env)
        if mode not in ("plan", "manual", "search"):
            raise Refused(f"mode: {mode!r} is not a mode: choose plan (the profile's plan), "
                          f"manual (users by hand) or search (the plan's levels probed for the "
                          f"highest that meets the SLOs)")
        if state not in IDLE_STATES:
            return self._check_edit(form, state)
        if mode == "manual":
            _users_and_rate(form)
        profile = form.get("profile") or getattr(self.env.parsed_options, "profile", "") or ""
        _profile_loads(profile)
        if mode == "search":
            _searchable(profile, form.get("search_target"))
        _target_answers(form.get("host") or self.env.host or "", form.get("api_key") or "")
        return mode

    def _check_edit(self, form, state: str) -> str:
        mode = _mode(self.env)
        if state in ("stopping", "cleanup"):
            raise Refused("the last run is still stopping (its requests draining, its rows "
                          "being stored): start again once the state is STOPPED")
        for key in form:
            if key not in EDITABLE and not self._same(key, form[key]):
                raise Refused(f"{key} cannot be changed while a run is on: stop it, then start "
                              f"a new run with the new value")
        if mode != "manual":
            raise Refused("the profile's plan sets the users while it runs: stop it and start "
                          "again in mode manual to ramp users by hand")
        _users_and_rate(form)
        return mode

    def _same(self, key: str, value: str) -> bool:
        current = getattr(self.env.parsed_options, key, None)
        if key in self.secrets and not value:
            return True   # the page may not hold a secret it was never shown
        if key == "host":
            return value.rstrip("/") == (self.env.host or "").rstrip("/")
        if current is None or isinstance(current, (list, tuple)):
            return not value or value == ",".join(map(str, current or []))
        if isinstance(current, bool):
            return (value == "true") == current
        try:
            return type(current)(value) == current
        except (TypeError, ValueError):
            return False

    def _fix(self, key: str) -> str:
        if key in FIXES:
            return FIXES[key]
        if hasattr(self.env.parsed_options, key):
            return f"give --{key.replace('_', '-')} on Locust's command line"
        shown = ", ".join(sorted(LOCUST_FIELDS | self.form_options))
        return f"the start form has no such field (its fields: {shown})"


def _keep_secrets(secrets: set) -> None:
    """An empty secret field means "keep the one I have" (the page never shows it), so it does
    not reach Locust's handler, which would write the empty value over the key."""
    empty = [k for k in secrets if k in request.form and not request.form[k]]
    if empty:
        form = request.form.copy()
        for key in empty:
            form.pop(key)
        request.form = ImmutableMultiDict(form)


def refusal(message: str):
    """HTTP 400 with Locust's own JSON shape. Locust's page reads a refused start's message only
    from a 200 answer (any other status shows 'An unknown error occurred.'), so its own fetch
    (a browser's ``Sec-Fetch-Mode`` other than a navigation) gets the same JSON as 200."""
    body = jsonify({"success": False, "message": message})
    fetch = request.headers.get("Sec-Fetch-Mode")
    body.status_code = 200 if fetch and fetch != "navigate" else 400
    return body


def _mode(env) -> str:
    return getattr(env.parsed_options, "mode", "plan") or "plan"


def _users_and_rate(form) -> None:
    try:
        users = int(form.get("user_count", ""))
    except ValueError:
        raise Refused(f"user_count: {form.get('user_count')!r} is not a whole number of users "
                      f"(manual mode runs that many LLM users, e.g. 4)") from None
    if users < 1:
        raise Refused("user_count: at least 1 user (Stop ends the run)")
    try:
        rate = float(form.get("spawn_rate", ""))
    except ValueError:
        rate = float("nan")
    if not (math.isfinite(rate) and rate > 0):
        raise Refused(f"spawn_rate: {form.get('spawn_rate')!r} is not a positive number of users "
                      f"started per second (e.g. 4)")


def _profile_loads(path: str) -> None:
    from servelab.profiles import load_profile

    if not path:
        raise Refused("profile: give the path of a traffic profile YAML (e.g. "
                      "traffic_profiles/chat.yaml)")
    try:
        load_profile(path)
    except ServelabError as exc:
        raise Refused(f"profile: {exc}") from None


def _searchable(path: str, target) -> None:
    """Mode search probes a concurrency or rate plan's levels, for a share between 0 and 1."""
    from servelab.profiles import load_profile

    kind = load_profile(path).load.kind
    if kind not in ("concurrency", "rate"):
        raise Refused(f"mode: search probes the levels of a concurrency or rate plan; {path} "
                      f"has a {kind} plan: choose plan, or a profile with levels or rates")
    try:
        share = float(target) if target not in (None, "") else 0.95
    except ValueError:
        share = -1.0
    if not 0.0 < share < 1.0:
        raise Refused(f"search_target: {target!r}: give the share of requests that must meet "
                      f"their SLOs, between 0 and 1 (e.g. 0.95)")


def _target_answers(host: str, api_key: str) -> None:
    """GET {host}/v1/models within PROBE_TIMEOUT_S: the server is there (401/403: it is, but
    wants credentials the run does not have). Any other HTTP answer counts as there."""
    clean, basic = credentials.split_url(host.strip())
    parts = urlsplit(clean or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Refused(f"host: {credentials.redact_url(host)!r} is not a server's base URL: give "
                      f"one like http://127.0.0.1:8000")
    headers = credentials.headers()
    if basic is not None:
        headers[basic[0]] = basic[1]
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    # any HTTP head will do: the head is all this waits for (max_bytes=0), on the request's
    # own greenlet, within PROBE_TIMEOUT_S in all
    try:
        answer = bounded_http.fetch(clean, "/v1/models", headers=headers,
                                    deadline_s=PROBE_TIMEOUT_S, max_bytes=0, cooperative=True)
    except ValueError as exc:
        raise Refused(f"host: {exc}: give one like http://127.0.0.1:8000") from None
    if answer.status in (401, 403):
        raise Refused(f"host: {clean} answers {answer.status} to GET /v1/models: it wants an "
                      f"API key (the api_key field, or $OPENAI_API_KEY / --header when Locust "
                      f"starts)")
    if answer.status is None:
        raise Refused(f"host: {clean} does not answer (GET /v1/models "
                      f"{bounded_http.describe(answer.outcome)}: {answer.outcome}, "
                      f"{answer.seen()}, after {answer.elapsed_s:.1f} s): start the server, or "
                      f"fix the host field")


_plans: dict = {}


def plan_help(env) -> str:
    """The mode field's help (Locust shows it in the field's one-line label, cut at about 120
    characters): what the plan runs, first."""
    path = getattr(env.parsed_options, "profile", "") or ""
    return f"{describe_plan(path)}; manual: users by hand (Edit); search: its levels probed"


def describe_plan(path: str) -> str:
    from servelab.profiles import load_profile

    if not path:
        return "plan: the profile's load plan (give a profile)"
    try:
        key = (path, os.stat(path).st_mtime_ns)   # the page is rendered often: load it once
    except OSError:
        key = None
    if key is None or key not in _plans:
        try:
            text = _plan_text(load_profile(path))
        except ServelabError as exc:
            return f"plan: the profile does not load ({exc})"
        if key is None:
            return text
        _plans[key] = text
    return _plans[key]


def _plan_text(profile) -> str:
    from servelab.profiles.durations import format_duration
    from servelab.profiles.planner import RequestPlanner

    stages = RequestPlanner(profile, None).stages()
    kind = profile.load.kind
    unit = "requests/s" if kind == "rate" else "users"
    levels = [f"{s.level:g}" for s in stages if s.level is not None]
    if len(levels) > 4:
        levels = [*levels[:3], "…", levels[-1]]
    total = format_duration(sum(s.duration_s for s in stages))
    what = f"at {', '.join(levels)} {unit}" if levels else "replaying its trace"
    # A concurrency level's hold starts once its users all run: the total is a lower bound.
    about = "≥" if kind == "concurrency" else ""
    n = len(stages)
    return (f"plan: {n} {kind} stage{'s' if n != 1 else ''} {what}, {about}{total}; "
            f"users/ramp-up ignored")
