-- Migration 10 on PostgreSQL: ../0010_port_rate_mtu.sql with a 64-bit MTU and the "C"
-- collation of every text column.
ALTER TABLE ports ADD COLUMN rate TEXT COLLATE "C";
ALTER TABLE ports ADD COLUMN mtu BIGINT;
