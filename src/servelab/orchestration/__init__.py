"""Orchestration: bring server variants up (simulator, ``vllm serve``, Docker Compose, a given
URL), check them before (preflight) and after start-up (verify), run the variant matrix, predict
runs in virtual time and compare greedy outputs (fidelity). Each module is small and uses the
layers below it: specs, the simulator engine, the store, the load generator and the analysis."""
