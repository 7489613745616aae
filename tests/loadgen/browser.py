"""Headless Chromium for the web UI tests: Debian's own browser driven by Playwright (no browser
download, ever), skipped with the reason when either is missing, and screenshots kept.

``SERVELAB_SCREENSHOTS=docs/img`` (a folder, relative to the repository) also copies the
screenshots a test names for the docs there; without it they stay under the test's tmp_path.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("SERVELAB_CHROMIUM", "/usr/bin/chromium"))
# No sandbox: CI runs as root in a container, where Chromium's sandbox cannot start. The rest
# keeps the browser off the network beyond the page under test (no updates, sync or QUIC probes).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}


@contextmanager
def chromium():
    """A launched Playwright ``Browser`` (closed on exit)."""
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium, or point "
                    f"SERVELAB_CHROMIUM at one")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright missing: pip install -e '.[test]'")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def page_on(browser, url: str, log: Path):
    """A fresh page at ``url``; the browser console and page errors go to ``log`` (what a
    failing UI test needs to be understood)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    lines: list[str] = []
    page.on("console", lambda m: m.type == "verbose"
            or lines.append(f"console.{m.type}: {m.text}"))
    page.on("pageerror", lambda e: lines.append(f"pageerror: {e}"))
    try:
        page.goto(url)
        yield page
    finally:
        log.write_text("\n".join(lines) + "\n")
        context.close()


def screenshot(page, tmp_path: Path, name: str, for_docs: bool = False) -> Path:
    """``tmp_path/NAME.png`` of the whole page; with ``for_docs`` and SERVELAB_SCREENSHOTS set,
    also copied into that folder (the README's picture is the one a test run took)."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("SERVELAB_SCREENSHOTS")
    if for_docs and target:
        folder = Path(target) if Path(target).is_absolute() else ROOT / target
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    return path
