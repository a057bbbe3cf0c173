-- Invocation records in a single B-tree, clustered by what listing and pruning walk (one
-- namespace by time, ties broken by id). Each record written (and later pruned) now costs one
-- B-tree insert instead of three: the rowid table, the index on id and the index by time.
CREATE TABLE invocations_clustered (
    namespace    TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    id           TEXT NOT NULL,
    function     TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    source       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    duration_us  INTEGER NOT NULL,
    status       INTEGER NOT NULL,
    cold_start   INTEGER NOT NULL,
    error        TEXT,
    PRIMARY KEY (namespace, started_at, id)
) WITHOUT ROWID;

INSERT INTO invocations_clustered (namespace, started_at, id, function, revision, source,
    request_id, duration_us, status, cold_start, error)
SELECT namespace, started_at, id, function, revision, source, request_id, duration_us, status,
    cold_start, error
FROM invocations;

DROP TABLE invocations;
ALTER TABLE invocations_clustered RENAME TO invocations;
