"""Trace files: the Azure LLM inference CSV and Mooncake JSONL layouts."""
from __future__ import annotations

import pytest

from servelab.profiles.trace import TraceFormatError, read_trace, select_rows

from .conftest import AZURE_HOUR, REPO

SAMPLE = REPO / "traffic_profiles" / "traces" / "azure_conv_sample.csv"


def test_shipped_azure_sample():
    rows = read_trace(SAMPLE)
    assert len(rows) == 400
    # First rows of the file: 18:15:46.6805900,374,44 then 18:15:50.9951690,396,109.
    assert (rows[0].arrival_s, rows[0].prompt_tokens, rows[0].output_tokens) == (0.0, 374, 44)
    assert rows[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    assert (rows[1].prompt_tokens, rows[1].output_tokens) == (396, 109)
    assert rows[-1].arrival_s == pytest.approx((17 * 60 + 33.0108020) - (15 * 60 + 46.6805900),
                                               abs=1e-6)


def test_hour_long_trace_stays_in_order_and_keeps_every_row():
    rows = read_trace(AZURE_HOUR)
    data_lines = [line for line in AZURE_HOUR.read_text().splitlines()[1:] if line.strip()]
    assert len(rows) == len(data_lines) == 389
    assert rows[0] == read_trace(SAMPLE)[0]     # both start at the trace's first request
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(rows, rows[1:]))
    assert 3000 < rows[-1].arrival_s < 4000     # about an hour of traffic


def test_mooncake_jsonl(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 27482, "input_length": 6955, "output_length": 52, '
                    '"hash_ids": [46, 47, 48]}\n'
                    '{"timestamp": 30535, "input_length": 6472, "output_length": 26, '
                    '"hash_ids": [46, 52]}\n\n'
                    '{"timestamp": 29000, "input_length": 10, "output_length": 1}\n')
    rows = read_trace(path)
    # Sorted by time, relative to the first, milliseconds to seconds.
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in rows] == \
        [(0.0, 6955, 52), (pytest.approx(1.518), 10, 1), (pytest.approx(3.053), 6472, 26)]


def test_time_scale_and_limits():
    rows = read_trace(SAMPLE)
    fast = select_rows(rows, time_scale=0.5)
    assert fast[-1].arrival_s == pytest.approx(rows[-1].arrival_s / 2)
    window = select_rows(rows, 1.0, start_s=10.0, max_duration_s=20.0)
    assert window[0].arrival_s == 0.0 and all(r.arrival_s < 20 for r in window)
    first_kept = next(r for r in rows if r.arrival_s >= 10.0)
    assert window[0].prompt_tokens == first_kept.prompt_tokens
    assert len(select_rows(rows, 1.0, max_requests=5)) == 5


def test_format_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n"
                   "2023-11-16 18:15:47.00,ten,5\n")
    with pytest.raises(TraceFormatError, match="line 3: ContextTokens 'ten' is not a number"):
        read_trace(bad)
    header = tmp_path / "header.csv"
    header.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(TraceFormatError, match="line 1: header time,prompt,output lacks "
                                               "TIMESTAMP, ContextTokens, GeneratedTokens"):
        read_trace(header)
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"timestamp": 1, "input_length": 2, "output_length": 3}\n'
                     '{"timestamp": 2, "input_length": 2}\n')
    with pytest.raises(TraceFormatError, match="line 2: missing output_length"):
        read_trace(jsonl)
    numeric = tmp_path / "numeric.txt"       # no suffix: sniffed; numeric seconds accepted
    numeric.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n10.5,1,2\n12,3,4\n")
    assert [r.arrival_s for r in read_trace(numeric)] == [0.0, 1.5]
