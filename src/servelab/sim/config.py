"""The engine's configuration lives in the specs layer (the simulator reads variant specs from
there); re-exported here so engine code and callers have one import."""
from servelab.specs.engine_config import (  # noqa: F401
    CostParams,
    EngineConfig,
    QuantPath,
    SpecDecodeConfig,
    batch_defaults,
    build_engine_config,
)
