"""The simulated vLLM: ``sim.engine`` (the clock-free engine, its cost model and the virtual-time
driver) and ``sim.server`` (the engine in real time behind vLLM's OpenAI-compatible HTTP API).
``sim.engine`` never imports ``sim.server``."""
