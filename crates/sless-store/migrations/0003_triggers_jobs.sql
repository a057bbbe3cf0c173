-- Triggers (http, cron) and jobs (one-shot runs).
CREATE TABLE triggers (
    namespace   TEXT NOT NULL REFERENCES namespaces(name),
    name        TEXT NOT NULL,
    function    TEXT NOT NULL,
    kind        TEXT NOT NULL,
    spec        TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE INDEX triggers_by_function ON triggers (namespace, function);

CREATE TABLE jobs (
    namespace    TEXT NOT NULL REFERENCES namespaces(name),
    name         TEXT NOT NULL,
    spec         TEXT NOT NULL,
    status       TEXT NOT NULL,
    code_sha256  TEXT,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
