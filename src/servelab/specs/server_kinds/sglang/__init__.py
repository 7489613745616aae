"""SGLang as a server kind, in one package: its serve flags, checks, memory rule and scheduling
knobs (``serve``), its start-up log and ``/metrics`` grammar (``log``), and what the simulator
writes in its words (``sim_log``, ``sim_metrics``); how it is told to send its request traces
(``tracing``, read by orchestration/otlp.py as ``TRACING``)."""
from servelab.specs.server_kinds.sglang import tracing
from servelab.specs.server_kinds.sglang.serve import SGLANG

KIND = SGLANG
TRACING = tracing
