"""vLLM as a server kind, in one package: its serve flags and checks (``serve``), its start-up log
and ``/metrics`` grammar (``log``), the releases servelab reads and their wording (``versions``),
and the start-up log the simulator writes in its words (``sim_log``). The simulator's scheduling
and ``/metrics`` are vLLM's own, so this kind sets no ``scheduling`` or ``sim_metrics``."""
from servelab.specs.server_kinds.vllm.serve import VLLM

KIND = VLLM
