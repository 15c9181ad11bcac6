-- Migration 10: each port's rate as sysfs writes it (`400 Gb/sec (4X NDR)`) and the MTU
-- of its netdev (IPoIB or RoCE), from the agent's last report, for `weft nodes` and the
-- console's overview. NULL: not reported (an agent older than this, or no such file).
ALTER TABLE ports ADD COLUMN rate TEXT;
ALTER TABLE ports ADD COLUMN mtu INTEGER;
-- The web console's sessions, so that a restart does not log everyone out: the session id
-- is kept only as its SHA-256 (the cookie holds the id), with the hash of the API token it
-- logged in with (checked at every request, so a revoked token ends its sessions), its
-- CSRF token and actor; `ended` set at logout.
CREATE TABLE console_sessions (
    id_hash TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL,
    csrf TEXT NOT NULL,
    actor TEXT NOT NULL,
    created INTEGER NOT NULL,
    ended INTEGER
);
CREATE INDEX console_sessions_created ON console_sessions(created);
