"""servelab's Locust command-line options (they also appear in the web UI's start form).

Imported by the ``servelab run`` process too: keep it free of gevent and locust."""
from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field

from servelab.core import credentials
from servelab.core.errors import ServelabError
from servelab.core.paths import default_db
from servelab.core.timeouts import DRAIN_S, REQUEST
from servelab.store.spool import check_id


@dataclass
class Timeouts:
    """The per-request limits as the watchdog reads them (``core.timeouts.REQUEST``'s values)."""
    connect_s: float = REQUEST.connect
    first_token_s: float = REQUEST.first_token
    between_chunks_s: float = REQUEST.between_chunks
    total_s: float = REQUEST.total


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def add_arguments(parser) -> None:
    """Listener for ``events.init_command_line_parser`` (the parameter must be named parser)."""
    # The traffic profile is Locust's own --profile (it is also in the web UI's start form and
    # in Locust's reports): servelab reads it as the path of the profile YAML.
    # Locust's parser knows include_in_web_ui; its argument groups do not, hence no group.
    g = parser
    g.add_argument("--variant", default=os.environ.get("SERVELAB_VARIANT", ""),
                   help="name of the server variant under test (recorded with the run)")
    # The database path is the command line's (or $SERVELAB_DB's), never the web form's: the
    # master creates folders and a file there.
    g.add_argument("--db", default=str(default_db()), include_in_web_ui=False,
                   help="DuckDB file that receives the run")
    g.add_argument("--mode", default=os.environ.get("SERVELAB_MODE", "plan"),
                   choices=["plan", "manual", "search"],
                   help="plan: the profile's load plan; manual: ramp LLM users by hand "
                   "(number of users and ramp up below, changed while it runs with Edit); "
                   "search: probe the plan's levels one at a time for the highest that meets "
                   "the SLO attainment target")
    g.add_argument("--search-target", type=float,
                   default=float(os.environ.get("SERVELAB_SEARCH_TARGET", 0.95)),
                   help="search mode: share of requests that must meet their class's SLOs")
    g.add_argument("--search-start", type=float,
                   default=float(os.environ.get("SERVELAB_SEARCH_START", 0)),
                   help="search mode: the plan's level to probe first (0: bisect from the "
                   "middle of its levels)")
    g.add_argument("--search-max-error-rate", type=float,
                   default=float(os.environ.get("SERVELAB_SEARCH_MAX_ERROR_RATE", 0.5)),
                   help="search mode: a probe with more failed requests than this share "
                   "misses, whatever its SLO attainment")
    g.add_argument("--manual-warmup", type=float, default=10.0,
                   help="manual mode: seconds after a level's users are all running before "
                   "its measured window opens")
    g.add_argument("--api-port", type=int, default=0, include_in_web_ui=False,
                   help="headless: serve servelab's JSON API on 127.0.0.1:PORT (0: an ephemeral "
                   "port for servelab's own readers, the run's token on every route; with the web "
                   "UI it is on the UI's port under /servelab/api)")
    g.add_argument("--otlp-port", type=int, default=int(os.environ.get("SERVELAB_OTLP_PORT", -1)),
                   include_in_web_ui=False, help="receive the server's OTLP trace spans "
                   "(POST /v1/traces) on 127.0.0.1:PORT into server_spans (0: a free port; "
                   "-1: none)")
    g.add_argument("--tag", default="", help="k=v[,k=v...] labels recorded with the run")
    g.add_argument("--seed", type=int, default=-1, help="override the profile's seed (-1: keep)")
    _add_request_options(g)
    _add_bookkeeping(g)
    # Secure defaults: Locust binds its web UI and its worker port to every interface.
    parser.set_defaults(web_host=os.environ.get("LOCUST_WEB_HOST", "127.0.0.1"),
                        master_bind_host=os.environ.get("LOCUST_MASTER_BIND_HOST", "127.0.0.1"))


def _add_request_options(g) -> None:
    """How each request is sent and how long it may take."""
    g.add_argument("--timeout-connect", type=float, default=REQUEST.connect,
                   help="seconds to connect")
    g.add_argument("--timeout-first-token", type=float, default=REQUEST.first_token,
                   help="seconds from sending to the first output chunk")
    g.add_argument("--timeout-between-chunks", type=float, default=REQUEST.between_chunks,
                   help="seconds allowed between two output chunks")
    g.add_argument("--timeout-total", type=float, default=REQUEST.total,
                   help="seconds for a whole request")
    g.add_argument("--drain-timeout", type=float, default=DRAIN_S,
                   help="seconds in-flight requests get to finish when the run ends")
    g.add_argument("--late-ms", type=float, default=10.0,
                   help="open loop: an arrival sent later than this after its time is 'late'")
    g.add_argument("--served-model", default="", help="model name to send (default: the "
                   "profile's, or the first of the target's /v1/models)")
    g.add_argument("--tokenizer", default="", help="tokenizer.json for prompt lengths when the "
                   "target has no /tokenize")
    g.add_argument("--api-key", default="", is_secret=True,
                   help="sent as 'Authorization: Bearer KEY' on every request to the target "
                   "(default: $OPENAI_API_KEY; the variable keeps the key off command lines)")
    g.add_argument("--header", action="append", default=[], include_in_web_ui=False,
                   metavar="'NAME: VALUE'", help="extra request header for other auth schemes "
                   "(repeatable; default: $SERVELAB_HEADERS, one per line)")


def _add_bookkeeping(g) -> None:
    """Where the run's rows and progress go, and what is recorded with it (never the web form's)."""
    g.add_argument("--spool-dir", default=os.environ.get("SERVELAB_SPOOL", "results/spool"),
                   include_in_web_ui=False, help="where each worker spools its rows")
    g.add_argument("--run-id", default="", include_in_web_ui=False,
                   help="id of the run (default: a new one per test start)")
    g.add_argument("--status-file", default="", include_in_web_ui=False,
                   help="the master writes live progress here (JSON, once a second)")
    g.add_argument("--hardware", default="", include_in_web_ui=False,
                   help="GPU of the target, recorded with the run")
    g.add_argument("--server-kind", default=os.environ.get("SERVELAB_SERVER_KIND", ""),
                   include_in_web_ui=False,
                   help="the target's framework (vllm, sglang; default: the variant's, else "
                   "vllm): SGLang names a request by its body's rid, so servelab sends its id "
                   "there too and the server's spans join their requests")


@dataclass
class Settings:
    profile: str
    variant: str
    db: str
    tags: dict
    seed: int | None
    timeouts: Timeouts
    drain_timeout_s: float
    late_ms: float
    served_model: str
    tokenizer: str
    spool_dir: str
    run_id: str
    status_file: str
    hardware: str
    server_kind: str = ""            # "": the variant's kind, else vLLM
    auth: dict = field(default_factory=dict)   # credentials.describe(): never a key or value
    mode: str = "plan"               # plan | manual | search
    manual_warmup_s: float = 10.0
    search_target: float = 0.95      # search mode (loadgen.search_rules)
    search_start: float = 0.0
    search_max_error_rate: float = 0.5
    api_port: int = 0

    def as_json(self) -> dict:
        d = asdict(self)
        d["timeouts"] = asdict(self.timeouts)
        return d


def settings_from(options) -> Settings:
    get = lambda name, default=None: getattr(options, name, default)  # noqa: E731
    seed = get("seed", -1)
    return Settings(
        profile=get("profile", "") or os.environ.get("SERVELAB_PROFILE", ""),
        variant=get("variant", "") or "",
        db=get("db", "") or str(default_db()),
        tags=parse_tags(get("tag", "")),
        seed=None if seed is None or int(seed) < 0 else int(seed),
        timeouts=Timeouts(float(get("timeout_connect", REQUEST.connect)),
                          float(get("timeout_first_token", REQUEST.first_token)),
                          float(get("timeout_between_chunks", REQUEST.between_chunks)),
                          float(get("timeout_total", REQUEST.total))),
        drain_timeout_s=float(get("drain_timeout", DRAIN_S)),
        late_ms=float(get("late_ms", 10.0)),
        served_model=get("served_model", "") or "",
        tokenizer=get("tokenizer", "") or "",
        spool_dir=get("spool_dir", "") or "results/spool",
        run_id=check_id(get("run_id")) if get("run_id") else "",
        status_file=get("status_file", "") or "",
        hardware=get("hardware", "") or "",
        server_kind=get("server_kind", "") or "",
        auth=credentials_from(options).describe(),
        mode=get("mode", "plan") or "plan",
        manual_warmup_s=float(get("manual_warmup", 10.0)),
        search_target=float(get("search_target", 0.95)),
        search_start=float(get("search_start", 0.0) or 0.0),
        search_max_error_rate=float(get("search_max_error_rate", 0.5)),
        api_port=int(get("api_port", 0) or 0),
    )


def credentials_from(options) -> credentials.Credentials:
    """The target's credentials from Locust's options (the web UI form included), falling back
    to $OPENAI_API_KEY and $SERVELAB_HEADERS."""
    key = getattr(options, "api_key", "") or None
    headers = [h for h in getattr(options, "header", None) or [] if h]
    return credentials.build(key, headers)[1]


def parse_tags(value) -> dict:
    """``k=v`` items, comma-separated in one string or given as a list."""
    items = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
    tags = {}
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, val = part.partition("=")
            if not sep or not key.strip():
                raise ServelabError(f"--tag: '{part}' is not KEY=VALUE (e.g. --tag gpu=l40s)")
            tags[key.strip()] = val.strip()
    return tags


def adopt_credentials(env) -> None:
    """This process's credentials from its options and environment; a host given as
    ``http://user:pass@host`` loses its user:password (nothing records it) and they become an
    HTTP Basic header that travels in the options (to workers too), unless a key is given."""
    opts = env.parsed_options
    clean, basic = credentials.split_url(env.host)
    if basic is not None:
        env.host = clean
        if opts is not None:
            opts.host = clean
            given = credentials_from(opts)
            if given.api_key is None and "authorization" not in map(str.lower, given.headers):
                opts.header = [*(getattr(opts, "header", None) or []), ": ".join(basic)]
    creds = credentials_from(opts) if opts is not None else credentials.from_environ()
    if creds.headers != credentials.current().headers:
        credentials.install(creds)


def try_adopt(env) -> None:
    try:
        adopt_credentials(env)
    except ServelabError:
        pass   # a bad --header: the run's start (ensure_run) reports it and exits 2


def check_profile_now(options) -> None:
    """The command line's profile loads, or Locust exits 2 with the loader's message before its
    web form is served (a bad path used to make START go silently to STOPPED)."""
    from servelab.profiles import load_profile

    path = getattr(options, "profile", "") or os.environ.get("SERVELAB_PROFILE", "")
    if not path:
        return   # the web form may give it; a headless run's start says it is required
    try:
        load_profile(path)
    except ServelabError as exc:
        print(f"servelab: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
