-- The address of each node's Prometheus `/metrics` endpoint, kept so that `elastrec
-- status` still shows it after a master restart that adopted the running processes.
ALTER TABLE nodes ADD COLUMN metrics_addr TEXT NOT NULL DEFAULT '';
