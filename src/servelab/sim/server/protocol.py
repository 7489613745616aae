"""vLLM's OpenAI-compatible request fields, error envelope and response shapes.

Requests are validated the way vLLM's serving layer does and rejected with its messages (see
``../shared/reference/vllm_behaviour.md`` section 2). Streamed chunks are assembled from byte
templates fixed per request: the hot path only splices in the JSON-escaped text and counters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from servelab.core.chatml import ChatTemplateError, render_chat

DONE_FRAME = b"data: [DONE]\n\n"


class ApiError(Exception):
    """An error answered with vLLM's envelope ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(status: int, message: str, err_type: str = "BadRequestError",
               param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}})


def not_found_model(name) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")


@dataclass
class SimRequest:
    kind: str  # "completion" or "chat"
    model: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    extra: dict = field(default_factory=dict)


@dataclass
class ServedModel:
    """What validation needs to know about the served model."""

    names: list[str]
    max_model_len: int
    root: str

    @property
    def name(self) -> str:
        return self.names[0]


def _field_error(name: str, kind: str, msg: str, value) -> ApiError:
    # pydantic's wording, as vLLM passes validation errors through with status 400
    text = f"[{{'type': '{kind}', 'loc': ('body', '{name}'), 'msg': '{msg}', 'input': {value!r}}}]"
    return ApiError(400, text, "BadRequestError", name)


def _opt_int(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise _field_error(name, "int_type", "Input should be a valid integer", v)
    return v


def _opt_float(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _field_error(name, "float_type", "Input should be a valid number", v)
    return float(v)


def _opt_bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _field_error(name, "bool_type", "Input should be a valid boolean", v)
    return v


def parse_body(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object")
    return body


def resolve_model(body: dict, served: ServedModel) -> str:
    name = body.get("model")
    if name is None:
        return served.name
    if name not in served.names:
        raise not_found_model(name)
    return name


def prompt_input(kind: str, body: dict, vocab_size: int) -> str | list[int]:
    """The prompt as text to tokenize (a chat rendered with its template) or as token ids."""
    if kind == "chat":
        if "messages" not in body:
            raise _field_error("messages", "missing", "Field required", None)
        try:
            return render_chat(body["messages"], _opt_bool(body, "add_generation_prompt", True))
        except ChatTemplateError as exc:
            raise ApiError(400, str(exc), param="messages") from None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(400, f"Token id {bad[0]} is out of vocabulary", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "The simulator serves one prompt per request; send the batch's "
                       "prompts as separate requests", param="prompt")
    if prompt is None:
        raise _field_error("prompt", "missing", "Field required", None)
    raise ApiError(400, "'prompt' must be a string, a list of token ids or a list with one "
                   "of those", param="prompt")


def parse_generate(kind: str, body: dict, prompt_ids: list[int], served: ServedModel,
                   ) -> SimRequest:
    """Validate a completions or chat request whose prompt is tokenized (``prompt_input``);
    raises ApiError with vLLM's status and message, the first vLLM would find."""
    model = resolve_model(body, served)
    n = _opt_int(body, "n")
    if n is not None and n != 1:
        raise ApiError(400, "The simulator serves n=1 only", param="n")
    max_tokens = None
    if kind == "chat":
        max_tokens = _opt_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens")
    stream = _opt_bool(body, "stream")
    opts = _stream_options(body, stream)
    temperature, min_tokens, seed, ignore_eos = _sampling(body)
    max_tokens = _fit_context(kind, len(prompt_ids), max_tokens, served.max_model_len)
    if min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                       f"got {min_tokens}.", param="min_tokens")
    return SimRequest(
        kind=kind, model=model, prompt_ids=prompt_ids, max_tokens=max_tokens,
        min_tokens=min_tokens, ignore_eos=ignore_eos,
        temperature=1.0 if temperature is None else temperature, seed=seed, stream=stream,
        include_usage=_opt_bool(opts, "include_usage"),
        # as vLLM: per-chunk usage only together with include_usage
        continuous_usage=_opt_bool(opts, "include_usage") and _opt_bool(
            opts, "continuous_usage_stats"),
    )


def _stream_options(body: dict, stream: bool) -> dict:
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _field_error("stream_options", "model_type", "Input should be an object", opts)
    opts = opts or {}
    if opts and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.",
                       param="stream_options")
    return opts


def _sampling(body: dict) -> tuple[float | None, int, int | None, bool]:
    """temperature, min_tokens, seed and ignore_eos, checked as vLLM's SamplingParams does."""
    temperature = _opt_float(body, "temperature")
    top_p = _opt_float(body, "top_p")
    min_tokens = _opt_int(body, "min_tokens") or 0
    seed = _opt_int(body, "seed")
    ignore_eos = _opt_bool(body, "ignore_eos")
    if temperature is not None and temperature < 0:
        raise ApiError(400, f"temperature must be non-negative, got {temperature}.",
                       param="temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    if min_tokens < 0:
        raise ApiError(400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
                       param="min_tokens")
    return temperature, min_tokens, seed, ignore_eos


def _fit_context(kind: str, n_prompt: int, max_tokens: int | None, limit: int) -> int:
    """max_tokens as asked, or what the context leaves after the prompt when not asked."""
    if n_prompt == 0:
        raise ApiError(400, "The prompt cannot be empty.", param="prompt")
    if n_prompt >= limit:
        raise ApiError(
            400, f"This model's maximum context length is {limit} tokens. However, your request "
            f"has {n_prompt} input tokens. Please reduce the length of the input messages.",
            param="messages" if kind == "chat" else "prompt")
    if max_tokens is None:
        return limit - n_prompt
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.",
                       param="max_tokens")
    if n_prompt + max_tokens > limit:
        raise ApiError(
            400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
            f"model's maximum context length is {limit} tokens and your request has {n_prompt} "
            f"input tokens ({max_tokens} > {limit} - {n_prompt}).", param="max_tokens")
    return max_tokens


def usage_json(prompt: int, completion: int, cached: int | None = None,
               null_details: bool = True) -> bytes:
    """vLLM's UsageInfo; ``cached_tokens`` only with ``--enable-prompt-tokens-details``."""
    if cached is not None:
        details = b',"prompt_tokens_details":{"cached_tokens":%d}' % cached
    else:
        details = b',"prompt_tokens_details":null' if null_details else b""
    return b'{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}' % (
        prompt, prompt + completion, completion, details)


class ChunkFormat:
    """Byte templates for one streamed request's SSE frames (vLLM's field order)."""

    __slots__ = ("kind", "head", "n_prompt", "continuous", "_header")

    def __init__(self, kind: str, request_id: str, model: str, created: int, n_prompt: int,
                 continuous: bool):
        self.kind = kind
        self.n_prompt = n_prompt
        self.continuous = continuous
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        # ids are JSON-encoded: an X-Request-Id may hold any characters
        self._header = b'data: {"id":%s,"object":"%s","created":%d,"model":%s,"choices":' % (
            orjson.dumps(request_id), obj.encode(), created, orjson.dumps(model))
        if kind == "chat":
            self.head = self._header + b'[{"index":0,"delta":{"content":"'
        else:
            self.head = self._header + b'[{"index":0,"text":"'

    def _usage_tail(self, completion: int) -> bytes:
        if self.continuous:
            p = self.n_prompt
            return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}' \
                   b'\n\n' % (p, p + completion, completion)
        return b',"usage":null}\n\n' if self.kind != "chat" else b"}\n\n"

    def role(self) -> bytes:
        """vLLM's first chat chunk: the role with empty content."""
        return (self._header + b'[{"index":0,"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]' + self._usage_tail(0))

    def content(self, text_json: bytes, completion_tokens: int,
                finish_reason: str | None = None) -> bytes:
        if finish_reason is None:
            mid = b'"},"logprobs":null,"finish_reason":null}]' if self.kind == "chat" else \
                b'","logprobs":null,"finish_reason":null,"stop_reason":null}]'
        else:
            mid = (b'"},"logprobs":null,"finish_reason":"%s","stop_reason":null}]'
                   if self.kind == "chat" else
                   b'","logprobs":null,"finish_reason":"%s","stop_reason":null}]'
                   ) % finish_reason.encode()
        return self.head + text_json + mid + self._usage_tail(completion_tokens)

    def final_usage(self, completion: int, cached: int | None = None) -> bytes:
        usage = usage_json(self.n_prompt, completion, cached, null_details=False)
        return self._header + b'[],"usage":' + usage + b"}\n\n"

    def malformed(self) -> bytes:
        """A data frame whose JSON is cut short (fault injection)."""
        return self.head[: len(self.head) - 7] + b"\n\n"


def error_frame(message: str, err_type: str = "InternalServerError", status: int = 500) -> bytes:
    """vLLM's mid-stream error: an envelope in a data frame of a 200 stream."""
    return b"data: " + error_body(status, message, err_type) + b"\n\n"


def completion_response(request_id: str, model: str, created: int, text: str,
                        finish_reason: str, n_prompt: int, n_out: int,
                        cached: int | None = None) -> bytes:
    return (b'{"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":'
            b'[{"index":0,"text":%s,"logprobs":null,"finish_reason":"%s","stop_reason":null,'
            b'"prompt_logprobs":null}],"usage":%s}' % (
                orjson.dumps(request_id), created, orjson.dumps(model), orjson.dumps(text),
                finish_reason.encode(), usage_json(n_prompt, n_out, cached)))


def chat_response(request_id: str, model: str, created: int, text: str, finish_reason: str,
                  n_prompt: int, n_out: int, cached: int | None = None) -> bytes:
    return (b'{"id":%s,"object":"chat.completion","created":%d,"model":%s,"choices":'
            b'[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":%s,'
            b'"tool_calls":[]},"logprobs":null,"finish_reason":"%s","stop_reason":null}],'
            b'"usage":%s,"prompt_logprobs":null}' % (
                orjson.dumps(request_id), created, orjson.dumps(model), orjson.dumps(text),
                finish_reason.encode(), usage_json(n_prompt, n_out, cached)))


def models_response(served: ServedModel, created: int | None = None) -> bytes:
    created = int(time.time()) if created is None else created
    data = [{
        "id": name, "object": "model", "created": created, "owned_by": "vllm",
        "root": served.root, "parent": None, "max_model_len": served.max_model_len,
        "permission": [{
            "id": f"modelperm-{i:032x}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False}],
    } for i, name in enumerate(served.names)]
    return orjson.dumps({"object": "list", "data": data})
