"""Speculative decoding: who gets draft tokens, how many are accepted, what drafting costs.

Acceptance is a chain of Bernoulli trials with per-position conditional probabilities, stopping at
the first rejection (Leviathan et al.): a step that verifies k drafts emits a accepted + 1 bonus
token, all in one chunk. The mean tokens per step is (1 - a^(k+1)) / (1 - a) for a constant a.
"""
from __future__ import annotations

import random

from servelab.sim.engine.cost_model import BatchShape, CostModel
from servelab.sim.engine.costs import default_acceptance, match_probability
from servelab.specs.cost_calibration import CostParams
from servelab.specs.engine_config import SpecDecodeConfig


class SpecDecoder:
    def __init__(self, spec: SpecDecodeConfig, draft_cost: CostModel | None, params: CostParams,
                 rng: random.Random, acceptance: tuple[float, ...] | None = None):
        """``acceptance``: per draft position, as a calibration measured it on a real server
        (``costs.calibrated_acceptance``); else the method's default."""
        self.spec = spec
        self.k = spec.num_speculative_tokens
        self.draft_cost = draft_cost
        self.params = params
        self.rng = rng
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        self.acceptance = (list(acceptance) if acceptance is not None
                           else default_acceptance(spec.method, self.k))
        self.match_prob = match_probability(spec.method)

    def propose(self) -> int:
        """Draft tokens for one request's next step (n-gram lookups sometimes find nothing)."""
        if self.spec.method == "ngram" and self.rng.random() >= self.match_prob:
            return 0
        return self.k

    def accept(self, num_drafted: int, override: float | None) -> int:
        """How many of ``num_drafted`` tokens the target accepts; updates vLLM's counters."""
        rates = self.acceptance
        rnd = self.rng.random
        accepted = 0
        for i in range(num_drafted):
            p = override if override is not None else rates[i]
            if rnd() >= p:
                break
            accepted += 1
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += accepted
        per_pos = self.accepted_per_pos
        for i in range(accepted):
            per_pos[i] += 1
        return accepted

    def draft_time(self, batch: BatchShape, num_drafting: int, draft_context: int) -> float:
        """Cost of proposing drafts after this step for ``num_drafting`` requests.

        A draft model runs k sequential passes: the first over everything the target just
        processed (it keeps its own KV cache), then k-1 one-token passes over the drafting set.
        n-gram matching is a CPU lookup."""
        if num_drafting == 0:
            return 0.0
        if self.draft_cost is None:
            return num_drafting * self.params.t_ngram_seq_s
        dc = self.draft_cost
        t = dc.step_time(batch) + self.params.t_draft_pass_s
        single = BatchShape()
        single.num_decode = num_drafting
        single.decode_tokens = num_drafting
        single.decode_context = draft_context
        single.decode_context_x = draft_context
        t += (self.k - 1) * (dc.step_time(single) + self.params.t_draft_pass_s)
        return t
