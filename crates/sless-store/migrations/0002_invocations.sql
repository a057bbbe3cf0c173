-- One row per invocation, written in batches by the recorder and pruned by age and count.
-- Times are microseconds since the Unix epoch (UTC): integers sort and compare exactly
-- and cost less to index than text.
CREATE TABLE invocations (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    function     TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    source       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    duration_us  INTEGER NOT NULL,
    status       INTEGER NOT NULL,
    cold_start   INTEGER NOT NULL,
    error        TEXT
);

-- Listing (newest first) and pruning both walk one namespace by time.
CREATE INDEX invocations_by_time ON invocations (namespace, started_at DESC);
