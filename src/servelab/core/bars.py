"""Progress bars for the steps a user waits on (compare's stages, the report's figures, ingest's
spools): rich bars on stderr, so stdout stays the tables and files a pipeline reads.

Shown only when stderr is a terminal: piped or in CI the bar would be redraw noise in a log. A
step that ends within SHOW_AFTER_S never draws (rich's Live starts on the first refresh after
the delay), so quick calls stay silent and slow ones say what they are doing.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

SHOW_AFTER_S = 2.0


def enabled(stream=None) -> bool:
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", None) and stream.isatty())


@contextmanager
def bar(description: str, total: int | None):
    """A bar; yields advance(n=1, note=None). Does nothing off a terminal."""
    if not enabled():
        yield lambda n=1, note=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    started = time.monotonic()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                        auto_refresh=False)
    task = progress.add_task(description, total=total)
    shown = False

    def advance(n: int = 1, note: str | None = None) -> None:
        nonlocal shown
        progress.update(task, advance=n, description=f"{description}: {note}" if note else description)
        if not shown and time.monotonic() - started >= SHOW_AFTER_S:
            shown = True
            progress.start()
        if shown:
            progress.refresh()

    try:
        yield advance
    finally:
        if shown:
            progress.stop()


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate `items` with a bar (see bar)."""
    with bar(description, total) as advance:
        for item in items:
            yield item
            advance()
