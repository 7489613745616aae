"""Shared helpers for the orchestration tests: repository paths and the real CLI."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(capsys):
    """Run ``servelab ARGS...`` in-process; returns (exit status, stdout, stderr)."""
    from servelab.cli import main

    def run(*args: str):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
