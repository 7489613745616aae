"""The simulated vLLM engine (Sequence, BlockManager, Scheduler, CostModel, Engine) and its
virtual-time runner. The HTTP server lives in ``servelab.sim.server``."""
from servelab.sim.balancer import least_outstanding, make_engines, pick_engine
from servelab.sim.engine import Engine, EngineStartupError, EngineStats, StepOutput, TokenEvent
from servelab.sim.kv_sizing import KVPlan, plan_kv_cache, preflight
from servelab.sim.sequence import Sequence
from servelab.specs.engine_config import EngineConfig, build_engine_config

__all__ = [
    "Engine", "EngineConfig", "EngineStartupError", "EngineStats", "KVPlan", "Sequence", "StepOutput",
    "TokenEvent", "build_engine_config", "least_outstanding", "make_engines", "pick_engine",
    "plan_kv_cache", "preflight",
]
