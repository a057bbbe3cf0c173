-- Deliveries (queue and device triggers, async calls) record every attempt: which one it
-- was (1-based), and the trigger or async call it belongs to. NULL for every other source.
ALTER TABLE invocations ADD COLUMN attempt INTEGER;
ALTER TABLE invocations ADD COLUMN trigger TEXT;
ALTER TABLE invocations ADD COLUMN call_id TEXT;
