-- The audit log stays append-only, with one way to shorten it: a prune (`weft controller
-- audit prune`), which in one transaction first appends its own `audit.prune` line (who,
-- the cut-off, the range and the count in its JSON detail) and then deletes the lines older
-- than the cut-off. A DELETE goes through only for a line that is older than the cut-off of
-- the newest line and came before it, when that newest line is an `audit.prune` line: no
-- line can go without the line that records it, and once a prune has committed nothing is
-- left that its line would let go. UPDATE stays refused whatever the line.
DROP TRIGGER audit_no_delete;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    WHEN NOT EXISTS (
        SELECT 1 FROM audit AS p
        WHERE p.id = (SELECT MAX(id) FROM audit)
          AND p.action = 'audit.prune'
          AND OLD.id < p.id
          -- CASE: the JSON of no other line is read (a detail is free text elsewhere)
          AND OLD.at < CASE WHEN p.action = 'audit.prune'
                            THEN json_extract(p.detail, '$.before') END
    )
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
