"""The metric catalogue: every metric names a real view column, the SQL compare view judges each
metric in the same direction, and the terminal and the HTML write one cell the same way."""
import math

from servelab.analysis.catalogue import (COMPARED, METRICS, comparison_cell, format_ratio, format_value,
                                         level_text)
from servelab.analysis.compare import MetricResult


def test_every_metric_is_a_column_of_its_view(known_con):
    for m in METRICS.values():
        columns = {r[0] for r in known_con.execute(f"DESCRIBE {m.view}").fetchall()}
        assert m.column in columns, (m.name, m.view)


def test_the_compare_view_agrees_on_better(known_con):
    sql_better = dict(known_con.execute("SELECT DISTINCT metric, better FROM compare").fetchall())
    for name, direction in sql_better.items():
        assert METRICS[name].better == direction, name
    assert {m.name for m in COMPARED} <= set(sql_better)


def test_formats():
    assert format_value("goodput", 1.23456) == "1.23"
    assert format_value("ttft_p99_ms", 12345.6) == "12,346"
    assert format_value("ttft_p99_adj_ms", math.inf) == "inf"
    assert format_value("slo_attainment", 0.5) == "50.0%"
    assert format_value("waiting_max", 3.0) == "3"
    assert format_value("itl_p50_ms", None) == "-" and format_value("itl_p50_ms", math.nan) == "-"
    assert format_ratio(0.8312) == " x0.83" and format_ratio(math.inf, "×") == " ×inf"
    assert format_ratio(math.nan) == ""
    assert level_text(4.0) == "4" and level_text(0.25) == "0.25"


def test_one_cell_text_for_terminal_and_report():
    m = MetricResult("goodput", {"a": 2.0, "b": 2.5}, {"a": (1.9, 2.1), "b": None},
                     {"a": 1.0, "b": 1.25}, {}, {"b": False})
    assert comparison_cell(m, "a", "a") == ("2.00 [1.90, 2.10]", "")
    assert comparison_cell(m, "b", "a", "×") == ("2.50", " ×1.25")
    assert comparison_cell(m, "c", "a") is None
