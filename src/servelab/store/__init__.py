"""The DuckDB store (``schema.sql``, batched appends), workers' spool files and spool ingestion."""
