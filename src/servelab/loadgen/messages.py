"""The custom Locust messages between the master and its workers, in the order of a run.

master -> workers: RUN (run id, slots, settings, profile text), STAGE (closed loop: the current
stage, re-sent when it changes), OPEN_STAGES (open loop: every stage's schedule up front), DRAIN
(stop sending, finish, ship), ACK (a batch of rows is stored).
workers -> master: READY (the run context is built, or why not), ROWS (a batch of rows and the
worker's counters), DRAINED (the worker's final counts once all its batches are acknowledged).
"""
RUN = "servelab_run"
STAGE = "servelab_stage"
OPEN_STAGES = "servelab_open_stages"
DRAIN = "servelab_drain"
ACK = "servelab_ack"
READY = "servelab_ready"
ROWS = "servelab_rows"
DRAINED = "servelab_drained"
