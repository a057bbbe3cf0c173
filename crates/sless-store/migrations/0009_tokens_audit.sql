-- Namespace tokens remember when they were last used (written at most about once a
-- minute per token), and the audit log of control-plane changes: who (`admin`,
-- `token:<id>`, `jwt:<sub>` or `anonymous`) did what to which object, when, from
-- which address, with which HTTP status. Request bodies are never stored.
ALTER TABLE tokens ADD COLUMN last_used_at TEXT;

CREATE TABLE audit (
    id           TEXT PRIMARY KEY,
    at_us        INTEGER NOT NULL,
    actor        TEXT NOT NULL,
    namespace    TEXT,
    action       TEXT NOT NULL,
    object_kind  TEXT NOT NULL,
    object_name  TEXT,
    address      TEXT,
    status       INTEGER NOT NULL
);
CREATE INDEX audit_by_time ON audit (at_us, id);
CREATE INDEX audit_by_namespace ON audit (namespace, at_us, id);
