"""verify on a prefill/decode-disaggregated variant: both roles' logs and /metrics, one verdict.

The inputs are WRITTEN (servers/written/pd/README.md): vLLM 0.26's real start-up log and /metrics
page (servers/captured/bf16) with what a NixlConnector instance adds, from vLLM's source, until
the two-GPU issue captures a real pair. The bad cases are edits of those texts."""
from __future__ import annotations

from pathlib import Path

import pytest

from servelab.core.errors import ServelabError
from servelab.orchestration.serverlog import split_compose_log
from servelab.orchestration.verify import verify
from servelab.specs.variants import load_variant

PD = Path(__file__).resolve().parents[2] / "servers" / "written" / "pd"
SERVICES = ["vllm-pd-1p1d-prefill-0", "vllm-pd-1p1d-decode-0"]
PAGES = [PD / "prefill-0.metrics", PD / "decode-0.metrics"]


@pytest.fixture(scope="module")
def variant():
    return load_variant("pd_1p1d", environ={})


def _check(verdict, name):
    return next(c for c in verdict.checks if c.name == name)


def test_every_input_says_it_was_written_not_captured():
    for path in [PD / "compose.log", *PAGES]:
        assert path.read_text().startswith("# WRITTEN, not captured"), path
    assert "WRITTEN, not captured" in (PD / "README.md").read_text()


def test_one_compose_log_is_split_by_service():
    roles = split_compose_log((PD / "compose.log").read_text(), SERVICES)
    assert sorted(roles) == sorted(SERVICES)
    assert "engine_id: 3f9c1e2a" in roles[SERVICES[0]] and "3f9c1e2a" not in roles[SERVICES[1]]
    assert not any(" | " in line[:40] for line in roles[SERVICES[1]].splitlines())   # no prefix


def test_both_roles_verified_with_their_connector_kv_cache_and_transfers(variant):
    verdict = verify(variant, log_path=PD / "compose.log", metrics_path=PAGES)
    assert verdict.status == "verified", verdict.summary()
    for role in ("prefill-0", "decode-0"):
        connector = _check(verdict, f"{role} kv_connector")
        assert connector.status == "ok" and "NixlConnector, kv_role kv_both" in connector.detail
        assert "NIXL wrapper, worker, Scheduler initialized" in connector.detail
        assert _check(verdict, f"{role} kv_cache").detail.startswith("2,115,440 tokens")
        assert _check(verdict, f"{role} precision").detail == "unquantized (torch.bfloat16)"
    moved = _check(verdict, "decode-0 kv_transfer")
    assert moved.status == "ok" and moved.detail == ("192 KV transfers read, 10,752.0 MiB, "
                                                     "mean 2.31 ms")
    assert _check(verdict, "prefill-0 kv_transfer").status == "ok"
    roles = verdict.facts["roles"]
    assert roles["decode-0"]["service"] == SERVICES[1]
    assert roles["prefill-0"]["connector"]["kv_role"] == "kv_both"
    assert verdict.sources == [str(PD / "compose.log"), *map(str, PAGES)]
    assert "decode-0 kv_connector" in verdict.summary()


def test_the_command_line_takes_each_instance_joined_by_commas(variant, monkeypatch, capsys):
    from servelab.cli import main

    monkeypatch.delenv("SERVELAB_MODEL", raising=False)
    assert main(["verify", "pd_1p1d", "--log", str(PD / "compose.log"),
                 "--metrics", ",".join(map(str, PAGES))]) == 0
    out = capsys.readouterr().out
    assert "verify pd_1p1d: VERIFIED" in out and "decode-0 kv_transfer" in out


def _edited(tmp_path, role, edit):
    """compose.log with one role's lines changed by ``edit``."""
    lines = []
    for line in (PD / "compose.log").read_text().splitlines():
        if line.startswith(SERVICES[role]):
            line = edit(line)
        if line is not None:
            lines.append(line)
    path = tmp_path / "compose.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_decode_instance_started_without_the_connector_is_a_mismatch(variant, tmp_path):
    def plain(line):
        if "NIXL" in line or "v1 connector" in line:
            return None
        return line.split(", 'kv_transfer_config'")[0] + "}" if "non-default" in line else line

    verdict = verify(variant, log_path=_edited(tmp_path, 1, plain))
    assert verdict.status == "mismatch"
    check = _check(verdict, "decode-0 kv_connector")
    assert check.status == "fail" and "without --kv-transfer-config" in check.detail
    assert _check(verdict, "prefill-0 kv_connector").status == "ok"


def test_a_producer_role_or_another_connector_is_a_mismatch(variant, tmp_path):
    producer = verify(variant, log_path=_edited(
        tmp_path, 0, lambda line: line.replace("kv_role='kv_both'", "kv_role='kv_producer'")))
    assert "kv_role kv_producer" in _check(producer, "prefill-0 kv_connector").detail
    assert producer.status == "mismatch"
    p2p = verify(variant, log_path=_edited(
        tmp_path, 1, lambda line: line.replace("name: NixlConnector", "name: P2pNcclConnector")))
    assert "built P2pNcclConnector" in _check(p2p, "decode-0 kv_connector").detail


def test_a_missing_role_leaves_the_verdict_unverified(variant, tmp_path):
    verdict = verify(variant, log_path=_edited(tmp_path, 1, lambda line: None))
    assert verdict.status == "unverified"
    assert _check(verdict, "decode-0 evidence").status == "unknown"
    assert _check(verdict, "prefill-0 kv_connector").status == "ok"


def test_inputs_that_cannot_be_assigned_to_roles_are_refused(variant, tmp_path):
    bare = tmp_path / "one.log"
    bare.write_text((PD / "compose.log").read_text().replace(SERVICES[0], "web")
                    .replace(SERVICES[1], "db"))
    with pytest.raises(ServelabError, match=r"one\.log: no line is prefixed with a pd_1p1d "
                       r"service .*docker compose --profile pd_1p1d logs --no-color"):
        verify(variant, log_path=bare)
    with pytest.raises(ServelabError, match="give one /metrics page per instance in that order, "
                       "got 1"):
        verify(variant, metrics_path=PAGES[:1])
