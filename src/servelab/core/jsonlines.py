"""JSON Lines read with line numbers, so an error names the line it is about (the JSONL sibling of
``core.yamlsource``): traces, length distributions and fidelity prompt sets use it."""
from __future__ import annotations

import json
import math
from typing import Any, Iterator


def numbered(text: str, error: type[Exception] = ValueError,
             where: str = "line ") -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line; ``error(f"{where}{n}: not JSON (...)")``
    on the first line that does not parse.

    Strict JSON: NaN, Infinity and numbers that overflow a float are errors, as are integers over
    Python's 4,300-digit conversion limit and nesting deep enough to exhaust the stack.
    """
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, parse_constant=_no_constant, parse_float=_finite)
        except json.JSONDecodeError as exc:
            raise error(f"{where}{n}: not JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:
            raise error(f"{where}{n}: not JSON ({str(exc).split(';')[0] or 'too deep'})") \
                from None
        yield n, value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value
