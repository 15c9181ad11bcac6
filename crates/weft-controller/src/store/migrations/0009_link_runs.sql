-- Migration 9: runs of link measurements that `weft bench p2p`, `weft bench collectives`
-- and `weft doctor` send with --report-to (links::LinkResult list as JSON), newest kept.
CREATE TABLE link_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    source TEXT NOT NULL,
    actor TEXT NOT NULL,
    results TEXT NOT NULL
);
