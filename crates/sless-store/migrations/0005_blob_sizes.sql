-- The sizes of stored code archives, for the per-namespace storage quota: compressed
-- (the archive as stored) and unpacked (what a build of it writes at least).
CREATE TABLE blob_sizes (
    sha256      TEXT PRIMARY KEY,
    compressed  INTEGER NOT NULL,
    unpacked    INTEGER NOT NULL
);
