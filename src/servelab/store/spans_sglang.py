"""SGLang's own request traces decoded into the same ``server_spans`` row as vLLM's span.

SGLang 0.5.21 - 0.5.23 (``--enable-trace``; ``sglang/srt/observability/trace.py`` and
``req_time_stats.py``, the same in both wheels) does not send one span per request: it sends a
tree, from several processes, each through its own BatchSpanProcessor (so in separate exports):

  root      ``"{role} Req {rid[:8]}"`` (role "" unless PD), tokenizer manager
            (``TraceReqContext.trace_req_start``): start = the OpenAI handler's received_time,
            end = ``set_finished_time``; attributes ``rid`` (``rid.split("_")[-1]``), ``module``
            = ``sglang::request``, and at the finish (``TokenizerManager.convert_to_span_attrs``,
            ``APIServerReqTimeStats.convert_to_gen_ai_span_attrs``) ``gen_ai.request.id`` (the
            whole rid), ``gen_ai.usage.*`` and ``gen_ai.latency.*``.
  thread    one per process (and TP/PP rank) under the root: attributes ``thread_label``,
            ``host_id``, ``pid`` (``__create_thread_context``).
  slices    stage spans under a thread span (``RequestStage``): the scheduler's
            ``prefill_waiting`` (waiting queue entry -> first forward, level 1) and
            ``prefill_forward`` (first forward -> prefill finished, level 1) are read; the others
            (tokenize, request_process, decode_forward, decode_loop, ...) are counted, not read.

The scheduler's slices carry no request id, only the trace id, and usually come before the root
(they end at the first token, the root at the finish): they wait here, by trace id, until the
root comes. The row is made when the root comes, whatever has come by then; a slice still
missing leaves its column NULL and is counted (``notes``), and one that comes after its row is
counted late, never stored as a second row, so the receiver's one-row-per-request duplicate and
lost-span accounting stays true.

SGLang's ``gen_ai.latency.time_in_model_prefill`` and ``time_in_model_inference`` are measured
from the tokenizer's dispatch (they hold the scheduler's intake and queue), not from the first
schedule as vLLM's: they stay in ``attributes``, not in the columns that mean vLLM's.
"""
from __future__ import annotations

from collections import OrderedDict

ROOT_MODULE = "sglang::request"     # trace_req_start: attrs["module"], module_name "request"
RID = "rid"
QUEUE, PREFILL = "prefill_waiting", "prefill_forward"
# req_time_stats.RequestStage: every stage name SGLang 0.5.23 names a slice after
STAGES = frozenset((
    "tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", QUEUE,
    "decode_forward", "decode_loop", PREFILL, "chunked_prefill", "mm_encode", "prefill_prepare",
    "prefill_bootstrap", "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap",
    "decode_waiting", "decode_transferred", "fake_output", "quick_finish", "spec_draft",
    "spec_verify", "run_batch_cpu"))
# The root's gen_ai.latency.* that mean what vLLM's do (tokenizer manager's clock):
# TTFT = first output - received, e2e = finished - received, decode = finished - first output.
ROOT_LATENCY = {
    "gen_ai.latency.time_to_first_token": "time_to_first_token_s",
    "gen_ai.latency.e2e": "e2e_s",
    "gen_ai.latency.time_in_model_decode": "time_in_model_decode_s",
}
SLICE_COLUMNS = {QUEUE: "time_in_queue_s", PREFILL: "time_in_model_prefill_s"}
MAX_TRACES = 50_000     # traces waiting for their root, and traces whose row was made
KEPT_RUNS = 8           # runs whose assembler is kept: a run's notes are read after it ends
CANNOT_SPLIT = (
    "server spans (SGLang): time_in_model_inference is NULL (SGLang's attribute of that name "
    "starts at the tokenizer's dispatch, not at the first schedule); server_other holds "
    "tokenization, the tokenizer -> scheduler hand-off and the scheduler's intake "
    "(request_process, level 2, not read), and to_server only the network (SGLang's arrival is "
    "the HTTP handler's); decode is the tokenizer manager's first output -> finish; a "
    "retracted request's second wait and prefill fall inside decode")


def is_root(attrs: dict) -> bool:
    return attrs.get("module") == ROOT_MODULE and RID in attrs


def is_piece(name, attrs: dict) -> bool:
    """A stage slice or a per-process thread span of SGLang's request tree."""
    return name in STAGES or ("thread_label" in attrs and "host_id" in attrs)


class Assembler:
    """One run's SGLang slices waiting for their root, and the traces whose row was made."""

    def __init__(self, max_traces: int = MAX_TRACES):
        self.max_traces = max_traces
        self.pending: OrderedDict = OrderedDict()   # trace -> {parent span: {slice: (s, e)}}
        self.closed: OrderedDict = OrderedDict()    # trace -> the slices its row used
        self.counts = dict.fromkeys(("rows", "no_queue", "no_prefill", "late_slices",
                                     "evicted_traces", "foreign_rows"), 0)

    def add_slice(self, trace_id, parent_id, name, start_ns, end_ns) -> None:
        if name not in SLICE_COLUMNS:
            return
        if trace_id in self.closed:
            self.counts["late_slices"] += 1
            return
        group = self.pending.setdefault(trace_id, {}).setdefault(parent_id, {})
        # the first of its name: a retracted request waits and prefills again, after its
        # first token (req_time_stats.set_prefill_finished_time's retract branch)
        if name not in group or _ns(start_ns) < group[name][0]:
            group[name] = (_ns(start_ns), _ns(end_ns))
        while len(self.pending) > self.max_traces:
            self.pending.popitem(last=False)
            self.counts["evicted_traces"] += 1

    def take(self, trace_id) -> tuple[dict, bool]:
        """The slices for the root of ``trace_id`` ({name: (start_ns, end_ns)}) and whether a
        root of it came before (an exporter's retry: the same slices, not counted again)."""
        resent = trace_id in self.closed
        used = self.closed[trace_id] if resent else _pick(self.pending.pop(trace_id, {}))
        self.closed[trace_id] = used
        while len(self.closed) > self.max_traces:
            self.closed.popitem(last=False)
        return used, resent

    def count(self, missing: list, foreign: bool) -> None:
        c = self.counts
        c["rows"] += 1
        c["no_queue"] += QUEUE in missing
        c["no_prefill"] += PREFILL in missing
        c["foreign_rows"] += foreign

    def notes(self) -> list[str]:
        c = self.counts
        if not c["rows"]:
            return []
        out = [CANNOT_SPLIT]
        if c["no_queue"] or c["no_prefill"]:
            out.append(f"server spans (SGLang): {c['no_queue']} of {c['rows']} rows without "
                       f"queue ({QUEUE}), {c['no_prefill']} without prefill ({PREFILL}): the "
                       "scheduler's slice had not come when the request's root span did "
                       f"(slices after their row, other TP ranks' too: {c['late_slices']}, "
                       "counted, not joined)")
        if c["evicted_traces"]:
            out.append(f"server spans (SGLang): {c['evicted_traces']} traces' slices waited "
                       f"for a root span past {self.max_traces} traces and were let go")
        if c["foreign_rows"] == c["rows"]:
            out.append("server spans (SGLang): no root span names an id servelab sent; SGLang "
                       "takes a request's id from its `rid` field (or X-Override-Rid on chat), "
                       "not X-Request-Id")
        return out


def phases(used: dict) -> dict:
    """server_spans column -> seconds, from the slices a row was made with (None: not come)."""
    out = dict.fromkeys(SLICE_COLUMNS.values())
    for name, column in SLICE_COLUMNS.items():
        if name in used:
            s, e = used[name]
            out[column] = (e - s) / 1e9 if 0 < s <= e else None
    return out


def missing(used: dict) -> list[str]:
    return [name for name in SLICE_COLUMNS if name not in used]


def _ns(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def _pick(groups: dict) -> dict:
    """One scheduler's slices: with TP or PP every rank's scheduler traces the request under
    its own thread span; the first whose queue and prefill both came, else the fullest."""
    if not groups:
        return {}
    full = [g for g in groups.values() if len(g) == len(SLICE_COLUMNS)]
    return dict(full[0] if full else max(groups.values(), key=len))


_RUNS: OrderedDict = OrderedDict()


def assembler_for(run_id: str | None) -> Assembler:
    """The run's assembler. The receiver decodes export by export and a request's root and
    slices come in different ones (different processes), so the slices must outlive a call;
    between runs (no run id) nothing is kept."""
    if run_id is None:
        return Assembler()
    if run_id not in _RUNS:
        _RUNS[run_id] = Assembler()
        while len(_RUNS) > KEPT_RUNS:
            _RUNS.popitem(last=False)
    return _RUNS[run_id]


def notes(run_id: str | None) -> list[str]:
    """The run's notes on its SGLang rows (none when it had none)."""
    return _RUNS[run_id].notes() if run_id in _RUNS else []
