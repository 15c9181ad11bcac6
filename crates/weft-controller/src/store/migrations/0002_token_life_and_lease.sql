-- Migration 2: tokens with a life, and the lease that keeps a second controller off the store.
-- Admin tokens made before this migration were the bootstrap token (or minted by a
-- body without a tenant): treated as bootstrap tokens, so rotation revokes them.
ALTER TABLE api_tokens ADD COLUMN expires INTEGER;
ALTER TABLE api_tokens ADD COLUMN revoked INTEGER;
ALTER TABLE api_tokens ADD COLUMN source TEXT NOT NULL DEFAULT 'api';
UPDATE api_tokens SET source = 'bootstrap' WHERE role = 'admin';
CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires INTEGER NOT NULL);
