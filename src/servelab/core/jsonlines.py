"""JSON Lines read with line numbers, so an error names the line it is about (the JSONL sibling of
``core.yamlsource``): traces, length distributions and fidelity prompt sets use it."""
from __future__ import annotations

import json
from typing import Any, Iterator


def numbered(text: str, error: type[Exception] = ValueError,
             where: str = "line ") -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line; ``error(f"{where}{n}: not JSON (...)")``
    on the first line that does not parse."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}{n}: not JSON ({exc.msg})") from None
        yield n, value
