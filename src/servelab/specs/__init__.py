"""Specs layer: GPUs (servers/hardware), models (servers/models), server kinds (vLLM: its serve
flags, command line and log grammar), engine config."""
from servelab.specs.engine_config import (
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
from servelab.specs.server_kinds import ServerKind, server_kind

__all__ = [
    "EngineConfig", "HardwareSpec", "ModelSpec", "QuantPath", "ServeArgs", "ServerKind",
    "SpecDecodeConfig", "batch_defaults", "build_engine_config", "hardware_for_gpu_name",
    "hf_id_from_dir", "list_hardware", "list_models", "load_hardware", "load_model",
    "model_dir_name", "parse_serve_args", "resolve_model_id", "server_kind",
]
