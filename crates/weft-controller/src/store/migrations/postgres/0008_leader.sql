-- Migration 8 on PostgreSQL: the leader's lease, one row. `fencing` is the number the
-- leader stamps into every delivery; a takeover raises it (and meta `fencing`) in the
-- transaction that takes the row. `expires` is in the database's time: a follower takes
-- over only once `expires < now()` by the database's clock.
CREATE TABLE leader (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    url TEXT,
    fencing BIGINT NOT NULL,
    since TIMESTAMPTZ NOT NULL,
    expires TIMESTAMPTZ NOT NULL
);
INSERT INTO leader (id, holder, url, fencing, since, expires)
    VALUES (1, '', NULL, 0, '-infinity', '-infinity');
