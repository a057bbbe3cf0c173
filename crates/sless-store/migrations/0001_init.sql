-- Namespaces, functions and namespace tokens.
CREATE TABLE namespaces (
    name        TEXT PRIMARY KEY,
    created_at  TEXT NOT NULL
);

CREATE TABLE functions (
    namespace    TEXT NOT NULL REFERENCES namespaces(name),
    name         TEXT NOT NULL,
    spec         TEXT NOT NULL,
    status       TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    code_sha256  TEXT,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);

CREATE TABLE tokens (
    hash        TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
