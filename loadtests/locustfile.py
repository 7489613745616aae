"""servelab's Locust entry point: replay a traffic profile against an OpenAI-compatible server.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 --profile traffic_profiles/chat.yaml

The web UI's start form shows servelab's options (profile, variant, database, tags, timeouts).
The profile's load plan drives the run through ``ProfileShape``; start Locust with
``--class-picker`` and pick the "Default" shape to ramp ``LLMUser`` by hand instead. Every request
lands as one row in the DuckDB file (``--db``); ``servelab run`` wraps all of this, with workers.
The logic lives in ``servelab.loadgen``; this file only hands Locust its classes, and the master
its way to open the database (with the analysis views installed, so the file is ready to query).
"""
from locust import events

from servelab.analysis.views import open_results_db
from servelab.loadgen import plugin
from servelab.loadgen.shapes import ProfileShape
from servelab.loadgen.users import LLMUser, OpenLoopUser

plugin.install(events, open_db=open_results_db)

__all__ = ["LLMUser", "OpenLoopUser", "ProfileShape"]
