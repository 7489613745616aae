"""Scheduler: token budget, decode-first, chunked prefill, FCFS admission, preemption order."""
from servelab.sim.engine.block_manager import BlockManager
from servelab.sim.engine.scheduler import Scheduler
from servelab.sim.engine.sequence import Sequence, Status


def make(num_blocks=100, max_seqs=8, budget=64, max_len=4096, caching=True):
    bm = BlockManager(num_blocks, 16, caching)
    return Scheduler(bm, max_seqs, budget, max_len), bm


def seq(rid, n, out=100, base=None):
    base = hash(rid) % 10_000 * 10_000 if base is None else base
    return Sequence(rid, list(range(base, base + n)), out, ignore_eos=True)


def run_step(sch, batch):
    """Apply a step's results the way the engine does (no speculative decoding)."""
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        if s.num_computed_tokens >= s.num_tokens:
            s.num_output_tokens += 1
        sch.block_manager.commit(s)


def test_fcfs_admission_with_chunked_prefill_in_the_leftover_budget():
    sch, _ = make(budget=64)
    a, b, c = seq("a", 40), seq("b", 40), seq("c", 10)
    for s in (a, b, c):
        sch.add(s)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "b"]
    assert batch.num_new_tokens == [40, 24]  # b is chunked to the budget
    run_step(sch, batch)
    batch = sch.schedule()
    # a decodes first, then b's remaining prompt, then c.
    assert [s.request_id for s in batch.seqs] == ["a", "b", "c"]
    assert batch.num_new_tokens == [1, 16, 10]


def test_budget_caps_decodes_and_max_num_seqs_caps_admission():
    sch, _ = make(budget=3, max_seqs=2)
    seqs = [seq(f"r{i}", 1) for i in range(4)]
    for s in seqs:
        sch.add(s)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["r0", "r1"]  # max_num_seqs
    assert len(sch.waiting) == 2
    run_step(sch, batch)
    assert sch.schedule().num_new_tokens == [1, 1]


def test_decode_first_even_when_a_long_prompt_waits():
    sch, _ = make(budget=32)
    a = seq("a", 8)
    sch.add(a)
    run_step(sch, sch.schedule())
    long = seq("long", 500)
    sch.add(long)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "long"]
    assert batch.num_new_tokens == [1, 31]


def test_admission_stops_at_the_first_request_that_does_not_fit():
    sch, bm = make(num_blocks=6, budget=1000)
    big, small = seq("big", 200), seq("small", 10)
    first = seq("first", 60)
    for s in (first, big, small):
        sch.add(s)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["first"]  # FCFS: small does not jump the queue
    assert [s.request_id for s in sch.waiting] == ["big", "small"]


def test_preemption_takes_the_newest_running_request_and_prepends_it():
    sch, bm = make(num_blocks=4, budget=100)
    a, b, c, d = seq("a", 16), seq("b", 16), seq("c", 16), seq("d", 4)
    for s in (a, b, c):
        sch.add(s)
    run_step(sch, sch.schedule())        # three prompts, one block each; each now has 17 tokens
    sch.add(d)
    batch = sch.schedule()
    # a takes the last free block for its 17th token; b needs one too, so the newest running
    # request (c) is preempted to make room, and nobody is admitted in this step.
    assert [s.request_id for s in batch.seqs] == ["a", "b"]
    assert batch.preempted == [c]
    assert [s.request_id for s in sch.waiting] == ["c", "d"]  # prepended, ahead of d
    assert c.status is Status.WAITING and c.num_computed_tokens == 0 and c.block_table == []
    assert c.num_preemptions == 1 and sch.num_preemptions == 1
    assert bm.num_free_blocks == 0


def test_a_request_that_cannot_grow_preempts_itself_last():
    sch, bm = make(num_blocks=2, budget=100)
    a, b = seq("a", 16), seq("b", 16)
    sch.add(a)
    sch.add(b)
    run_step(sch, sch.schedule())
    batch = sch.schedule()              # a takes... nothing is free: b (newest) goes, a continues
    assert batch.seqs == [a] and batch.preempted == [b]
    run_step(sch, batch)
    # a alone now; when it needs a third block it is its own victim and the step is empty.
    for _ in range(15):
        run_step(sch, sch.schedule())
    batch = sch.schedule()
    assert batch.preempted == [a] and batch.seqs == []
    assert list(sch.waiting)[:2] == [a, b]


def test_a_preempted_request_recomputes_prompt_and_output():
    sch, bm = make(num_blocks=50, budget=1000, caching=False)
    a = seq("a", 20)
    sch.add(a)
    run_step(sch, sch.schedule())
    for _ in range(5):
        run_step(sch, sch.schedule())
    assert a.num_output_tokens == 6
    sch.running.remove(a)
    sch._preempt(a)
    batch = sch.schedule()
    assert batch.seqs == [a] and batch.num_new_tokens == [26]
