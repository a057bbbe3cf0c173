-- The generation of functions, triggers and jobs: it grows by one with every change of
-- an object's spec or code (never with the status the server reports), so an update can
-- be a compare-and-swap on it and clients can send it back as `If-Match`. Objects that
-- exist already start at 1, as new ones do.
ALTER TABLE functions ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE triggers ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
