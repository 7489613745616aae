"""The simulated vLLM engine, shaped like nano-vllm: Sequence, BlockManager, Scheduler, a roofline
CostModel (coefficients in ``costs``), Engine, and the virtual-time driver (``virtual``) with its
user model (``virtual_users``). Nothing here knows about HTTP."""
from servelab.sim.engine.balancer import least_outstanding, make_engines, pick_engine
from servelab.sim.engine.engine import Engine, EngineStartupError, EngineStats, StepOutput, TokenEvent
from servelab.sim.engine.kv_sizing import KVPlan, plan_kv_cache, preflight
from servelab.sim.engine.sequence import Sequence
from servelab.specs.engine_config import EngineConfig, build_engine_config

__all__ = [
    "Engine", "EngineConfig", "EngineStartupError", "EngineStats", "KVPlan", "Sequence", "StepOutput",
    "TokenEvent", "build_engine_config", "least_outstanding", "make_engines", "pick_engine",
    "plan_kv_cache", "preflight",
]
