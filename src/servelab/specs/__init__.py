"""Specs layer: GPUs (servers/hardware), models (servers/models), vLLM serve flags, engine config."""
from servelab.specs.engine_config import (
    CostParams,
    EngineConfig,
    QuantPath,
    SpecDecodeConfig,
    batch_defaults,
    build_engine_config,
)
from servelab.specs.hardware import HardwareSpec, hardware_for_gpu_name, list_hardware, load_hardware
from servelab.specs.models import (
    ModelSpec,
    hf_id_from_dir,
    list_models,
    load_model,
    model_dir_name,
    resolve_model_id,
)
from servelab.specs.serve_args import ServeArgs, parse_serve_args

__all__ = [
    "CostParams", "EngineConfig", "HardwareSpec", "ModelSpec", "QuantPath", "ServeArgs",
    "SpecDecodeConfig", "batch_defaults", "build_engine_config", "hardware_for_gpu_name",
    "hf_id_from_dir", "list_hardware", "list_models", "load_hardware", "load_model",
    "model_dir_name", "parse_serve_args", "resolve_model_id",
]
