"""servelab: measure LLM serving variants with designed traffic, record every request in DuckDB."""

__version__ = "0.1.0"
