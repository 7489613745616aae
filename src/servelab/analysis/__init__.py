"""Analysis over the servelab DuckDB file: the SQL views of ``analysis/*.sql`` (each metric
defined once, in SQL), terminal summaries, comparisons with bootstrap confidence intervals, and
HTML reports with plots."""
