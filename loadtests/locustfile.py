"""servelab's Locust entry point: replay a traffic profile against an OpenAI-compatible server.

    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 --profile traffic_profiles/chat.yaml

The web UI (http://127.0.0.1:8089) has two modes, picked in the start form (or with ``--mode``):
``plan`` runs the profile's load plan (``ProfileShape``; the form says what it is), ``manual``
ramps ``LLMUser`` by hand (``ManualShape``: the users and ramp-up fields, changed while it runs
with Edit; each level a stage). Its LLM tab charts TTFT, ITL, TPOT, tokens/s, goodput, errors and
the server's state live; ``/servelab/api`` answers JSON (docs/api.md). Every request lands as one
row in the DuckDB file (``--db``, never set from the form); ``servelab run`` wraps all of this,
headless, with workers.
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
