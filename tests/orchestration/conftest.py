"""Shared helpers for the orchestration tests: repository paths and the real CLI."""
from __future__ import annotations

import os
import stat
import sys
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


# What the stand-in for `vllm serve MODEL ARGS...` runs: vLLM's arguments go to the simulator.
VLLM_TO_SIM = f"""[ "$1" = serve ] || exit 64
shift
model="$1"; shift
exec {sys.executable} -m servelab.commands.sim --model "$model" --hardware L40S "$@"
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """``stand_in(name, body)`` puts an executable shell script ``name`` first on PATH (a stand-in
    for a serving framework's command); with ``argv_file`` it first records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def make(name: str, body: str, argv_file: Path | None = None) -> Path:
        fake = bin_dir / name
        record = f"printf '%s\\n' \"$@\" > {argv_file}\n" if argv_file else ""
        fake.write_text(f"#!/bin/sh\n# A stand-in for {name}, for the tests.\n{record}{body}")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        return fake

    make.vllm_to_sim = VLLM_TO_SIM
    return make
