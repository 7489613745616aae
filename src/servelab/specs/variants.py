"""Server variants: one YAML file per way of serving a model (``servers/variants/*.yaml``).

A variant is the single definition that Docker Compose, the server on a GPU host and the simulator
all start from: which server it is (``server: vllm``, the default; ``specs.server_kinds``), the
model, the server's exact arguments, the GPUs it takes and what it claims to run (precision,
minimum compute capability, speculative method). Preflight checks the claims against the
hardware before a run; verify checks them against the server's log afterwards.
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
from servelab.specs.pd import PDSpec, check_pd
from servelab.specs.serve_args import FLAG_ALIASES
from servelab.specs.server_kinds import DEFAULT_KIND, KINDS, SPECULATIVE_METHODS, ServerKind
from servelab.specs.server_kinds.kind import is_model_ref, parse_flags

WEIGHT_PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")
ACTIVATION_PRECISIONS = ("bf16", "fp16", "fp8", "int8")
TOP_KEYS = ("name", "description", "server", "model", "model_env", "serve_args", "gpus",
            "instances", "claims", "notes", "pd")
CLAIM_KEYS = ("weights", "activations", "min_compute_capability", "speculative")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


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
    server: str = DEFAULT_KIND
    pd: PDSpec | None = None        # prefill/decode disaggregation (specs.pd); None: colocated
    _args: dict[str, str | bool] = field(default_factory=dict, repr=False, compare=False)

    @property
    def kind(self) -> ServerKind:
        return KINDS[self.server]

    def _concept(self, concept: str) -> str | bool | None:
        return self._args.get(self.kind.flags[concept])

    def arg(self, flag: str, default: Any = None) -> Any:
        """The value of ``--flag`` in serve_args (``True`` for a bare switch), else ``default``."""
        return self._args.get(flag, default)

    def int_arg(self, flag: str, default: int) -> int:
        value = self._args.get(flag)
        return int(value) if isinstance(value, str) else default

    @property
    def tensor_parallel_size(self) -> int:
        return self.int_arg(self.kind.flags["tensor_parallel_size"], 1)

    @property
    def pipeline_parallel_size(self) -> int:
        return self.int_arg(self.kind.flags["pipeline_parallel_size"], 1)

    @property
    def data_parallel_size(self) -> int:
        return self.int_arg(self.kind.flags["data_parallel_size"], 1)

    @property
    def gpus_per_instance(self) -> int:
        return self.gpus // self.instances

    @property
    def quantization(self) -> str | None:
        value = self._concept("quantization")
        return value if isinstance(value, str) else None

    @property
    def max_model_len(self) -> int | None:
        value = self._concept("max_model_len")
        return int(value) if isinstance(value, str) else None

    @property
    def memory_utilization(self) -> float:
        """The fraction of GPU memory the server takes (vLLM: --gpu-memory-utilization)."""
        value = self._concept("memory_utilization")
        return float(value) if isinstance(value, str) else self.kind.memory_utilization_default

    @property
    def speculative_config(self) -> dict | None:
        return self.kind.speculative(self._args)

    @property
    def draft_model(self) -> str | None:
        spec = self.speculative_config or {}
        return spec.get("model") if spec.get("method") == "draft_model" else None

    def server_args(self, port: int | None = None, host: str | None = None) -> list[str]:
        """Arguments after the kind's command (``vllm serve``) for one instance."""
        return self.kind.server_args(self.model, self.serve_args, host, port)

    def vllm_serve_args(self, port: int | None = None, host: str | None = None) -> list[str]:
        """The old name of ``server_args`` (``servelab variants`` prints it)."""
        return self.server_args(port, host)

    def to_record(self) -> dict:
        """What a run stores about the variant it measured (runs.settings)."""
        return {"name": self.name, "path": str(self.path), "model": self.model,
                "serve_args": list(self.serve_args), "gpus": self.gpus,
                "instances": self.instances,
                **({"pd": self.pd.to_record()} if self.pd else {}),
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


def variant_flag_map(args: list[str] | tuple[str, ...],
                     aliases: dict[str, str] = FLAG_ALIASES) -> dict[str, str | bool]:
    """``['--quantization', 'fp8', '--enforce-eager', '-tp=2']`` -> {flag: value or True}.

    A lenient look-up table for checking a variant file and answering ``Variant.arg``: it keeps
    every flag, including those real vLLM takes but the simulator does not model. What a flag
    *means* for the engine is ``specs.serve_args.parse_serve_args``'s job (strict, -> ServeArgs),
    which the simulator and predict apply to the same serve_args."""
    return parse_flags(args, aliases)


def _build(path: Path, doc: yamlsource.YamlDoc, environ) -> Variant:
    data = doc.data
    p = _Problems(path, doc.lines)
    _check_keys(p, path, doc)
    name, description, model, model_env, notes = _check_texts(p, path, data)
    server = data.get("server", DEFAULT_KIND)
    if server not in KINDS:
        p.add(("server",), server, "one of " + ", ".join(KINDS) + " (the server this variant "
              "runs; default " + DEFAULT_KIND + ")")
        server = DEFAULT_KIND  # check the rest as the default kind, to list every problem at once
    kind = KINDS[server]
    serve_args, args = _check_serve_args(p, data.get("serve_args", []), kind)
    gpus, instances = data.get("gpus", 1), data.get("instances", 1)
    for key, value in (("gpus", gpus), ("instances", instances)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            p.add((key,), value, "a whole number >= 1")
    claims = _check_claims(p, data.get("claims"), args, kind)
    pd = check_pd(data.get("pd"), args, instances, server, p.add)
    if not p.items:
        _check_gpu_count(p, gpus, instances, args, kind)
    if p.items:
        raise VariantError("\n".join(p.items))
    served = environ.get(model_env) if model_env else None
    return Variant(name=name, description=description.strip(), model=served or model,
                   default_model=model, model_env=model_env, serve_args=tuple(serve_args),
                   gpus=gpus, instances=instances, claims=claims, path=path,
                   notes=notes.strip(), server=server, pd=pd, _args=args)


def _check_keys(p: _Problems, path: Path, doc: yamlsource.YamlDoc) -> None:
    """Each key once, and only the keys a variant has; not a mapping ends the reading."""
    for dup_path, line, first in doc.duplicates:
        p.items.append(f"{path}:{line}: {'.'.join(map(str, dup_path))}: found a second "
                       f"{dup_path[-1]!r} key (first on line {first}); allowed once, remove one")
    if not isinstance(doc.data, dict):
        p.add((), type(doc.data).__name__, "a mapping with keys " + ", ".join(TOP_KEYS))
        raise VariantError("\n".join(p.items))
    for key in doc.data:
        if key not in TOP_KEYS:
            p.add((key,), key, "one of " + ", ".join(TOP_KEYS) + " (remove or rename it)")


def _check_texts(p: _Problems, path: Path, data: dict) -> tuple:
    """name, description, model, model_env and notes, as found (each problem added)."""
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        p.add(("name",), name, "lower-case letters, digits and _ (it is also the compose profile)")
    elif name != path.stem:
        p.add(("name",), name, f"{path.stem!r}, the file's name without .yaml")
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        p.add(("description",), description, "a sentence saying what this variant tests")
    model = data.get("model")
    if not is_model_ref(model):
        p.add(("model",), model, "a Hugging Face id such as Qwen/Qwen2.5-7B-Instruct or a local "
              "model folder such as /models/qwen2_5_7b (absolute, or ./ relative)")
    model_env = data.get("model_env")
    if model_env is not None and (not isinstance(model_env, str) or not ENV_RE.match(model_env)):
        p.add(("model_env",), model_env, "an environment variable name such as SERVELAB_MODEL")
    notes = data.get("notes", "")
    if not isinstance(notes, str):
        p.add(("notes",), notes, "text")
    return name, description, model, model_env, notes


def _check_serve_args(p: _Problems, serve_args: Any, kind: ServerKind) -> tuple[list, dict]:
    """The serve args (``[]`` when they are not a list of strings) and their flag map."""
    if not isinstance(serve_args, list) or not all(isinstance(a, str) for a in serve_args):
        p.add(("serve_args",), serve_args, "a list of strings, e.g. ['--quantization', 'fp8']")
        return [], {}
    if serve_args and not serve_args[0].startswith("-"):
        p.add(("serve_args", 0), serve_args[0], "a flag starting with -- (the model goes in "
              "`model`, not in serve_args)")
    args = variant_flag_map(serve_args, kind.flag_aliases)
    kind.check_args(serve_args, args, p.add)
    return serve_args, args


def _check_gpu_count(p: _Problems, gpus: int, instances: int, args: dict,
                     kind: ServerKind) -> None:
    """gpus = the GPUs one instance's parallelism takes, times the instances."""
    per_instance = 1
    for concept in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = args.get(kind.flags[concept])
        per_instance *= int(value) if isinstance(value, str) else 1
    if gpus != per_instance * instances:
        p.add(("gpus",), gpus, f"{per_instance * instances} = tensor x pipeline x data "
              f"parallel size ({per_instance}) x instances ({instances})")


def _check_claims(p: _Problems, claims: Any, args: dict, kind: ServerKind) -> Claims | None:
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
    spec_flag, quant_flag = kind.flags["speculative_config"], kind.flags["quantization"]
    try:
        config = kind.speculative(args)
        method = config.get("method") if config is not None else None
    except (json.JSONDecodeError, AttributeError):
        method = spec
    if method != spec:
        p.add(("claims", "speculative"), spec, f"{method!r}, the method in {spec_flag}")
    if args.get(quant_flag) == "fp8" and (weights != "fp8"):
        p.add(("claims", "weights"), weights, f"'fp8' (serve_args ask for {quant_flag} fp8)")
    if acts == "fp8" and (cc is None or cc < 8.9):
        p.add(("claims", "min_compute_capability"), cc,
              ">= 8.9: FP8 activations (W8A8) need Ada or Hopper; below that vLLM runs W8A16")
    return Claims(weights=weights, activations=acts,
                  min_compute_capability=float(cc) if cc is not None else None, speculative=spec)
