-- Migration 9 on PostgreSQL: ../0009_link_runs.sql with an identity column and 64-bit times.
CREATE TABLE link_runs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at BIGINT NOT NULL,
    source TEXT NOT NULL,
    actor TEXT NOT NULL,
    results TEXT NOT NULL
);
