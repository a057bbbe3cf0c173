-- Devices: their spec (labels, enabled) as JSON, and their broker password only as a hash
-- in the format the broker's dynamic-security plugin reads (pbkdf2-sha512$iter$salt$hash),
-- so sless writes the broker's accounts from here at every start. `messages` and
-- `last_seen_at` (microseconds since the Unix epoch, UTC) are written by the ingest with
-- each batch of telemetry.
CREATE TABLE devices (
    namespace     TEXT NOT NULL REFERENCES namespaces(name),
    name          TEXT NOT NULL,
    spec          TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    messages      INTEGER NOT NULL DEFAULT 0,
    last_seen_at  INTEGER,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- Telemetry: one row per message a device published, its payload mapped to JSON (the
-- JSON value, a string for other text, {"base64": ...} for binary). `id` grows in commit
-- order; listing is newest first per device or per namespace.
CREATE TABLE telemetry (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace   TEXT NOT NULL,
    device      TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    payload     TEXT NOT NULL
);
CREATE INDEX telemetry_by_device ON telemetry (namespace, device, received_at DESC, id DESC);
CREATE INDEX telemetry_by_namespace ON telemetry (namespace, received_at DESC, id DESC);
