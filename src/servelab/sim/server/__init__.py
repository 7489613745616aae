"""The simulated vLLM server: the engines of ``sim.engine`` driven in real time (``realtime``)
behind vLLM's OpenAI-compatible API (``openai_api``, ``protocol``), with vLLM's metrics, start-up
log, fault injection and output text. ``server.build_server`` / ``start_background`` are the
programmatic entry points, ``serve`` the foreground loop behind ``servelab sim``."""
