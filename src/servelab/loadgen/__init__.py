"""The load generator: Locust users that stream LLM requests, the profile's load shapes and
open-loop arrivals, and the lossless recording of every request into DuckDB.

Import ``servelab.loadgen.users`` / ``plugin`` only inside a Locust process: they import locust,
which monkey-patches the process through gevent.
"""
