"""What every layer shares: paths, user-facing errors, the line-numbered YAML reader, child
processes, timeout defaults and the one percentile used outside SQL. Imports nothing above it."""
