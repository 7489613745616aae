"""The bounds of a profile's numbers: past them the planner, the summary or the run would overflow,
stall or run out of memory, so `servelab profiles validate` rejects them with the bound in the
message. Each is far beyond any real benchmark (docs/profiles.md, "Limits", lists them).
"""
from __future__ import annotations

MAX_TOKENS = 1_000_000               # per prompt, output or prefix: a 1M-token context window
MAX_DURATION_S = 31 * 24 * 3600.0    # any duration or think time (a month; a week-long trace x4)
MAX_USERS = 100_000                  # closed-loop users of one stage
MAX_STAGES = 1_000                   # levels, rates or ramp stages of one plan
MAX_CLASSES = 100
MAX_WEIGHT = 1e6                     # class and histogram weights (relative shares)
MAX_PREFIX_GROUPS = 100_000
MAX_SIGMA = 20.0                     # lognormal sigma (exp(20) is a factor of 5e8)
MIN_BURSTINESS, MAX_BURSTINESS = 0.01, 100.0   # gamma shape: CV 10 .. 0.1
MAX_TIME_SCALE = 1e6
MAX_SEED = 2**31 - 1                 # stored in an INTEGER column
# Open-loop stages generate every send time up front, a trace is held in memory, and a worker
# holds its share of a stage as a list of PlannedRequest (about 250 bytes and 8 us each: 10M
# would be 2.5 GB and over a minute before the first request). So a plan holds at most this many
# requests: rates x (warmup + duration) summed over stages (1,000/s for 16 minutes), or trace rows.
MAX_PLANNED_REQUESTS = 1_000_000
# Planning a session draws max-turns lengths for every class; sum(max turns) over classes stays
# under this so that one block of 256 conversations costs milliseconds, not seconds.
MAX_TURN_SLOTS = 500
