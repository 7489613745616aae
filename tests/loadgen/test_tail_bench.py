"""bench/tail.py's verdict over repeats: on a shared machine one row moves by more than a tenth,
so a level measured several times is also judged by each checkout's medians."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import tail  # noqa: E402


def _row(ref_cpu, cpu, ttft_over=1.0, itl=12.0, saturated=False):
    ref = {"ttft_p99": 52.0, "itl_p99": 11.0, "us_per_chunk": ref_cpu, "saturated": None}
    return {"ref": ref, "HEAD": {"ttft_p99": 52.0 + ttft_over, "itl_p99": itl,
                                 "us_per_chunk": cpu, "saturated": saturated}}


def test_a_repeated_level_is_judged_by_its_medians():
    # CPU ratios 1.05, 1.50, 1.08: one noisy row misses, the median (1.08x) holds
    rows = [_row(10.0, 10.5), _row(10.0, 15.0), _row(10.0, 10.8)]
    lines = tail.table([256, 256, 256], rows, ["ref", "HEAD"])
    assert sum("MISSES" in line for line in lines if line.startswith("256: ")) == 1
    (median,) = [line for line in lines if line.startswith("256 (median of 3)")]
    assert "CPU 1.08x" in median and "ITL 1.09x" in median and "TTFT +1.0 ms" in median
    assert median.endswith("holds")


def test_the_medians_miss_and_a_flag_at_256_counts():
    rows = [_row(10.0, 12.0), _row(10.0, 10.5, saturated=True), _row(10.0, 12.5)]
    (median,) = [line for line in tail.table([256, 256, 256], rows, ["ref", "HEAD"])
                 if "(median of 3)" in line]
    assert "CPU 1.20x" in median and "flagged 1" in median and median.endswith("MISSES")
    # a TTFT tail over the reference's by more than 3 ms misses at any level
    rows = [_row(10.0, 10.0, ttft_over=3.5), _row(10.0, 10.0, ttft_over=2.0),
            _row(10.0, 10.0, ttft_over=4.0)]
    (median,) = [line for line in tail.table([128, 128, 128], rows, ["ref", "HEAD"])
                 if "(median of 3)" in line]
    assert "TTFT +3.5 ms" in median and median.endswith("MISSES")


def test_a_level_measured_once_has_no_median_line():
    lines = tail.table([128, 256], [_row(10.0, 10.5), _row(10.0, 10.5)], ["ref", "HEAD"])
    assert not any("median" in line for line in lines)
