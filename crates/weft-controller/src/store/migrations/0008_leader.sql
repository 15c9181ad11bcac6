-- Migration 8: leader election, on PostgreSQL only (postgres/0008_leader.sql). SQLite keeps
-- one controller per store through its store lease (the `leases` row `controller`): a
-- second controller on the same file is refused, so there is nothing to elect.
SELECT 1;
