-- Migration 1: the schema (see store/mod.rs for what each table holds).
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('desired_generation', '0'), ('applied_generation', '0');
CREATE TABLE tenants (name TEXT PRIMARY KEY, created INTEGER NOT NULL);
CREATE TABLE api_tokens (
    hash TEXT PRIMARY KEY,
    role TEXT NOT NULL CHECK (role IN ('admin', 'tenant')),
    tenant TEXT REFERENCES tenants(name),
    created INTEGER NOT NULL,
    CHECK ((role = 'tenant') = (tenant IS NOT NULL))
);
CREATE TABLE enrollments (
    hash TEXT PRIMARY KEY,
    server TEXT,
    expires INTEGER NOT NULL,
    used INTEGER,
    created_by TEXT NOT NULL
);
CREATE TABLE servers (
    name TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL UNIQUE,
    enrolled INTEGER NOT NULL,
    last_seen INTEGER,
    report_hash TEXT
);
CREATE TABLE ports (
    guid INTEGER PRIMARY KEY,
    server TEXT NOT NULL REFERENCES servers(name),
    device TEXT NOT NULL,
    num INTEGER NOT NULL,
    lid INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX ports_server ON ports(server);
CREATE TABLE claims (
    id INTEGER PRIMARY KEY,
    guid INTEGER NOT NULL,
    claimant TEXT NOT NULL REFERENCES servers(name),
    owner TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
    created INTEGER NOT NULL,
    decided INTEGER
);
CREATE TABLE groups (
    name TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants(name),
    pkey INTEGER NOT NULL UNIQUE,
    created INTEGER NOT NULL
);
CREATE TABLE members (
    server TEXT PRIMARY KEY REFERENCES servers(name),
    grp TEXT NOT NULL REFERENCES groups(name)
);
CREATE TABLE operations (
    id INTEGER PRIMARY KEY,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    generation INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'applied')),
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    diff TEXT NOT NULL,
    created INTEGER NOT NULL,
    finished INTEGER
);
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    diff TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
