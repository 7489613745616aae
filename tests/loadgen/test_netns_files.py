"""The files a profile names travel with it (loadgen/profile_files.py): found wherever the
profile names them, rebuilt on a worker so every relative path resolves, and bounded."""
import shutil
from pathlib import Path

import pytest

import servelab

from servelab.core.errors import ServelabError
from servelab.loadgen import profile_files
from servelab.profiles import load_profile

PROMPTS = "tokens\n" + "".join(f"{100 + 7 * i}\n" for i in range(40))

PROFILE = """\
name: shipped
description: Prompt lengths one folder up, output lengths beside it, a tokenizer below it.
endpoint: completions
model: some-model
tokenizer: tok/tokenizer.json
classes:
  - name: conversation
    prompt_tokens: {kind: empirical, file: ../shared/prompts.csv}
    output_tokens: {kind: empirical, file: lengths/outputs.csv}
load:
  concurrency: {levels: [2], hold: 5s}
"""


def _master_folder(tmp_path):
    home = tmp_path / "master" / "profiles"
    (home / "lengths").mkdir(parents=True)
    (home / "tok").mkdir()
    (tmp_path / "master" / "shared").mkdir()
    (tmp_path / "master" / "shared" / "prompts.csv").write_text(PROMPTS)
    (home / "lengths" / "outputs.csv").write_text("tokens\n12\n34\n56\n")
    shutil.copy(Path(servelab.__file__).parent / "data" / "tokenizer.json",
                home / "tok" / "tokenizer.json")
    (home / "shipped.yaml").write_text(PROFILE)
    return home / "shipped.yaml"


def test_named_files_travel_and_the_copy_loads_like_the_original(tmp_path):
    original = load_profile(_master_folder(tmp_path))
    assert profile_files.referenced(original) == [
        "../shared/prompts.csv", "lengths/outputs.csv", "tok/tokenizer.json"]
    sent = profile_files.bundle(original)
    assert sent["error"] is None
    shipped = sent["files"]
    assert shipped["../shared/prompts.csv"] == PROMPTS
    # the worker's side: nothing of the master's folder, only the message's text
    shutil.rmtree(tmp_path / "master")
    copy = profile_files.unpack(tmp_path / "worker", "shipped.yaml", PROFILE, shipped)
    assert copy.is_relative_to((tmp_path / "worker").resolve())
    again = load_profile(copy)
    assert again.tokenizer_path.read_text() == shipped["tok/tokenizer.json"]
    for dist in ("prompt_tokens", "output_tokens"):
        values = getattr(again.classes[0], dist)._values
        assert values and values == getattr(original.classes[0], dist)._values


def test_over_the_cap_nothing_travels_and_a_worker_without_the_files_says_why(tmp_path,
                                                                            monkeypatch):
    from servelab.loadgen.worker.context import load_shipped_profile

    path = _master_folder(tmp_path)
    monkeypatch.setattr(profile_files, "MAX_SHIPPED_BYTES", 1000)
    sent = profile_files.bundle(load_profile(path))
    assert sent["files"] == {}
    assert "tok/tokenizer.json (1." in sent["error"] and "at most 0 MiB travel" in sent["error"]
    run = {"run_id": "r1", "profile_path": str(path), "profile_text": PROFILE,
           "profile_files": sent}
    # a worker on the master's host has the files: it runs
    assert load_shipped_profile(run, str(tmp_path / "spool")).name == "shipped"
    # one without them stops with the master's reason
    shutil.rmtree(tmp_path / "master")
    with pytest.raises(ServelabError, match="at most 0 MiB travel to the workers"):
        load_shipped_profile(run, str(tmp_path / "spool"))


def test_paths_the_worker_cannot_rebuild_are_refused(tmp_path):
    with pytest.raises(ServelabError, match="absolute path.*relative to the profile's folder"):
        profile_files.unpack(tmp_path, "p.yaml", "x", {"/nowhere/trace.csv": "t"})
