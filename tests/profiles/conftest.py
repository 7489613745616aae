"""Shared helpers for the traffic-profile tests."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from servelab.core.paths import DATA_DIR

# --import-mode=importlib puts no test folder on sys.path; the fuzz test imports its harness.
sys.path.insert(0, str(Path(__file__).parent))

TOKENIZER_JSON = DATA_DIR / "tokenizer.json"
# Planned prompt lengths every counter can reach (each above its class's template, prefix and
# tag): fixed, varied and shared-prefix classes, so a test can demand planned == counted for every
# request (test_exact_lengths against the simulator's /tokenize, test_server_counting against a
# server's). Formatted with the endpoint and the hold.
EXACT_PROFILE = """name: exact
description: fixed and varied lengths, shared prefixes
endpoint: {endpoint}
model: auto
seed: 11
classes:
  - name: fixed
    prompt_tokens: {{kind: fixed, value: 1024}}
    output_tokens: {{kind: fixed, value: 2}}
  - name: varied
    prompt_tokens: {{kind: uniform, min: 40, max: 1500}}  # above template + tag
    output_tokens: {{kind: fixed, value: 2}}
  - name: shared
    prefix_tokens: 200
    prefix_groups: 3
    prompt_tokens: {{kind: uniform, min: 30, max: 400}}  # above prefix + tag: reachable
    output_tokens: {{kind: fixed, value: 2}}
load:
  concurrency: {{levels: [64], warmup: 0s, hold: {hold}}}
"""
REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "traffic_profiles").glob("*.yaml"))
# Every 50th row of the hour-long Azure trace (CC-BY 4.0; data/README.md has the attribution).
AZURE_HOUR = Path(__file__).parent / "data" / "azure_conv_every50th.csv"


@pytest.fixture
def write_profile(tmp_path):
    """Write a YAML profile (dedented) into tmp_path and return its path."""
    def write(text: str, name: str = "profile.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path
    return write


@pytest.fixture(scope="session")
def tokenizer_counter():
    """One local-tokenizer counter for the whole session (encoding a corpus costs ~0.5 s)."""
    from servelab.profiles.tokens import TokenizerCounter

    return TokenizerCounter(TOKENIZER_JSON)
