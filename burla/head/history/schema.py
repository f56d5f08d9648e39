"""History's database: its tables, the columns a job's row has, and the statements that bring
an older database up to this schema."""

from __future__ import annotations

SCHEMA_VERSION = 6
# Older schemas this one reads after these statements (others are moved aside).
_GPU_SAMPLES = [
    "ALTER TABLE node_samples ADD COLUMN gpu_percent REAL NOT NULL DEFAULT 0",
    "ALTER TABLE node_samples ADD COLUMN gpu_mem_percent REAL NOT NULL DEFAULT 0",
]
_WHERE_CALLS_FAILED = [
    "ALTER TABLE call_failures ADD COLUMN node_id TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE call_failures ADD COLUMN host TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE call_failures ADD COLUMN worker_pid INTEGER NOT NULL DEFAULT 0",
]
MIGRATIONS = {2: ["ALTER TABLE jobs ADD COLUMN end_kind TEXT NOT NULL DEFAULT ''", *_WHERE_CALLS_FAILED,
                  *_GPU_SAMPLES],
              3: [*_WHERE_CALLS_FAILED, *_GPU_SAMPLES],
              4: _GPU_SAMPLES,
              5: []}  # 6 added the call_batches table, which SCHEMA makes

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    parent_job_id TEXT,
    function_name TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    n_inputs INTEGER NOT NULL,
    n_done INTEGER NOT NULL DEFAULT 0,
    n_failed INTEGER NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    ended_at REAL,
    arguments TEXT NOT NULL,
    end_kind TEXT NOT NULL DEFAULT ''  -- the error kind it ended with (an exception class name)
);
CREATE INDEX IF NOT EXISTS jobs_started ON jobs (started_at);
CREATE INDEX IF NOT EXISTS jobs_parent ON jobs (parent_job_id);
CREATE TABLE IF NOT EXISTS call_failures (
    job_id TEXT NOT NULL,
    input_index INTEGER NOT NULL,
    exception_type TEXT NOT NULL,
    message TEXT NOT NULL,
    traceback TEXT NOT NULL,
    at REAL NOT NULL,
    node_id TEXT NOT NULL DEFAULT '',  -- where it failed ('' where not known)
    host TEXT NOT NULL DEFAULT '',
    worker_pid INTEGER NOT NULL DEFAULT 0,  -- 0: the node itself failed it
    PRIMARY KEY (job_id, input_index)
);
-- Output is stored a flush at a time per job (one row holds many calls' chunks as JSON), so a
-- job whose every call prints costs a few rows a second, not one row per call.
CREATE TABLE IF NOT EXISTS call_output (
    job_id TEXT NOT NULL,
    min_index INTEGER NOT NULL,
    max_index INTEGER NOT NULL,
    at REAL NOT NULL,
    chunks TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS call_output_job ON call_output (job_id, min_index);
CREATE TABLE IF NOT EXISTS node_events (
    node_id TEXT NOT NULL,
    event TEXT NOT NULL,
    detail TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS node_events_node ON node_events (node_id, at);
CREATE TABLE IF NOT EXISTS node_samples (
    node_id TEXT NOT NULL,
    at REAL NOT NULL,
    cpu_percent REAL NOT NULL,
    mem_percent REAL NOT NULL,
    net_sent_bps REAL NOT NULL,
    net_recv_bps REAL NOT NULL,
    workers_alive INTEGER NOT NULL,
    running INTEGER NOT NULL,
    gpu_percent REAL NOT NULL DEFAULT 0,  -- mean utilisation of its GPUs
    gpu_mem_percent REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS node_samples_node ON node_samples (node_id, at);
CREATE TABLE IF NOT EXISTS call_batches (
    job_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    indices BLOB NOT NULL,
    failed BLOB NOT NULL,
    timings BLOB NOT NULL,
    tries TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS call_batches_job ON call_batches (job_id);
CREATE TABLE IF NOT EXISTS job_samples (
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    n_done INTEGER NOT NULL,
    n_failed INTEGER NOT NULL,
    running INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS job_samples_job ON job_samples (job_id, at);
CREATE TABLE IF NOT EXISTS settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    data TEXT NOT NULL
);
-- Jobs still running, with their OpenJob frame, so that a head that restarts takes them up again.
CREATE TABLE IF NOT EXISTS live_jobs (
    job_id TEXT PRIMARY KEY,
    opening BLOB NOT NULL
);
-- A detached job's inputs until their results are in, and its results until collected: its
-- client is gone, so a restarted head must have them.
CREATE TABLE IF NOT EXISTS kept_inputs (
    job_id TEXT NOT NULL,
    input_index INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (job_id, input_index)
);
CREATE TABLE IF NOT EXISTS kept_results (
    job_id TEXT NOT NULL,
    input_index INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (job_id, input_index)
);
"""

JOB_COLUMNS = ("job_id", "parent_job_id", "function_name", "status", "reason", "n_inputs", "n_done", "n_failed",
               "started_at", "ended_at", "arguments", "end_kind")
