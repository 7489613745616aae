"""Orchestration: running things. ``runner`` supervises one ``servelab run`` (simulator child,
Locust master and workers, progress); ``backends`` brings server variants up (simulator,
``vllm serve``, Docker Compose, a given URL); ``preflight`` and ``verify`` check them before and after
start-up; ``matrix`` runs variants through the runner and compares them in-process; ``predict``
runs a profile in virtual time; ``fidelity`` compares greedy outputs. Commands stay thin above it."""
