"""The live line of ``servelab run``, read from the status file the Locust master rewrites every
second. On a terminal it is one rich Live line on stderr; piped, a plain line every 5 s, so a log
file does not fill with redraws."""
from __future__ import annotations

import json
import time
from pathlib import Path


def watch(master, status_file: Path, quiet: bool, profile) -> None:
    """Show progress until ``master`` (a ``core.procs.Child``) exits."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    if console.is_terminal and not quiet:
        with Live(console=console, refresh_per_second=2, transient=True) as live:
            while master.alive():
                live.update(progress_text(_read(status_file), profile))
                time.sleep(0.5)
        return
    last_line = 0.0
    while master.alive():
        st = _read(status_file)
        if not quiet and st and time.monotonic() - last_line >= 5.0:
            last_line = time.monotonic()
            console.print(progress_text(st, profile), highlight=False)
        time.sleep(0.25)


def _read(status_file: Path) -> dict | None:
    try:
        return json.loads(status_file.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or caught between the master's write and rename


def progress_text(st: dict | None, profile) -> str:
    if not st:
        return "starting Locust ..."

    def ms(v):
        return "-" if v is None else f"{v:.1f}"

    stage = st.get("stage")
    n = st.get("stages") or "?"
    level = st.get("level")
    kind = st.get("stage_kind") or profile.load.kind
    axis = profile.load.kind if kind == "search" else kind   # a probe: the searched plan's
    unit = "req/s" if axis in ("rate", "trace") else "users"
    amount = "" if level is None else f" {level:g} {unit}"
    where = "-" if stage is None else f"{stage + 1}/{n} ({kind}{amount})"
    return (f"{profile.name}  stage {where}  {st.get('elapsed_s', 0):.0f} s  "
            f"requests {st.get('stored', 0)}/{st.get('produced', 0)} stored  "
            f"errors {st.get('errors', 0)}  TTFT p50/p99 {ms(st.get('ttft_p50_ms'))}/"
            f"{ms(st.get('ttft_p99_ms'))} ms  ITL p50/p99 {ms(st.get('itl_p50_ms'))}/"
            f"{ms(st.get('itl_p99_ms'))} ms  [{st.get('state', 'running')}]")


def read_status(status_file: Path) -> dict:
    """The master's last status (the final counts), or {} when it never wrote one."""
    return _read(status_file) or {}
