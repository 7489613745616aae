"""core.credentials: where a key and headers come from, how they reach children (the
environment, never a command line), and the helpers that send them (model resolution, token
counting, fidelity) against the simulator started with --api-key."""
import pytest

from servelab.core import credentials
from servelab.core.errors import ServelabError

KEY = "sk-cred-test-5e1f0a"


@pytest.fixture()
def clean_creds():
    saved = credentials._current
    yield
    credentials.install(saved)


def test_sources_and_precedence():
    url, c = credentials.build(None, [], "http://u:p%40ss@h:8/x", {})
    assert url == "http://h:8/x" and c.headers["Authorization"].startswith("Basic ")
    _, c = credentials.build(None, [], "http://h", {"OPENAI_API_KEY": KEY})
    assert c.headers == {"Authorization": f"Bearer {KEY}"} and c.api_key == KEY
    _, c = credentials.build("explicit", [], "http://u:p@h", {"OPENAI_API_KEY": KEY})
    assert c.headers == {"Authorization": "Bearer explicit"}       # the key beats the URL's
    _, c = credentials.build(KEY, ["authorization: Token t", "X-Org: o"], None, {})
    assert c.headers == {"authorization": "Token t", "X-Org": "o"}  # a header beats the key
    _, c = credentials.build(None, [], None, {"SERVELAB_HEADERS": "X-A: 1\n\nX-B: two words"})
    assert c.headers == {"X-A": "1", "X-B": "two words"}


def test_environ_round_trip_keeps_precedence():
    _, c = credentials.build(KEY, ["X-Org: o"], "http://u:p@h", {})
    env = c.environ()
    assert env["OPENAI_API_KEY"] == KEY and "Bearer" not in env["SERVELAB_HEADERS"]
    assert credentials.from_environ(env).headers == c.headers
    empty = credentials.build(None, [], None, {})[1].environ()
    assert empty == {"OPENAI_API_KEY": "", "SERVELAB_HEADERS": ""}   # overrides a parent's


@pytest.mark.parametrize("bad", ["NoColon", ": v", "Bad Name: v", "X: a\rb",
                                 "Content-Length: 5", "Host: h", "X-Request-Id: 1"])
def test_bad_headers_are_refused_without_echoing_the_value(bad):
    with pytest.raises(ServelabError) as err:
        credentials.build(None, [bad], None, {})
    assert "--header" in str(err.value)
    value = bad.partition(":")[2].strip()
    if len(value) > 2:
        assert value not in str(err.value)


def test_a_key_with_spaces_is_refused():
    with pytest.raises(ServelabError, match="--api-key"):
        credentials.build(f"Bearer {KEY}", [], None, {})


def test_nothing_shows_the_values():
    _, c = credentials.build(KEY, ["X-Secret: hdrvalue"], "http://u:pw@h", {})
    for text in (repr(c), str(c), str(c.describe())):
        assert KEY not in text and "hdrvalue" not in text
    assert c.describe() == {"api_key": True, "headers": ["Authorization", "X-Secret"]}
    assert c.redact(f"bad key {KEY} and hdrvalue") == "bad key *** and ***"
    assert credentials.redact_url("see http://u:pw@h:1/v1") == "see http://***@h:1/v1"


def test_run_command_lines_never_carry_the_key(tmp_path):
    from servelab.commands.run import run_options
    from servelab.orchestration.runner import RunOptions, locust_command

    fields = run_options({"profile": "p.yaml", "api_key": KEY, "header": ["X-A: 1"]})
    opt = RunOptions(**fields)
    assert opt.api_key == KEY and opt.headers == ["X-A: 1"]
    cmd = locust_command(opt, tmp_path / "locustfile.py", "http://h", None, tmp_path / "d",
                         "r1", tmp_path / "s.json")
    assert not any(KEY in part or "X-A" in part for part in cmd)


def test_helpers_send_the_key_to_a_keyed_simulator(clean_creds):
    from servelab.orchestration import fidelity
    from servelab.profiles.tokens import TokenCountError, make_counter, resolve_model
    from servelab.sim.server.server import start_background

    fast = dict(hardware="H100", model="Qwen/Qwen2.5-0.5B-Instruct",
                serve_args=["--max-model-len", "4096", "--api-key", KEY])
    with start_background(seed=2, **fast) as bg:
        credentials.install(credentials.build(None, [], None, {})[1])
        with pytest.raises(TokenCountError, match="401"):
            resolve_model(bg.url, 5)
        with pytest.raises(ServelabError):
            fidelity.served_model(bg.url)
        assert resolve_model(bg.url, 5, {"Authorization": f"Bearer {KEY}"})
        credentials.install(credentials.build(KEY, [], None, {})[1])
        assert resolve_model(bg.url, 5) == fidelity.served_model(bg.url)
        counter = make_counter(bg.url, "auto")
        assert counter.source == "server" and counter.count_plain("Hello world.") > 0
        prompts = fidelity.load_prompts()[:1]
        assert all(o.error is None for o in fidelity.collect(bg.url, prompts).values())
        # user:password in the URL become HTTP Basic (which vLLM's key check refuses)
        with pytest.raises(ServelabError, match="401") as err:
            fidelity.collect(bg.url.replace("http://", "http://x:pw-hidden@"), prompts)
        assert "pw-hidden" not in str(err.value)


def test_refusals_name_the_flag_and_show_no_secret(tmp_path):
    from loadgen_helpers import PROFILES, servelab

    base = ["run", "--profile", str(PROFILES / "long_closed.yaml"), "--db",
            str(tmp_path / "t.duckdb")]
    res = servelab(*base, "--target", "http://someone:pw-x-secret@127.0.0.1:9")
    assert res.returncode == 2 and "http://127.0.0.1:9" in res.stderr
    assert "pw-x-secret" not in res.stderr + res.stdout and "Traceback" not in res.stderr
    res = servelab(*base, "--target", "http://127.0.0.1:9", "--header", "X-Bad header-value")
    assert res.returncode == 2 and "--header" in res.stderr and "header-value" not in res.stderr


def test_a_key_the_server_echoes_in_its_error_body_is_not_stored():
    """A server (or proxy) that puts the Authorization header in its error body must not make
    the key land in requests.error_text."""
    from servelab.core import credentials
    from servelab.loadgen.client import request
    from servelab.loadgen.client.stream import StreamState

    key = "sk-echoed-secret-1234"
    _, creds = credentials.build(api_key=key, environ={})
    credentials.install(creds)
    try:
        state = StreamState()
        state.error_kind = "http_401"
        state.error_text = f'{{"error": "bad header Authorization: Bearer {key}"}}'
        spec = request.RequestSpec.__new__(request.RequestSpec)
        row = request._measured(state, spec, 401, 1.0, 1.1)
        assert key not in row.error_text and "***" in row.error_text
    finally:
        credentials.install(None)
