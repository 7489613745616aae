"""Durations in profiles: seconds as a number, or text such as "30s", "2m", "1m30s", "500ms"."""
from __future__ import annotations

import math
import re

from servelab.profiles.limits import MAX_DURATION_S

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
ALLOWED = ("seconds as a number >= 0, or text like '30s', '2m', '1m30s', '500ms', '1h' "
           f"(at most {MAX_DURATION_S:.0f} s, 31 days)")


def parse_duration(value) -> float:
    """Seconds from a number or a duration string; raises ValueError naming what is allowed."""
    if isinstance(value, bool):
        raise ValueError(ALLOWED)
    if isinstance(value, (int, float)):
        # A 400-digit integer compares fine but does not convert: check the bound first.
        if not 0 <= value <= MAX_DURATION_S:
            raise ValueError(ALLOWED)
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            return parse_duration(float(text))
        except ValueError:
            pass
        pos, total = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNIT_S[match.group(2)]
            pos = match.end()
        if text and pos == len(text) and math.isfinite(total) and total <= MAX_DURATION_S:
            return total
    raise ValueError(ALLOWED)


def format_duration(seconds: float) -> str:
    """Short human form for tables: 45s, 2m, 1m30s, 1h05m, 0.5s."""
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m" + (f"{secs:02d}s" if secs else "")
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
