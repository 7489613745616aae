"""Model shapes from Hugging Face ``config.json`` copies under ``servers/models/``.

A model directory is the HF id with ``/`` replaced by ``--`` (``Qwen/Qwen2.5-7B-Instruct`` ->
``Qwen--Qwen2.5-7B-Instruct``), the same convention as the Hugging Face cache.

A model may also be a local folder (``/models/qwen2_5_7b``, ``./qwen``, ``~/m``), as ``vllm serve
/path`` takes it on hosts without internet: its own ``config.json`` is read, and its id is the
path exactly as given, because vLLM's served model name defaults to the model argument.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from servelab.core.errors import ServelabError
from servelab.core.paths import servers_dir

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


def models_dir() -> Path:
    return servers_dir() / "models"


def model_dir_name(hf_id: str) -> str:
    return hf_id.replace("/", "--")


def hf_id_from_dir(dir_name: str) -> str:
    return dir_name.replace("--", "/", 1)


def list_models() -> list[str]:
    """Known HF ids, sorted."""
    return sorted(hf_id_from_dir(p.parent.name) for p in models_dir().glob("*/config.json"))


@dataclass(frozen=True)
class ModelSpec:
    hf_id: str
    config: dict
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    torch_dtype: str
    quantization_config: dict | None
    qkv_bias: bool

    @property
    def short_name(self) -> str:
        return self.hf_id.rstrip("/").split("/")[-1]

    @property
    def quant_method(self) -> str | None:
        return None if self.quantization_config is None else str(self.quantization_config.get("quant_method"))

    @property
    def params_per_layer(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = d * (q + 2 * kv) + q * d + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * d * self.intermediate_size
        return attn + mlp

    @property
    def linear_params(self) -> int:
        """Parameters of the quantizable linear layers (all decoder layers)."""
        return self.num_layers * self.params_per_layer

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """lm_head reads vocab x hidden every step, tied or not."""
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.linear_params + self.embed_params + head

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2, tp: int = 1) -> float:
        """K and V for every layer, per TP rank (KV heads split across ranks, at least one each)."""
        kv_heads = max(1, self.num_kv_heads // tp)  # replicated when TP > KV heads
        return 2 * self.num_layers * kv_heads * self.head_dim * kv_dtype_bytes


def is_model_path(name: str) -> bool:
    """A local folder rather than an HF id: absolute, ``./``/``../``/``~`` relative, or an
    existing directory (vLLM, too, serves a local directory before asking the Hub)."""
    text = name.strip()
    return (text.startswith(("/", "./", "../", "~")) or text in (".", "..")
            or os.path.isdir(os.path.expanduser(text)))


def model_folder_config(name: str) -> Path:
    """``config.json`` of a local model folder; a clear error when it is missing."""
    folder = Path(os.path.expanduser(name.strip()))
    if not folder.is_dir():
        raise ServelabError(f"model {name!r}: no such folder; give the folder that holds the "
                            f"model's config.json (as `vllm serve FOLDER` takes it) or a Hugging "
                            f"Face id such as Qwen/Qwen2.5-7B-Instruct")
    path = folder / "config.json"
    if not path.is_file():
        raise ServelabError(f"model {name!r}: {path} is missing; a model folder needs the model's "
                            f"Hugging Face config.json (copy it there, e.g. from "
                            f"servers/models/ORG--NAME/config.json)")
    return path


def resolve_model_id(name: str) -> str:
    """Accept an HF id (``Qwen/Qwen3-14B``), a directory name or a short name (``Qwen3-14B``)."""
    known = list_models()
    wanted = name.strip().rstrip("/")
    lowered = wanted.lower()
    for hf in known:
        if lowered in (hf.lower(), model_dir_name(hf).lower(), hf.split("/")[-1].lower()):
            return hf
    raise ServelabError(
        f"unknown model {name!r}; known: {', '.join(known)} "
        f"(add servers/models/{model_dir_name(wanted) if '/' in wanted else 'ORG--NAME'}/config.json, "
        f"a copy of the model's Hugging Face config.json; or, for a local model folder, give "
        f"its path: absolute or ./relative)"
    )


def load_model(name: str) -> ModelSpec:
    """By HF id (``servers/models/``) or from a local folder's own ``config.json``."""
    if is_model_path(name):
        hf_id, path = name.strip(), model_folder_config(name)
    else:
        hf_id = resolve_model_id(name)
        path = models_dir() / model_dir_name(hf_id) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ServelabError(f"{path}: not valid JSON: {exc}") from None
    return model_from_config(hf_id, cfg, path)


def model_from_config(hf_id: str, cfg: dict, path: Path | str = "config.json") -> ModelSpec:
    def need(key: str):
        if key not in cfg:
            raise ServelabError(f"{path}: field '{key}' is missing; copy the model's full config.json")
        return cfg[key]

    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    model_type = str(cfg.get("model_type", ""))
    # Qwen2 puts a bias on q/k/v; Llama and Qwen3 do not.
    qkv_bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
    return ModelSpec(
        hf_id=hf_id,
        config=cfg,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        vocab_size=int(need("vocab_size")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(need("max_position_embeddings")),
        torch_dtype=str(cfg.get("torch_dtype", "bfloat16")),
        quantization_config=cfg.get("quantization_config"),
        qkv_bias=qkv_bias,
    )


# The fields of config.json that fix a model's cost and memory (not its name or paths).
_SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size",
               "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "tie_word_embeddings", "torch_dtype", "quantization_config")


def _shape(cfg: dict) -> str:
    return json.dumps({k: cfg.get(k) for k in _SHAPE_KEYS}, sort_keys=True)


@lru_cache(maxsize=1)
def _known_shapes(directory: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(Path(directory).glob("*/config.json")):
        try:
            out.setdefault(_shape(json.loads(path.read_text())), hf_id_from_dir(path.parent.name))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def canonical_id(model: ModelSpec) -> str:
    """The HF id a model is known by: its own, or, for a local folder (``SERVELAB_MODEL=/folder``,
    ``vllm serve /folder``), the id under ``servers/models/`` whose config.json has the same
    shape, so that what is known for the id (a calibration) applies to the folder too; the
    folder's path when no known model has its shape."""
    if not is_model_path(model.hf_id):
        return model.hf_id
    return _known_shapes(str(models_dir())).get(_shape(model.config), model.hf_id)
