"""Credentials for the server under test: an API key, extra headers, or a URL's user:password.

Where they come from, later ones winning per header name: the URL's ``user:pass@`` (HTTP Basic),
the API key (``--api-key`` or ``$OPENAI_API_KEY``: ``Authorization: Bearer KEY``), then
``--header 'Name: value'`` items (``$SERVELAB_HEADERS``: the same items, one per line).

They are secrets: they travel to child processes only through the environment (a command line
is visible to every local user in ``ps``), the URL is used without its user:password, and
``describe`` is all that is ever recorded (whether there is a key, which header names).
``install``/``current`` hold this process's credentials for code that has no place to pass them
(token counting, model resolution, the /metrics scraper, the request head)."""
from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

from servelab.core.errors import ServelabError

ENV_KEY = "OPENAI_API_KEY"
ENV_HEADERS = "SERVELAB_HEADERS"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# Framing headers are the request's own: a user-set one would corrupt the stream.
_RESERVED = {"content-length", "transfer-encoding", "host", "connection", "expect",
             "x-request-id", "content-type", "accept", "accept-encoding"}


@dataclass(frozen=True, repr=False)
class Credentials:
    headers: dict = field(default_factory=dict)     # name -> value, as sent
    api_key: str | None = None
    extra: tuple = ()                                # ("Name", "value") from --header / URL

    def __repr__(self) -> str:   # never the values, even in a traceback
        return f"Credentials({self.describe()})"

    @property
    def secrets(self) -> list[str]:
        """Every value that must never be written anywhere (longest first, for redaction)."""
        vals = {v for v in self.headers.values() if v}
        if self.api_key:
            vals.add(self.api_key)
        for v in list(vals):
            scheme, _, rest = v.partition(" ")
            if rest and scheme.lower() in ("bearer", "basic"):
                vals.add(rest)
        return sorted(vals, key=len, reverse=True)

    def describe(self) -> dict:
        """What may be recorded: that a key was sent, and the header names (never values)."""
        return {"api_key": bool(self.api_key), "headers": sorted(self.headers)}

    def environ(self) -> dict:
        """Variables that hand these credentials to a child process (``from_environ`` reads
        them); the empty string for one not set, so that a parent's value is not inherited."""
        lines = "\n".join(f"{n}: {v}" for n, v in self.extra)
        return {ENV_KEY: self.api_key or "", ENV_HEADERS: lines}

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        return text


def parse_header(text: str, what: str = "--header") -> tuple[str, str]:
    name, sep, value = str(text).partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name or not _TOKEN.fullmatch(name):
        raise ServelabError(f"{what}: expected 'Name: value' (e.g. --header 'X-Api-Key: ...'); "
                            f"found a header without a valid name")
    if not _VALUE.fullmatch(value):
        raise ServelabError(f"{what} {name}: the value has control characters; allowed printable "
                            "text only")
    if name.lower() in _RESERVED:
        raise ServelabError(f"{what} {name}: servelab sets this header itself; allowed: any other "
                            "header (Authorization, X-Api-Key, ...)")
    return name, value


def split_url(url: str | None) -> tuple[str | None, tuple[str, str] | None]:
    """(the URL without user:password, an HTTP Basic Authorization header for them or None)."""
    if not url:
        return url, None
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return redact_url(url), None
    if user is None and password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    clean = urlunsplit(parts._replace(netloc=host))
    token = f"{unquote(user or '')}:{unquote(password or '')}".encode("utf-8")
    return clean, ("Authorization", "Basic " + base64.b64encode(token).decode("ascii"))


def redact_url(url: str) -> str:
    """The URL with any user:password replaced by ``***`` (for messages and records)."""
    return re.sub(r"(?<=://)[^/@\s]*@", "***@", str(url))


def build(api_key: str | None = None, headers=(), url: str | None = None,
          environ=None) -> tuple[str | None, Credentials]:
    """(the clean URL, the credentials) from explicit values, falling back to the environment
    for the API key and the extra headers."""
    environ = os.environ if environ is None else environ
    clean, basic = split_url(url)
    key = api_key if api_key else (environ.get(ENV_KEY) or None)
    items = list(headers or ())
    if not items and environ.get(ENV_HEADERS):
        items = [line for line in environ[ENV_HEADERS].splitlines() if line.strip()]
    if key and (not _VALUE.fullmatch(key) or any(c.isspace() for c in key)):
        raise ServelabError(f"{ENV_KEY if not api_key else '--api-key'}: the key has spaces or "
                            "control characters; give the key alone (no 'Bearer ')")
    user = [parse_header(h, "--header" if headers else ENV_HEADERS) for h in items]
    merged = dict([basic] if basic else [])
    if key:
        merged["Authorization"] = f"Bearer {key}"
    for name, value in user:   # header names are case-insensitive: the last one wins
        for old in [k for k in merged if k.lower() == name.lower()]:
            del merged[old]
        merged[name] = value
    bearer = f"Bearer {key}" if key else None
    extra = tuple((n, v) for n, v in merged.items() if not (n == "Authorization" and v == bearer))
    return clean, Credentials(merged, key, tuple(extra))


def from_environ(environ=None) -> Credentials:
    return build(environ=environ)[1]


_current: Credentials | None = None
generation = 0      # bumped by install: a cached request head knows when to rebuild


def install(creds: Credentials | None) -> None:
    global _current, generation
    _current = creds
    generation += 1


def current() -> Credentials:
    """This process's credentials (from the environment until ``install`` sets others)."""
    global _current
    if _current is None:
        _current = from_environ()
    return _current


def headers() -> dict:
    return dict(current().headers)
