-- Migration 2 on PostgreSQL: ../0002_token_life_and_lease.sql with 64-bit times.
ALTER TABLE api_tokens ADD COLUMN expires BIGINT;
ALTER TABLE api_tokens ADD COLUMN revoked BIGINT;
ALTER TABLE api_tokens ADD COLUMN source TEXT COLLATE "C" NOT NULL DEFAULT 'api';
UPDATE api_tokens SET source = 'bootstrap' WHERE role = 'admin';
CREATE TABLE leases (name TEXT COLLATE "C" PRIMARY KEY, holder TEXT NOT NULL, expires BIGINT NOT NULL);
