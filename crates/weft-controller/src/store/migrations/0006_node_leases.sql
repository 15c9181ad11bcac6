-- Migration 5: tenants lease nodes from the free pool (weft-lease decides, the controller stores).
-- No foreign keys to tenants: a lease and its decisions stay as history after its tenant goes.
CREATE TABLE lease_quotas (
    tenant TEXT PRIMARY KEY,
    max_nodes INTEGER NOT NULL CHECK (max_nodes >= 0),
    node_seconds INTEGER NOT NULL CHECK (node_seconds >= 0),
    period_s INTEGER NOT NULL CHECK (period_s > 0)
);
CREATE TABLE node_leases (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    nodes_wanted INTEGER NOT NULL,
    duration_s INTEGER NOT NULL,
    submitted INTEGER NOT NULL,
    not_before INTEGER NOT NULL,
    same_switch INTEGER NOT NULL CHECK (same_switch IN (0, 1)),
    phase TEXT NOT NULL CHECK (phase IN ('waiting', 'queued', 'active', 'ending', 'ended', 'released', 'refused')),
    start_at INTEGER,
    end_at INTEGER,
    nodes TEXT NOT NULL DEFAULT '',
    reason TEXT
);
CREATE TABLE lease_decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    lease INTEGER NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX lease_decisions_lease ON lease_decisions(lease);
CREATE TABLE lease_notices (
    server TEXT PRIMARY KEY,
    lease INTEGER NOT NULL,
    end_at INTEGER NOT NULL
);
