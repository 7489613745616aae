"""The probe traffic of ``servelab calibrate``: which requests isolate which cost, how they are
sent so the server schedules them the way the fit assumes, and what the server's own
``/metrics`` say they cost.

Every probe prompt is a list of random token ids (exact lengths without the server's tokenizer,
and no two prompts share a prefix-cache block). A probe of more than one request is sent behind
a *blocker*: one request whose prompt fills a whole step's token budget. Every request is written
but for the last byte of its body before the blocker is sent; a quarter of the blocker's prefill
later, one byte per request completes the others, so the scheduler finds them all waiting at
once behind it, which is what the replay in
``orchestration.calibrate`` reproduces. Whether the server really scheduled them so is checked
there, from each request's first chunk (``first_chunk``), against the replay's steps.
"""
from __future__ import annotations

import http.client
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from servelab.core import credentials
from servelab.core.errors import ServelabError
from servelab.core.timeouts import HTTP_PROBE_S

# Token ids every served vocabulary holds (the simulator's BPE has 16,384; Qwen and Llama far more).
TOKEN_RANGE = (100, 16000)
SUMS = {"prefill_s": "vllm:request_prefill_time_seconds_sum",
        "decode_s": "vllm:request_decode_time_seconds_sum",
        "requests": "vllm:request_prefill_time_seconds_count",
        "generation_tokens": "vllm:generation_tokens_total",
        "spec_drafts": "vllm:spec_decode_num_drafts_total",
        "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "spec_accepted": "vllm:spec_decode_num_accepted_tokens_total"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class Probe:
    name: str
    isolates: str
    batch: int          # requests sent together
    prompt: int         # prompt tokens of each
    output: int         # output tokens of each (ignore_eos)


@dataclass
class Measured:
    """One probe's run: the /metrics deltas and the client's own view."""
    probe: Probe
    blocker: int                                   # blocker prompt tokens (0: none)
    prompts: list[list[int]]                       # blocker first when there is one
    deltas: dict[str, float] = field(default_factory=dict)
    per_pos: list[float] = field(default_factory=list)
    client_itl_ms: float | None = None             # median gap between content chunks
    client_ttft_ms: float | None = None            # median over the probe's requests
    first_chunk: list[float | None] = field(default_factory=list)  # per prompt: first data line
    late: bool = False                             # not scheduled as the replay assumes


def probe_set(budget: int, max_model_len: int, max_num_seqs: int, output: int = 32) -> list[Probe]:
    """Probes sized to the server's token budget and context limit: each one moves one term of
    the cost model (docs/simulator.md, "Calibrating against a real server", lists them)."""
    longest = min(budget, max_model_len - 1)
    ctx = min(2048, max_model_len - output - 1)
    wide = min(64, max_num_seqs)
    return [
        Probe("prefill_512", "fixed cost and per-token GEMMs at a short prompt", 1, 512, 1),
        Probe("prefill_2k", "per-token GEMM cost (compute-bound prefill)", 1, 2048, 1),
        Probe(f"prefill_{longest}", "attention's quadratic term at the longest one-step prompt",
              1, longest, 1),
        Probe("decode_b1", "weight streaming plus the fixed per-step cost", 1, 128, output),
        Probe("prefill_batch_16x256", "one step of 16 prefill chunks (per-chunk, per-request costs)",
              16, 256, 1),
        Probe("decode_b16", "per-request step cost at a small context", 16, 128, output),
        Probe(f"decode_b16_ctx{ctx}", "KV-cache reads against context length", 16, ctx, output),
        Probe(f"decode_b{wide}", "per-request step cost at a wide batch", wide, 128, output),
        Probe("mixed_3x6k", "chunked prefill sharing steps with decodes", 3,
              min(6000, max_model_len - 17), 16),
    ]


class ProbeClient:
    """Streams completions at ``url`` and reads its /metrics (plain HTTP: a local tunnel or a
    server on the same network, as vLLM serves)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 120.0):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ServelabError(f"--target: found {url!r}; allowed an http://HOST:PORT URL of "
                                "a running OpenAI-compatible server")
        self.url = url.rstrip("/")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        self.probe_s = min(timeout_s, HTTP_PROBE_S)   # /v1/models, /version, /metrics
        self.headers = {"Content-Type": "application/json", **credentials.headers()}
        self.version_note: str | None = None   # why version() found none
        self.version_outcome: str | None = None
        self.model = model or self._first_model()
        self.rng = random.Random(20261201)

    # -- plain requests ---------------------------------------------------------------------
    # Bounded in time and size (core.bounded_http), each answer named when it is not usable.
    def _json(self, path: str):
        from servelab.profiles.tokens import TokenCountError, read_json

        try:
            return read_json(self.url, path, None, credentials.headers(), self.probe_s)
        except TokenCountError as exc:
            err = ServelabError(f"--target {exc}; is this a vLLM server (or servelab sim)?")
            err.outcome = exc.outcome
            raise err from None

    def _first_model(self) -> str:
        from servelab.profiles.tokens import TokenCountError, resolve_model

        try:
            return resolve_model(self.url, self.probe_s)
        except TokenCountError as exc:
            raise ServelabError(f"--target {exc}; give --model, or a server that lists "
                                "its model") from None

    def version(self) -> str | None:
        """The server's /version, or None, with ``version_note`` saying what came instead."""
        try:
            got = self._json("/version")
        except ServelabError as exc:
            self.version_outcome = exc.outcome
            self.version_note = f"{exc}: the calibration records no server version"
            return None
        version = got.get("version") if isinstance(got, dict) else None
        if not isinstance(version, str):
            self.version_outcome = "wrong_shape"
            self.version_note = (f"--target {self.url}/version answered JSON without a string "
                                 f"'version' (wrong_shape): the calibration records no server "
                                 f"version")
            return None
        return version

    def counters(self) -> tuple[dict[str, float], list[float]]:
        """The probe-relevant sums of one /metrics page, summed over engines."""
        from servelab.orchestration.serverlog import metrics_missing, read_metrics

        text, outcome, detail = read_metrics(self.url, self.probe_s)
        if text is None:
            raise ServelabError(f"--target {metrics_missing(self.url, outcome, detail)}; "
                                "calibrate reads vLLM's request timing histograms there")
        sums = dict.fromkeys(SUMS, 0.0)
        names = {v: k for k, v in SUMS.items()}
        per_pos: dict[int, float] = {}
        seen = set()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in names:
                    sums[names[s.name]] += s.value
                    seen.add(s.name)
                elif s.name == PER_POS:
                    pos = int(s.labels.get("position", 0))
                    per_pos[pos] = per_pos.get(pos, 0.0) + s.value
        missing = [n for n in (SUMS["prefill_s"], SUMS["decode_s"], SUMS["requests"]) if n not in seen]
        if missing:
            raise ServelabError(f"--target {self.url}/metrics: no {', '.join(missing)}; calibrate "
                                "needs vLLM's request timing histograms (vLLM V1, or servelab sim)")
        return sums, [per_pos[k] for k in sorted(per_pos)]

    # -- probes -----------------------------------------------------------------------------
    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(*TOKEN_RANGE) for _ in range(n)]

    def run(self, probe: Probe, blocker: int, lead_s: float = 0.005) -> Measured:
        """``lead_s``: how long the blocker runs alone before the others' last bytes go (a
        quarter of its own prefill, once calibrate has measured that)."""
        prompts = [self.prompt(probe.prompt) for _ in range(probe.batch)]
        use_blocker = blocker if probe.batch > 1 else 0
        m = Measured(probe, use_blocker, ([self.prompt(use_blocker)] if use_blocker else []) + prompts)
        before, pos0 = self.counters()
        outputs = [1] * bool(use_blocker) + [probe.output] * probe.batch
        # Every request but its body's last byte is on the wire before the blocker starts, so
        # what is left to send and parse inside the blocker's step is one byte per request.
        held = [self._prepare(p, n) for p, n in zip(m.prompts, outputs)]
        results: list[tuple | Exception | None] = [None] * len(held)
        threads = [threading.Thread(target=self._stream, args=(c, last, results, i))
                   for i, (c, last) in enumerate(held)]
        if use_blocker:
            threads[0].start()
            time.sleep(lead_s)
        for t in threads[bool(use_blocker):]:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, Exception):
                raise r
        m.first_chunk = [r[3] for r in results]
        if use_blocker:
            m.late = max(r[0] for r in results[1:]) > (m.first_chunk[0] or float("inf"))
        self._client_figures(m, results[bool(use_blocker):])
        want = before["requests"] + len(m.prompts)
        deadline = time.monotonic() + 10.0
        while True:  # the server records a request's histograms just after its last chunk
            after, pos1 = self.counters()
            if after["requests"] >= want or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        m.deltas = {k: after[k] - before[k] for k in SUMS}
        m.per_pos = [b - a for a, b in zip(pos0 + [0.0] * len(pos1), pos1)]
        return m

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.connect()
        except OSError as exc:
            raise ServelabError(f"--target {self.url}: cannot connect ({exc})") from None
        return conn

    def _body(self, prompt: list[int], max_tokens: int) -> bytes:
        import json

        return json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                           "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
                           "stream": True}).encode()

    def _prepare(self, prompt: list[int], max_tokens: int) -> tuple[http.client.HTTPConnection, bytes]:
        conn = self._connect()
        body = self._body(prompt, max_tokens)
        conn.putrequest("POST", "/v1/completions", skip_accept_encoding=True)
        for k, v in {**self.headers, "Content-Length": str(len(body))}.items():
            conn.putheader(k, v)
        conn.endheaders(body[:-1])
        return conn, body[-1:]

    def _stream(self, conn, last: bytes, results, i) -> None:
        try:
            t0 = time.perf_counter()
            conn.send(last)
            sent = time.perf_counter()
            resp = conn.getresponse()
            if resp.status != 200:
                raise ServelabError(f"--target {self.url}: a probe request answered {resp.status}: "
                                    f"{resp.read()[:300].decode('utf-8', 'replace')}")
            times, first = [], None
            for line in resp:
                if line.startswith(b"data: [DONE]"):
                    break
                if line.startswith(b"data: "):
                    now = time.perf_counter()
                    first = first or now  # the step's output, even a token of no text yet
                    if b'"text":""' not in line.replace(b" ", b""):
                        times.append(now)
            results[i] = (sent, t0, times, first)
        except OSError as exc:  # a thread cannot raise to the caller: run() re-raises it
            results[i] = ServelabError(f"--target {self.url}: a probe stream failed ({exc})")
        except ServelabError as exc:
            results[i] = exc
        finally:
            conn.close()

    @staticmethod
    def _client_figures(m: Measured, results) -> None:
        from statistics import median

        ttft = [r[2][0] - r[1] for r in results if r and r[2]]
        gaps = [b - a for r in results if r for a, b in zip(r[2], r[2][1:])]
        m.client_ttft_ms = median(ttft) * 1e3 if ttft else None
        m.client_itl_ms = median(gaps) * 1e3 if gaps else None
