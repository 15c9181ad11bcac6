-- Migration 10 on PostgreSQL: ../0010_ports_and_console_sessions.sql with a 64-bit MTU and the "C"
-- collation of every text column.
ALTER TABLE ports ADD COLUMN rate TEXT COLLATE "C";
ALTER TABLE ports ADD COLUMN mtu BIGINT;
CREATE TABLE console_sessions (
    id_hash TEXT COLLATE "C" PRIMARY KEY,
    token_hash TEXT COLLATE "C" NOT NULL,
    csrf TEXT COLLATE "C" NOT NULL,
    actor TEXT COLLATE "C" NOT NULL,
    created BIGINT NOT NULL,
    ended BIGINT
);
CREATE INDEX console_sessions_created ON console_sessions(created);
