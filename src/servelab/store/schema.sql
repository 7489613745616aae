-- servelab's DuckDB schema. One database file holds every run. Times are Unix epoch seconds
-- (DOUBLE) taken from one wall-clock anchor per process plus a monotonic clock, so rows from
-- different workers and hosts join on time. Every column is documented in analysis/README.md.

-- What a request's chunk lists mean, defined once: the store derives its chunk scalars
-- (store.db.REQUEST_SCALARS) and ITL sketches (store.db.ITL_SKETCH_SELECT) with these macros as it
-- writes, and the analysis views (analysis/*.sql) read the same ones. They live in the file with
-- the tables, so the plain duckdb shell has them; a read-only reader of a file from before them
-- gets them as TEMP macros (analysis.views.install_views).
--   servelab_chunk_weight(k): a content chunk's tokens k_i = chunk_tokens[i]; 1 when NULL or
--     below 1 (a content chunk carries text).
--   servelab_chunk_gaps(offsets): the chunk gaps g_i = offset_i - offset_{i-1}, i >= 2 (NULL for
--     NULL offsets, [] for one chunk).
--   servelab_sketch_bin(v): a gap's DDSketch bucket at relative accuracy 1% (gamma = 1.01/0.99):
--     ceil(log_gamma(v)) for v > 0; 0 -> -500000; v < 0 -> -1000000 - ceil(log_gamma(-v)), ordered
--     below 0; NULL, NaN and infinite gaps have none. Why a sketch: analysis/README.md,
--     "Percentiles: exact, except ITL".
--   servelab_sketch_value(b): the value bucket b is read as, 2 gamma^b / (gamma + 1) (its
--     interval (gamma^(b-1), gamma^b] within 1% either way), 0 exactly, negatives mirrored.
CREATE OR REPLACE MACRO servelab_chunk_weight(k) AS greatest(coalesce(k, 1), 1);
CREATE OR REPLACE MACRO servelab_chunk_gaps(offsets) AS
    list_transform(list_zip(list_slice(offsets, 2, -1), list_slice(offsets, 1, -2)), p -> p[1] - p[2]);
CREATE OR REPLACE MACRO servelab_sketch_gamma() AS 1.01 / 0.99;
CREATE OR REPLACE MACRO servelab_sketch_bin(v) AS
    CASE WHEN NOT isfinite(v) THEN NULL
         WHEN v > 0 THEN CAST(ceil(ln(v) / ln(servelab_sketch_gamma())) AS INTEGER)
         WHEN v = 0 THEN -500000
         ELSE -1000000 - CAST(ceil(ln(-v) / ln(servelab_sketch_gamma())) AS INTEGER) END;
CREATE OR REPLACE MACRO servelab_sketch_value(b) AS
    CASE WHEN b = -500000 THEN 0.0
         WHEN b < -500000 THEN -2 * pow(servelab_sketch_gamma(), -1000000 - b) / (servelab_sketch_gamma() + 1)
         ELSE 2 * pow(servelab_sketch_gamma(), b) / (servelab_sketch_gamma() + 1) END;

CREATE TABLE IF NOT EXISTS runs (
    run_id            VARCHAR PRIMARY KEY,
    started_unix      DOUBLE,
    finished_unix     DOUBLE,
    profile_name      VARCHAR,
    profile_path      VARCHAR,
    profile_text      VARCHAR,      -- the full YAML as run
    load_kind         VARCHAR,      -- concurrency | rate | ramp | trace | manual (web UI by hand)
    target            VARCHAR,      -- base URL of the server under test
    variant           VARCHAR,      -- servers/variants name, or NULL
    hardware          VARCHAR,      -- servers/hardware name, or NULL when unknown
    model             VARCHAR,      -- served model id
    gpus              INTEGER,      -- GPUs the variant occupies (per-GPU normalisation)
    tags              MAP(VARCHAR, VARCHAR),
    servelab_version  VARCHAR,
    workers           INTEGER,      -- worker processes (0 = one local process)
    status            VARCHAR,      -- running | completed | failed | interrupted
    host_info         JSON,         -- hostname, cpus, python, locust and duckdb versions
    flags             VARCHAR[],    -- e.g. generator_saturated, rows_lost, predicted, unverified
    settings          JSON,         -- command-line settings (timeouts, seed, salt, ...)
    verification      JSON,         -- servelab verify verdict ({"status": verified|mismatch|unverified|failed_to_start, ...}); NULL when verify never ran
    notes             VARCHAR
);

-- Per-class settings of a run, copied from the profile so SQL can judge SLOs.
CREATE TABLE IF NOT EXISTS run_classes (
    run_id        VARCHAR,
    class_name    VARCHAR,
    weight        DOUBLE,
    slo_ttft_ms   DOUBLE,
    slo_tpot_ms   DOUBLE,
    slo_itl_ms    DOUBLE,
    slo_e2e_ms    DOUBLE,
    PRIMARY KEY (run_id, class_name)
);

-- One row per load stage (a concurrency level, a rate, a ramp stage, a trace replay).
-- The measured window of a stage is [measure_start_unix, measure_end_unix).
CREATE TABLE IF NOT EXISTS stages (
    run_id              VARCHAR,
    stage               INTEGER,
    kind                VARCHAR,    -- concurrency | rate | ramp | trace | manual (web UI by hand) | search (a probe)
    level               DOUBLE,     -- users (closed loop) or requests/s (open loop)
    started_unix        DOUBLE,     -- the stage was asked for
    reached_unix        DOUBLE,     -- the user count was reached (closed loop); = started otherwise
    measure_start_unix  DOUBLE,     -- reached + warm-up
    measure_end_unix    DOUBLE,     -- end of hold, before cool-down
    ended_unix          DOUBLE,
    PRIMARY KEY (run_id, stage)
);

-- One row per request, whatever its outcome.
CREATE TABLE IF NOT EXISTS requests (
    run_id                VARCHAR,
    request_id            VARCHAR,
    worker                VARCHAR,
    worker_seq            BIGINT,     -- per-worker sequence number (loss accounting)
    class_name            VARCHAR,
    stage                 INTEGER,
    level                 DOUBLE,
    warmup                BOOLEAN,    -- sent before the stage's measured window
    scheduled_unix        DOUBLE,     -- open loop / trace: when it should have been sent; else NULL
    sent_unix             DOUBLE,
    first_token_unix      DOUBLE,     -- first chunk carrying output text
    last_token_unix       DOUBLE,     -- last chunk carrying output text
    done_unix             DOUBLE,     -- stream closed ([DONE], error or cut)
    ttft_ms               DOUBLE,
    e2e_ms                DOUBLE,
    chunk_offsets_ms      DOUBLE[],   -- per content chunk: arrival - sent
    chunk_tokens          INTEGER[],  -- per content chunk: tokens in it
    prompt_tokens_target  INTEGER,
    prompt_tokens         INTEGER,    -- actual (server usage, else estimated)
    output_tokens_target  INTEGER,
    output_tokens         INTEGER,    -- actual (server usage, else estimated)
    token_source          VARCHAR,    -- usage | estimated
    cached_tokens         INTEGER,    -- prompt tokens served from the prefix cache, when reported
    finish_reason         VARCHAR,
    http_status           INTEGER,
    error_kind            VARCHAR,    -- NULL when the request succeeded
    error_text            VARCHAR,
    arrival_status        VARCHAR,    -- on_time | late | dropped (open loop); NULL closed loop
    prefix_group          INTEGER,
    session_id            VARCHAR,
    turn                  INTEGER,
    response_id           VARCHAR,    -- the server's response id (joins with server-side logs)
    chunk_token_source    VARCHAR,    -- usage (per-chunk usage deltas) | estimated (1 per chunk)
    data_quality          VARCHAR     -- why a value was stored as NULL (bad_usage: / quarantined:)
);

-- Columns added after the first schema (a database made before them gets them here).
ALTER TABLE requests ADD COLUMN IF NOT EXISTS response_id VARCHAR;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS chunk_token_source VARCHAR;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS data_quality VARCHAR;
-- Derived from the row's own chunk lists when it is written (store.db.REQUEST_SCALARS, which says
-- why; filled in place for rows without them), so the views read numbers, not lists. k_i =
-- chunk_tokens[i] (1 when NULL or < 1), g_i = chunk_offsets_ms[i] - chunk_offsets_ms[i-1].
ALTER TABLE requests ADD COLUMN IF NOT EXISTS chunk_count INTEGER;      -- content chunks n
ALTER TABLE requests ADD COLUMN IF NOT EXISTS chunk_token_sum BIGINT;   -- sum of k_i
ALTER TABLE requests ADD COLUMN IF NOT EXISTS gap_token_sum BIGINT;     -- sum of k_i, i >= 2
ALTER TABLE requests ADD COLUMN IF NOT EXISTS gap_sum_ms DOUBLE;        -- sum of g_i
ALTER TABLE requests ADD COLUMN IF NOT EXISTS gap_mean_ms DOUBLE;       -- mean of g_i
ALTER TABLE requests ADD COLUMN IF NOT EXISTS gap_token_max_ms DOUBLE;  -- max of g_i / k_i
ALTER TABLE requests ADD COLUMN IF NOT EXISTS first_chunk_ms DOUBLE;    -- chunk_offsets_ms[1]
ALTER TABLE requests ADD COLUMN IF NOT EXISTS last_chunk_ms DOUBLE;     -- chunk_offsets_ms[n]

-- Prometheus samples scraped from the target during the run.
CREATE TABLE IF NOT EXISTS server_metrics (
    run_id   VARCHAR,
    t_unix   DOUBLE,
    name     VARCHAR,                 -- sample name as exposed (…_total, …_bucket, …_sum)
    labels   MAP(VARCHAR, VARCHAR),
    value    DOUBLE
);

-- Which row batches the run's writer committed, written in the same transaction as their rows:
-- the database, not the writer's memory, says whether a batch is in (a failure after a commit
-- must not make the worker's resend land twice). One row per worker batch; a write that carried
-- no batch leaves one row with worker and batch NULL, so every transaction can be looked up.
CREATE TABLE IF NOT EXISTS stored_batches (
    run_id    VARCHAR,
    worker    VARCHAR,
    batch     INTEGER,
    n_rows    INTEGER,
    write_no  INTEGER,   -- the writer's transaction
    t_unix    DOUBLE
);

-- What an endpoint servelab reads answered when it was not what servelab can use: a /metrics page
-- that is not Prometheus text (an HTML login page, JSON, empty, cut short, too large, too slow,
-- an error status), a /v1/models, /tokenize, /version or /health that failed. A measured
-- outcome, one row each time (a scrape every second: at most one row a second per endpoint).
CREATE TABLE IF NOT EXISTS endpoint_events (
    run_id    VARCHAR,
    t_unix    DOUBLE,
    endpoint  VARCHAR,   -- /metrics, /v1/models, /tokenize, /version, /health
    outcome   VARCHAR,   -- a name from loadgen.master.scraper.OUTCOMES (or the reader's own)
    detail    VARCHAR    -- what was seen: status, content type, size, an excerpt
);

-- The load generator's own health, sampled on every worker.
CREATE TABLE IF NOT EXISTS client_health (
    run_id            VARCHAR,
    worker            VARCHAR,
    t_unix            DOUBLE,
    cpu_percent       DOUBLE,        -- this process, percent of one core
    loop_lag_ms       DOUBLE,        -- worst event-loop lag seen in the interval
    loop_lag_p99_ms   DOUBLE,
    in_flight         INTEGER,
    backlog           INTEGER,       -- open loop: arrivals due but not yet sent
    rss_mb            DOUBLE
);
-- What tells a busy host from a saturated generator (store/runs.py): this process's involuntary
-- context switches, the host's busy CPU (all cores, percent), steal time, load per core.
ALTER TABLE client_health ADD COLUMN IF NOT EXISTS involuntary_switches_per_s DOUBLE;
ALTER TABLE client_health ADD COLUMN IF NOT EXISTS host_cpu_percent DOUBLE;
ALTER TABLE client_health ADD COLUMN IF NOT EXISTS host_steal_percent DOUBLE;
ALTER TABLE client_health ADD COLUMN IF NOT EXISTS host_load_per_core DOUBLE;      -- 1-minute load average / cores
ALTER TABLE client_health ADD COLUMN IF NOT EXISTS host_runnable_per_core DOUBLE;  -- other runnable threads now / cores

-- Produced vs stored rows per worker: no row is lost silently.
CREATE TABLE IF NOT EXISTS run_workers (
    run_id     VARCHAR,
    worker     VARCHAR,
    host       VARCHAR,
    produced   BIGINT,
    stored     BIGINT,
    in_flight_lost BIGINT,
    status     VARCHAR,               -- finished | lost (no drain answer) | recovered (servelab ingest)
    spool_path VARCHAR,
    PRIMARY KEY (run_id, worker)
);

-- Output fidelity: greedy outputs of a candidate variant against a baseline, one row per prompt
-- (written by orchestration.fidelity; summarised by the fidelity_summary view).
CREATE TABLE IF NOT EXISTS fidelity (
    fidelity_id       VARCHAR,   -- one comparison (a `servelab fidelity` call or a matrix)
    created_unix      DOUBLE,
    baseline          VARCHAR,   -- baseline variant
    candidate         VARCHAR,   -- candidate variant
    backend           VARCHAR,   -- sim | local | compose | external
    hardware          VARCHAR,
    prompt_set        VARCHAR,   -- the prompts file
    prompt_id         VARCHAR,
    category          VARCHAR,
    seed              INTEGER,
    baseline_tokens   INTEGER,   -- output length in tokens
    candidate_tokens  INTEGER,
    exact_match       BOOLEAN,   -- identical token sequences
    first_divergence  INTEGER,   -- first differing token position (0-based); NULL when identical
    similarity        DOUBLE,    -- difflib ratio over token ids, 0..1
    token_source      VARCHAR,   -- server (/tokenize) | words (whitespace split)
    baseline_text     VARCHAR,
    candidate_text    VARCHAR,
    matrix_id         VARCHAR    -- the matrix this comparison belongs to, NULL otherwise
);

-- Derived from requests, one row per request as it is written (store.db.ITL_SKETCH_SELECT): its ITL
-- samples as mergeable DDSketch bucket counts (relative accuracy 1%), so stage, class, run and
-- cross-run ITL percentiles add counts instead of sorting every chunk gap. The raw chunk lists in
-- requests stay the truth (itl_stage_quantiles_exact reads them).
CREATE TABLE IF NOT EXISTS itl_sketches (
    run_id        VARCHAR,
    request_id    VARCHAR,
    gaps          BIGINT,                 -- chunk gaps (chunks - 1)
    gap_tokens    BIGINT,                 -- tokens of chunks 2..n (per-token samples)
    gap_sum_ms    DOUBLE,                 -- sum of the chunk gaps (exact means)
    token_sketch  MAP(INTEGER, BIGINT),   -- bucket -> per-token samples (gap/k, k times)
    chunk_sketch  MAP(INTEGER, BIGINT)    -- bucket -> chunk gaps
);
