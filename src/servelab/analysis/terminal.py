"""Tables that fit the terminal: numbers and run ids are never cut.

A column is a ``Col``: its heading (words, so it may wrap over two lines), the row key, the
formatter, and whether it may be hidden. Numbers and ids are ``no_wrap``, so rich can only fit the
table by wrapping headings; when even that is too wide, the optional columns are hidden, last
listed first, and the caption says how many and that ``--wide`` shows them. With ``--wide`` every
column is kept and the console is widened to the table (the terminal wraps long lines, but no cell
is cut)."""
from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def text(value) -> str:
    return "-" if value is None else str(value)


@dataclass(frozen=True)
class Col:
    header: str
    key: str
    fmt: Callable = text
    optional: bool = False
    justify: str = "right"
    wrap: bool = False  # free text (flags): may wrap at spaces


def _plain(cell: str) -> str:
    return Text.from_markup(cell).plain


def _longest_word(cells: list[str]) -> int:
    return max((len(w) for c in cells for w in _plain(c).split()), default=1)


@lru_cache(maxsize=64)
def _overhead(n: int) -> int:
    """What SIMPLE_HEAD borders and padding add to n columns' content widths."""
    probe = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for _ in range(n):
        probe.add_column("x")
    probe.add_row(*["x"] * n)
    console = Console(width=10000, file=io.StringIO(), color_system=None)
    console.print(probe)
    return max(len(line) for line in console.file.getvalue().splitlines()) - n


def min_width(headers: list[str], columns: list[list[str]], no_wrap: list[bool]) -> int:
    """The narrowest the table can be with no cell cut: a no_wrap column at its longest cell, a
    wrapping one at its longest word; headings wrap at their words."""
    widths = [max(max((len(_plain(c)) for c in cells), default=1) if nw else _longest_word(cells),
                  _longest_word([h]))
              for h, cells, nw in zip(headers, columns, no_wrap)]
    return sum(widths) + _overhead(len(headers))


def column_widths(headers: list[str], columns: list[list[str]], width: int | None) -> list[int]:
    """Widths for wrapping columns that cut no word: each starts at its longest word (cells and
    heading) and the room left up to `width` (None: no limit) goes to the columns that would wrap,
    in proportion to how much more they could use. rich's own sharing can squeeze a column below
    its longest word (it evens out the widest columns), hence fixed widths."""
    mins = [max(_longest_word(cells), _longest_word([h])) for h, cells in zip(headers, columns)]
    maxs = [max(m, max((len(_plain(c)) for c in cells), default=1), len(_plain(h)))
            for m, h, cells in zip(mins, headers, columns)]
    if width is None:
        return maxs
    room = width - _overhead(len(headers)) - sum(mins)
    want = [hi - lo for lo, hi in zip(mins, maxs)]
    if room <= 0 or not sum(want):
        return mins
    if room >= sum(want):
        return maxs
    return [lo + (room * w) // sum(want) for lo, w in zip(mins, want)]


def _cells(cols: list[Col], rows: list[dict]) -> list[list[str]]:
    return [[c.fmt(r.get(c.key)) for r in rows] for c in cols]


def _build(cols: list[Col], rows: list[dict], title: str | None, caption: str | None, styles) -> Table:
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    cells = _cells(cols, rows)
    for c, column in zip(cols, cells):
        # a no_wrap column is given the width of its longest value, so rich never narrows it;
        # its heading (a Text that may wrap) then wraps at its words instead
        width = max(max((len(_plain(v)) for v in column), default=1), _longest_word([c.header]))
        table.add_column(Text(c.header, no_wrap=False, overflow="fold", justify=c.justify),
                         justify=c.justify, no_wrap=not c.wrap, width=None if c.wrap else width)
    previous = None
    for i, (r, style) in enumerate(zip(rows, styles)):
        section = r.get("__section")
        if previous is not None and section != previous:
            table.add_section()
        previous = section
        table.add_row(*[column[i] for column in cells], style=style)
    return table


def fits(console: Console, cols: list[Col], rows: list[dict]) -> bool:
    return min_width([c.header for c in cols], _cells(cols, rows), [not c.wrap for c in cols]) <= console.width


def fitted_table(console: Console, cols: list[Col], rows: list[dict], *, wide: bool = False,
                 title: str | None = None, caption: str = "", styles=None) -> tuple[Table, list[Col]]:
    """The table of `rows` that fits `console`'s width, and the columns it had to hide."""
    styles = styles or [None] * len(rows)
    shown = list(cols)
    hidden: list[Col] = []
    if not wide:
        optional = [c for c in cols if c.optional]
        while optional and not fits(console, shown, rows):
            gone = optional.pop()
            shown.remove(gone)
            hidden.insert(0, gone)
    note = f"{len(hidden)} more columns ({', '.join(c.header for c in hidden)}): --wide" if hidden else ""
    text = "\n".join(t for t in (caption, note) if t) or None
    return _build(shown, rows, title, text, styles), hidden


def print_table(console: Console, table: Table, wide: bool = False) -> None:
    """Print `table`; with --wide, first widen the console to the table's natural width (the
    terminal then wraps long lines, but rich cuts no cell)."""
    if wide:
        need = Measurement.get(console, console.options.update(max_width=100000), table).maximum
        if need > console.width:
            console.width = need
    console.print(table)
