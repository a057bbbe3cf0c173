-- Secrets: only sealed values (XChaCha20-Poly1305, nonce || ciphertext, hex) are
-- stored, in a JSON object by key; the keys themselves are not secret. `digest`
-- changes with every write (fresh nonces), so deployments can tell a replaced secret.
CREATE TABLE secrets (
    namespace   TEXT NOT NULL REFERENCES namespaces(name),
    name        TEXT NOT NULL,
    sealed      TEXT NOT NULL,
    digest      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
