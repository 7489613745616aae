"""Analysis over the servelab DuckDB file: the SQL views of ``analysis/*.sql`` (each metric
defined once, in SQL), the metric catalogue that names and formats them (catalogue.py), terminal
summaries, comparisons with bootstrap confidence intervals, and HTML reports with plots.

Entry points for callers above (orchestration, commands): ``db.open_for_reading``,
``summary.print_summary``, ``compare.compare_runs``, ``report.write_report``, and
``views.open_results_db`` for writers."""
