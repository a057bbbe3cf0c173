-- Async calls: one row per call, written before the caller gets its 202 so a restart (or a
-- kill -9) never loses one. `seq` orders the queue in commit order (SQLite has one writer,
-- so rowids are handed out in the order inserts commit); times are microseconds since the
-- Unix epoch (UTC).
CREATE TABLE async_calls (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               TEXT NOT NULL UNIQUE,
    namespace        TEXT NOT NULL,
    function         TEXT NOT NULL,
    phase            TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    event            BLOB NOT NULL,
    request_id       TEXT NOT NULL,
    callback_url     TEXT,
    response_status  INTEGER,
    response_headers TEXT,
    response_body    BLOB,
    error            TEXT,
    redrive_of       TEXT,
    queued_at        INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER
);
-- The dispatcher walks one function's unfinished calls in queue order.
CREATE INDEX async_calls_pending ON async_calls (namespace, function, phase, seq);
-- Listing: one namespace, newest first.
CREATE INDEX async_calls_by_time ON async_calls (namespace, queued_at DESC, seq DESC);

-- Messages and calls that exhausted their delivery policy, kept until redriven or deleted.
-- `payload` is what was delivered (the broker's bytes; an async call's event); `message`
-- is the JSON of the last attempt's `context.message` (`{"call_id"}` for async calls).
CREATE TABLE dead_letters (
    id           TEXT PRIMARY KEY,
    namespace    TEXT NOT NULL,
    source       TEXT NOT NULL,
    trigger      TEXT,
    function     TEXT NOT NULL,
    payload      BLOB NOT NULL,
    message      TEXT NOT NULL,
    attempts     INTEGER NOT NULL,
    last_status  INTEGER NOT NULL,
    error        TEXT,
    failed_at    INTEGER NOT NULL
);
CREATE INDEX dead_letters_by_time ON dead_letters (namespace, failed_at DESC, id DESC);
CREATE INDEX dead_letters_by_trigger ON dead_letters (namespace, trigger, failed_at DESC);
