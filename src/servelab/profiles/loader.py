"""Loading a profile file: YAML with line numbers, schema validation, every problem reported.

Each problem is printed as ``FILE:LINE: field.path: found X; allowed Y``; a YAML syntax error as
``FILE:LINE:COLUMN: YAML syntax error: ...``. All problems of a file are collected before raising.
"""
from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from servelab.core.errors import ServelabError
from servelab.core import yamlsource
from servelab.profiles import files
from servelab.profiles.schema import PLAN_KINDS, Profile

_HINTS = {
    "name": "a name of letters, digits, '_', '.' or '-'",
    "description": "text saying what question the profile answers",
    "classes": "a list of request classes",
    "load": "exactly one of concurrency, rate, ramp, trace",
    "levels": "a list of concurrency levels, e.g. [1, 4, 16]",
    "hold": "a duration per level, e.g. 60 or '1m'",
    "rates": "a list of request rates per second, e.g. [1, 2, 4]",
    "duration": "a duration, e.g. 60 or '1m'",
    "stages": "a list of {users, spawn_rate, duration}",
    "users": "a whole number of users >= 0",
    "spawn_rate": "users started per second, a number > 0",
    "file": "a path relative to the profile's folder",
    "kind": "one of fixed, uniform, normal, lognormal, empirical",
    "value": "a number",
    "min": "a number",
    "max": "a number",
    "mean": "a number",
    "stdev": "a number >= 0",
    "sigma": "a number >= 0",
    "turns": "a turn-count distribution, e.g. {kind: uniform, min: 2, max: 6}",
}

_TYPE_ALLOWED = {
    "int_type": "a whole number", "int_parsing": "a whole number",
    "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "text",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "finite_number": "a finite number",
}


class ProfileError(ServelabError):
    """A profile that cannot be used; ``problems`` holds every problem found."""

    def __init__(self, problems: list["Problem"]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    path: str
    found: str
    allowed: str
    column: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" + (f":{self.column}" if self.column else "")
        if not self.path:
            text = f"{where}: {self.found}; allowed {self.allowed}" if self.allowed \
                else f"{where}: {self.found}"
        else:
            text = f"{where}: {self.path}: found {self.found}; allowed {self.allowed}"
        return text.translate(_ONE_LINE)


# Whatever a file's keys and values hold, a problem stays on one line (str.splitlines breaks at
# each of these).
_ONE_LINE = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def load_profile(path) -> Profile:
    """Read and validate a traffic profile; raises ProfileError listing every problem."""
    path = Path(path)
    shown = str(path)
    try:
        text = files.read_text(path, files.MAX_PROFILE_BYTES)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ProfileError([Problem(shown, 1, "", f"cannot read the file ({exc})", "")]) from None
    try:
        doc = yamlsource.parse(text)
    except yamlsource.YamlSyntaxError as exc:
        raise ProfileError([Problem(shown, exc.line, "", f"YAML syntax error: {exc}", "",
                                    column=exc.column)]) from None
    if not isinstance(doc.data, dict):
        found = "an empty file" if doc.data is None else f"a {type(doc.data).__name__}"
        raise ProfileError([Problem(shown, 1, "(top level)", found,
                                    "a mapping with name, description, classes and load")])
    problems = [Problem(shown, line, format_path(p), f"key {p[-1]!r} again (first on line "
                        f"{first})", "each key once") for p, line, first in doc.duplicates]
    profile = None
    try:
        profile = Profile.model_validate(doc.data, context={"base_dir": path.parent})
    except ValidationError as exc:
        problems += [_translate(err, doc, shown) for err in exc.errors()]
    problems += [Problem(shown, yamlsource.line_of(doc, p), format_path(p), found, allowed)
                 for p, found, allowed in _profile_rules(doc.data)]
    if problems:
        unique = sorted(set(problems), key=lambda p: (p.line, p.path, p.found))
        raise ProfileError(unique)
    profile._path = path
    return profile


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def format_path(path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(str(part)):
            out += f"[{str(part)!r}]"   # a key with dots, spaces or control characters
        else:
            out += f".{part}" if out else str(part)
    return out


def _profile_rules(data: dict) -> list[tuple[tuple, str, str]]:
    """Rules across classes and the load plan, checked on the raw YAML so they always run."""
    out = []
    classes = data.get("classes")
    if not isinstance(classes, list):
        return out
    load = data.get("load")
    plans = [k for k in PLAN_KINDS if isinstance(load, dict) and k in load]
    trace = plans == ["trace"]
    seen: dict = {}
    weights = []
    for i, cls in enumerate(classes):
        if not isinstance(cls, dict):
            continue
        name = cls.get("name")
        if isinstance(name, str):
            if name in seen:
                out.append((("classes", i, "name"),
                            f"{name!r} again (also classes[{seen[name]}])",
                            "a unique name per class"))
            seen.setdefault(name, i)
        weight = cls.get("weight", 1.0)
        if isinstance(weight, (int, float)) and not isinstance(weight, bool):
            weights.append(weight)
        for key in ("prompt_tokens", "output_tokens"):
            if trace and key in cls:
                out.append((("classes", i, key), "a length distribution under a trace plan",
                            f"no {key}: the trace gives each request's lengths"))
            if not trace and cls.get(key) is None:
                out.append((("classes", i, key), "null" if key in cls else "nothing",
                            "a length distribution, e.g. 256 or {kind: normal, mean: 512, "
                            "stdev: 128}"))
        for key in ("session", "prefix_tokens"):
            if trace and key in cls:
                out.append((("classes", i, key), f"{key} under a trace plan",
                            f"no {key}: trace rows are single requests of the given lengths"))
    if weights and len(weights) == len(classes) and sum(weights) <= 0:
        out.append((("classes",), "weights summing to 0",
                    "at least one class with weight > 0 (weights are relative shares)"))
    return out


def _translate(err: dict, doc: yamlsource.YamlDoc, shown: str) -> Problem:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    path = _data_path(doc.data, loc)
    if kind == "servelab":
        if ctx.get("field"):
            path = path + (ctx["field"],)
        found, allowed = ctx["found"], ctx["allowed"]
    elif kind == "missing":
        found, allowed = "nothing", _HINTS.get(str(loc[-1]), "a value (this field is required)")
    elif kind == "extra_forbidden":
        key = str(loc[-1])
        keys = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(key, keys, n=1)
        found = f"unknown key {key!r}"
        allowed = (f"did you mean {close[0]!r}? " if close else "") + \
            ("keys: " + ", ".join(keys) if keys else "no other keys")
    elif kind == "union_tag_invalid":
        found = f"kind {ctx.get('tag')!r}"
        allowed = f"kind one of {ctx.get('expected_tags')}"
    elif kind == "union_tag_not_found":
        found = "a mapping without 'kind'"
        allowed = ("a number, or a mapping with kind: fixed, uniform, normal, lognormal or "
                   "empirical")
    elif kind == "literal_error":
        found, allowed = _show(err.get("input")), f"one of {ctx.get('expected')}"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
              "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        found, allowed = _show(err.get("input")), f"a number {op} {_show(bound)}"
    elif kind == "too_long":
        found = _show(err.get("input"))
        allowed = f"a list of at most {ctx.get('max_length')} items"
    elif kind in ("too_short", "string_too_short"):
        found = _show(err.get("input"))
        allowed = "non-empty text" if kind == "string_too_short" else \
            f"a list with at least {ctx.get('min_length', 1)} item(s)"
    elif kind == "string_pattern_mismatch":
        found, allowed = _show(err.get("input")), _HINTS["name"]
    elif kind in _TYPE_ALLOWED:
        found, allowed = _show(err.get("input")), _TYPE_ALLOWED[kind]
    elif kind == "value_error":
        found, allowed = _show(err.get("input")), str(ctx.get("error", err["msg"]))
    else:
        found, allowed = _show(err.get("input")), err["msg"]
    return Problem(shown, yamlsource.line_of(doc, path), format_path(path), found, allowed)


def _data_path(data, loc: tuple) -> tuple:
    """The pydantic location as a path in the YAML data: union tags dropped, shorthands cut."""
    cur, path = data, []
    for part in loc:
        if isinstance(cur, dict):
            if part in cur:
                path.append(part)
                cur = cur[part]
            elif cur.get("kind") == part:
                continue
            else:
                path.append(part)
                cur = None
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            path.append(part)
            cur = cur[part]
        else:
            break
    return tuple(path)


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the schema model found at a pydantic location (union tags included)."""
    t: object = Profile
    parts = list(loc)
    while parts:
        t = _unwrap(t, parts[0])
        part = parts.pop(0)
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = t.model_fields.get(str(part))
            if field is None:
                return []
            t = field.annotation
        elif typing.get_origin(t) is list:
            t = typing.get_args(t)[0]
        elif typing.get_origin(t) is typing.Union:
            member = _union_member(t, part)
            if member is None:
                return []
            t = member
    t = _unwrap(t, None)
    if isinstance(t, type) and issubclass(t, BaseModel):
        return list(t.model_fields)
    return []


def _unwrap(t, next_part):
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin is typing.Union:
            members = [a for a in typing.get_args(t) if a is not type(None)]
            if len(members) == 1:
                t = members[0]
            else:
                return t
        else:
            return t


def _union_member(t, tag):
    for member in typing.get_args(t):
        if isinstance(member, type) and issubclass(member, BaseModel) and \
                "kind" in member.model_fields and tag in typing.get_args(
                    member.model_fields["kind"].annotation):
            return member
    return None


def _show(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else f"{text[:6]}...{text[-3:]} ({len(text)} digits)"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, dict):
        keys = [str(k) if _PLAIN_KEY.fullmatch(str(k)) else repr(k) for k in list(value)[:6]]
        return "a mapping" + (f" ({', '.join(keys)})" if value else " ({})")
    if isinstance(value, list):
        text = repr(value)
        return text if len(text) <= 60 else f"a list of {len(value)} items"
    return repr(value)
