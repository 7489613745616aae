"""Server variants: one YAML file per way of serving a model (``servers/variants/*.yaml``).

A variant is the single definition that Docker Compose, ``vllm serve`` on a GPU host and the
simulator all start from: the model, the exact ``vllm serve`` arguments, the GPUs it takes and what
it claims to run (precision, minimum compute capability, speculative method). Preflight checks the
claims against the hardware before a run; verify checks them against the server's log afterwards.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.core.errors import ServelabError
from servelab.core.paths import servers_dir
from servelab.core import yamlsource
from servelab.specs.serve_args import FLAG_ALIASES

WEIGHT_PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")
ACTIVATION_PRECISIONS = ("bf16", "fp16", "fp8", "int8")
SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp",
                       "suffix")
# vLLM's --quantization choices that servelab knows how to reason about; others are refused so a
# typo does not silently serve the unquantized model.
QUANTIZATION_METHODS = ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp4", "gptq",
                        "gptq_marlin", "gptq_bitblas", "awq", "awq_marlin", "marlin",
                        "compressed-tensors", "bitsandbytes", "gguf", "experts_int8", "moe_wna16",
                        "torchao", "quark", "mxfp4", "hqq", "inc")
# The orchestration owns where a server listens; a variant that pins them would collide.
RESERVED_FLAGS = ("--host", "--port", "--model")
INT_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
             "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--block-size")
TOP_KEYS = ("name", "description", "model", "model_env", "serve_args", "gpus", "instances",
            "claims", "notes")
CLAIM_KEYS = ("weights", "activations", "min_compute_capability", "speculative")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class VariantError(ServelabError):
    """A variant file that cannot be used; the message lists every problem with file and line."""


@dataclass(frozen=True)
class Claims:
    """What the variant says it runs; preflight and verify hold the server to it."""

    weights: str
    activations: str
    min_compute_capability: float | None
    speculative: str | None


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    model: str                      # after the environment override, the model that is served
    default_model: str              # as written in the file
    model_env: str | None
    serve_args: tuple[str, ...]
    gpus: int                       # GPUs the whole variant occupies (all instances together)
    instances: int
    claims: Claims
    path: Path
    notes: str = ""
    _args: dict[str, str | bool] = field(default_factory=dict, repr=False, compare=False)

    def arg(self, flag: str, default: Any = None) -> Any:
        """The value of ``--flag`` in serve_args (``True`` for a bare switch), else ``default``."""
        return self._args.get(flag, default)

    def int_arg(self, flag: str, default: int) -> int:
        value = self._args.get(flag)
        return int(value) if isinstance(value, str) else default

    @property
    def tensor_parallel_size(self) -> int:
        return self.int_arg("--tensor-parallel-size", 1)

    @property
    def pipeline_parallel_size(self) -> int:
        return self.int_arg("--pipeline-parallel-size", 1)

    @property
    def data_parallel_size(self) -> int:
        return self.int_arg("--data-parallel-size", 1)

    @property
    def gpus_per_instance(self) -> int:
        return self.gpus // self.instances

    @property
    def quantization(self) -> str | None:
        value = self._args.get("--quantization")
        return value if isinstance(value, str) else None

    @property
    def max_model_len(self) -> int | None:
        value = self._args.get("--max-model-len")
        return int(value) if isinstance(value, str) else None

    @property
    def speculative_config(self) -> dict | None:
        value = self._args.get("--speculative-config")
        return json.loads(value) if isinstance(value, str) else None

    @property
    def draft_model(self) -> str | None:
        spec = self.speculative_config or {}
        return spec.get("model") if spec.get("method") == "draft_model" else None

    def vllm_serve_args(self, port: int | None = None, host: str | None = None) -> list[str]:
        """Arguments after ``vllm serve`` for one instance: the model first, as vLLM wants it."""
        args = [self.model, *self.serve_args]
        if host is not None:
            args += ["--host", host]
        if port is not None:
            args += ["--port", str(port)]
        return args

    def to_record(self) -> dict:
        """What a run stores about the variant it measured (runs.settings)."""
        return {"name": self.name, "path": str(self.path), "model": self.model,
                "serve_args": list(self.serve_args), "gpus": self.gpus,
                "instances": self.instances,
                "claims": {"weights": self.claims.weights, "activations": self.claims.activations,
                           "min_compute_capability": self.claims.min_compute_capability,
                           "speculative": self.claims.speculative}}


def variants_dir() -> Path:
    return servers_dir() / "variants"


def list_variants(directory: Path | None = None) -> list[str]:
    directory = directory or variants_dir()
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_all(directory: Path | None = None) -> list[Variant]:
    directory = directory or variants_dir()
    return [load_variant(directory / f"{name}.yaml") for name in list_variants(directory)]


def resolve_path(name_or_path: str | os.PathLike) -> Path:
    text = str(name_or_path)
    candidate = Path(text)
    if text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text:
        if not candidate.is_file():
            raise VariantError(f"{text}: no such variant file; give a path to a YAML file or one of "
                               f"the names {', '.join(list_variants()) or '(none found)'}")
        return candidate
    path = variants_dir() / f"{text}.yaml"
    if not path.is_file():
        raise VariantError(f"unknown variant {text!r}: no {path}; known variants: "
                           f"{', '.join(list_variants()) or '(none found)'}")
    return path


def load_variant(name_or_path: str | os.PathLike, environ: dict | None = None) -> Variant:
    """Load and check a variant by name (``servers/variants/NAME.yaml``) or by file path."""
    path = resolve_path(name_or_path)
    environ = os.environ if environ is None else environ
    text = path.read_text(encoding="utf-8")
    try:
        doc = yamlsource.parse(text)
    except yamlsource.YamlSyntaxError as exc:
        raise VariantError(f"{path}:{exc.line}: not valid YAML: {exc}; fix the syntax "
                           f"(indentation, quotes around JSON in serve_args)") from None
    return _build(path, doc, environ)


class _Problems:
    def __init__(self, path: Path, lines: dict[tuple, int]):
        self.path, self.lines, self.items = path, lines, []

    def add(self, field_path: tuple, found: Any, allowed: str) -> None:
        line = self.lines.get(field_path) or self.lines.get(field_path[:1]) or 1
        dotted = ""
        for part in field_path:
            dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else part)
        self.items.append(f"{self.path}:{line}: {dotted or '(file)'}: found {found!r}; "
                          f"allowed {allowed}")


def variant_flag_map(args: list[str] | tuple[str, ...]) -> dict[str, str | bool]:
    """``['--quantization', 'fp8', '--enforce-eager', '-tp=2']`` -> {flag: value or True}.

    A lenient look-up table for checking a variant file and answering ``Variant.arg``: it keeps
    every flag, including those real vLLM takes but the simulator does not model. What a flag
    *means* for the engine is ``specs.serve_args.parse_serve_args``'s job (strict, -> ServeArgs),
    which the simulator and predict apply to the same serve_args."""
    parsed: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        token = args[i]
        flag, eq, value = token.partition("=")
        flag = FLAG_ALIASES.get(flag, flag).replace("_", "-") if flag.startswith("-") else flag
        if eq:
            parsed[flag] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            parsed[flag] = args[i + 1]
            i += 1
        else:
            parsed[flag] = True
        i += 1
    return parsed


def _build(path: Path, doc: yamlsource.YamlDoc, environ) -> Variant:
    data = doc.data
    p = _Problems(path, doc.lines)
    for dup_path, line, first in doc.duplicates:
        p.items.append(f"{path}:{line}: {'.'.join(map(str, dup_path))}: found a second "
                       f"{dup_path[-1]!r} key (first on line {first}); allowed once, remove one")
    if not isinstance(data, dict):
        p.add((), type(data).__name__, "a mapping with keys " + ", ".join(TOP_KEYS))
        raise VariantError("\n".join(p.items))
    for key in data:
        if key not in TOP_KEYS:
            p.add((key,), key, "one of " + ", ".join(TOP_KEYS) + " (remove or rename it)")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        p.add(("name",), name, "lower-case letters, digits and _ (it is also the compose profile)")
    elif name != path.stem:
        p.add(("name",), name, f"{path.stem!r}, the file's name without .yaml")
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        p.add(("description",), description, "a sentence saying what this variant tests")
    model = data.get("model")
    if not isinstance(model, str) or not HF_ID_RE.match(model):
        p.add(("model",), model, "a Hugging Face id such as Qwen/Qwen2.5-7B-Instruct")
    model_env = data.get("model_env")
    if model_env is not None and (not isinstance(model_env, str) or not ENV_RE.match(model_env)):
        p.add(("model_env",), model_env, "an environment variable name such as SERVELAB_MODEL")
    notes = data.get("notes", "")
    if not isinstance(notes, str):
        p.add(("notes",), notes, "text")

    serve_args = data.get("serve_args", [])
    args: dict[str, str | bool] = {}
    if not isinstance(serve_args, list) or not all(isinstance(a, str) for a in serve_args):
        p.add(("serve_args",), serve_args, "a list of strings, e.g. ['--quantization', 'fp8']")
        serve_args = []
    else:
        if serve_args and not serve_args[0].startswith("-"):
            p.add(("serve_args", 0), serve_args[0], "a flag starting with -- (the model goes in "
                  "`model`, not in serve_args)")
        args = variant_flag_map(serve_args)
        _check_args(p, serve_args, args)

    gpus, instances = data.get("gpus", 1), data.get("instances", 1)
    for key, value in (("gpus", gpus), ("instances", instances)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            p.add((key,), value, "a whole number >= 1")
    claims = _check_claims(p, data.get("claims"), args)

    if not p.items:
        per_instance = 1
        for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size"):
            value = args.get(flag)
            per_instance *= int(value) if isinstance(value, str) else 1
        if gpus != per_instance * instances:
            p.add(("gpus",), gpus, f"{per_instance * instances} = tensor x pipeline x data "
                  f"parallel size ({per_instance}) x instances ({instances})")
    if p.items:
        raise VariantError("\n".join(p.items))
    served = environ.get(model_env) if model_env else None
    return Variant(name=name, description=description.strip(), model=served or model,
                   default_model=model, model_env=model_env, serve_args=tuple(serve_args),
                   gpus=gpus, instances=instances, claims=claims, path=path,
                   notes=notes.strip(), _args=args)


def _check_args(p: _Problems, serve_args: list[str], args: dict) -> None:
    def where(flag: str) -> tuple:
        for i, token in enumerate(serve_args):
            if token.split("=", 1)[0].replace("_", "-") == flag or FLAG_ALIASES.get(
                    token.split("=", 1)[0]) == flag:
                return ("serve_args", i)
        return ("serve_args",)

    for flag in RESERVED_FLAGS:
        if flag in args:
            p.add(where(flag), flag, "no --host/--port/--model: servelab sets where the server "
                  "listens, and the model comes from `model`")
    for flag in INT_FLAGS:
        value = args.get(flag)
        if value is not None and (not isinstance(value, str) or not value.isdigit()
                                  or int(value) < 1):
            p.add(where(flag), f"{flag} {value}", f"{flag} followed by a whole number >= 1")
    util = args.get("--gpu-memory-utilization")
    if util is not None:
        try:
            ok = 0 < float(util) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            p.add(where("--gpu-memory-utilization"), util, "a fraction in (0, 1], e.g. 0.9")
    quant = args.get("--quantization")
    if quant is not None and quant not in QUANTIZATION_METHODS:
        p.add(where("--quantization"), quant, "one of " + ", ".join(QUANTIZATION_METHODS))
    spec = args.get("--speculative-config")
    if spec is not None:
        try:
            config = json.loads(spec) if isinstance(spec, str) else None
        except json.JSONDecodeError as exc:
            config, reason = None, str(exc)
        else:
            reason = "a JSON object"
        if not isinstance(config, dict):
            p.add(where("--speculative-config"), spec, f"JSON ({reason}), e.g. "
                  '\'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}\'')
        else:
            if config.get("method") not in SPECULATIVE_METHODS:
                p.add(where("--speculative-config"), config.get("method"),
                      "method one of " + ", ".join(SPECULATIVE_METHODS))
            k = config.get("num_speculative_tokens")
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                p.add(where("--speculative-config"), k, "num_speculative_tokens >= 1")
            if config.get("method") == "draft_model" and not (
                    isinstance(config.get("model"), str) and HF_ID_RE.match(config["model"])):
                p.add(where("--speculative-config"), config.get("model"),
                      "a draft model's Hugging Face id under \"model\"")
    for flag in ("--speculative-model", "--num-speculative-tokens"):
        if flag in args:
            p.add(where(flag), flag, "--speculative-config JSON (vLLM removed the separate flags)")


def _check_claims(p: _Problems, claims: Any, args: dict) -> Claims | None:
    if not isinstance(claims, dict):
        p.add(("claims",), claims, "a mapping with " + ", ".join(CLAIM_KEYS))
        return None
    for key in claims:
        if key not in CLAIM_KEYS:
            p.add(("claims", key), key, "one of " + ", ".join(CLAIM_KEYS))
    weights, acts = claims.get("weights"), claims.get("activations")
    if weights not in WEIGHT_PRECISIONS:
        p.add(("claims", "weights"), weights, "one of " + ", ".join(WEIGHT_PRECISIONS))
    if acts not in ACTIVATION_PRECISIONS:
        p.add(("claims", "activations"), acts, "one of " + ", ".join(ACTIVATION_PRECISIONS))
    cc = claims.get("min_compute_capability")
    if cc is not None and (isinstance(cc, bool) or not isinstance(cc, (int, float))
                           or not 3.0 <= cc <= 20.0):
        p.add(("claims", "min_compute_capability"), cc, "null or a number such as 8.9")
    spec = claims.get("speculative")
    if spec is not None and spec not in SPECULATIVE_METHODS:
        p.add(("claims", "speculative"), spec, "null or one of " + ", ".join(SPECULATIVE_METHODS))
    # The claims must describe the arguments, or preflight and verify would check the wrong thing.
    spec_json = args.get("--speculative-config")
    try:
        method = json.loads(spec_json).get("method") if isinstance(spec_json, str) else None
    except (json.JSONDecodeError, AttributeError):
        method = spec
    if method != spec:
        p.add(("claims", "speculative"), spec, f"{method!r}, the method in --speculative-config")
    if args.get("--quantization") == "fp8" and (weights != "fp8"):
        p.add(("claims", "weights"), weights, "'fp8' (serve_args ask for --quantization fp8)")
    if acts == "fp8" and (cc is None or cc < 8.9):
        p.add(("claims", "min_compute_capability"), cc,
              ">= 8.9: FP8 activations (W8A8) need Ada or Hopper; below that vLLM runs W8A16")
    return Claims(weights=weights, activations=acts,
                  min_compute_capability=float(cc) if cc is not None else None, speculative=spec)
