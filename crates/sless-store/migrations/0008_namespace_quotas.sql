-- Per-namespace quota overrides set by an admin: a JSON object of the quotas that
-- differ from the server's defaults (`{"functions": 10}`). A namespace without a
-- row uses the defaults; deleting the namespace deletes its row.
CREATE TABLE namespace_quotas (
    namespace   TEXT PRIMARY KEY REFERENCES namespaces(name) ON DELETE CASCADE,
    quota       TEXT NOT NULL
);
