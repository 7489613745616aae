"""One request's state inside the engine (vLLM's Request, nano-vllm's Sequence)."""
from __future__ import annotations

from enum import Enum


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Token counts only: the engine never needs output token ids, only how many there are.

    ``eos_after`` is where the "model" would emit EOS (the caller decides it, e.g. from a target
    output length); ``ignore_eos`` and ``min_tokens`` override it as vLLM's sampling params do.
    """

    __slots__ = (
        "request_id", "prompt_token_ids", "num_prompt_tokens", "max_tokens", "min_tokens",
        "ignore_eos", "eos_after", "spec_acceptance", "stop_len", "stop_reason",
        "num_output_tokens", "num_computed_tokens", "num_cached_tokens", "num_spec_tokens",
        "block_table", "block_hashes", "num_committed_blocks", "status", "finish_reason", "num_preemptions",
        "arrival_time", "first_scheduled_time", "first_token_time", "last_token_time",
        "finish_time", "prefill_done_time", "engine_index",
    )

    def __init__(self, request_id: str, prompt_token_ids, max_tokens: int, min_tokens: int = 0,
                 ignore_eos: bool = False, eos_after: int | None = None, arrival_time: float = 0.0,
                 spec_acceptance: float | None = None, max_model_len: int | None = None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.eos_after = eos_after
        self.spec_acceptance = spec_acceptance
        # vLLM's check_stop tests the length cap before EOS, so an EOS landing exactly on
        # max_tokens reports "length".
        stop_len, reason = max_tokens, "length"
        if eos_after is not None and not ignore_eos:
            natural = max(eos_after, min_tokens, 1)
            if natural < max_tokens:
                stop_len, reason = natural, "stop"
        if max_model_len is not None and self.num_prompt_tokens + stop_len > max_model_len:
            stop_len, reason = max(1, max_model_len - self.num_prompt_tokens), "length"
        self.stop_len = stop_len
        self.stop_reason = reason
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1        # prefix-cache hit at first scheduling; -1 = not yet
        self.num_spec_tokens = 0           # draft tokens proposed for the next step
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of this sequence's full blocks
        self.num_committed_blocks = 0      # leading blocks registered in the prefix cache
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.prefill_done_time: float | None = None
        self.finish_time: float | None = None
        self.engine_index = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens + self.num_spec_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def remaining_output(self) -> int:
        return self.stop_len - self.num_output_tokens

    def block_key(self, index: int, block_size: int):
        """What block ``index`` holds, for hashing. Output tokens are unique to this request, so
        blocks that reach into the output are keyed by the request id (they still hit when a
        preempted request recomputes)."""
        start = index * block_size
        end = start + block_size
        if end <= self.num_prompt_tokens:
            return tuple(self.prompt_token_ids[start:end])
        return (tuple(self.prompt_token_ids[start:min(end, self.num_prompt_tokens)]), self.request_id, index)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, prompt={self.num_prompt_tokens}, out={self.num_output_tokens}/"
                f"{self.stop_len}, computed={self.num_computed_tokens}, {self.status.value})")
