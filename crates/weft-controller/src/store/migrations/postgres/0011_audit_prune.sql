-- The audit log stays append-only, with one way to shorten it: a prune (`weft controller
-- audit prune`), which in one transaction first appends its own `audit.prune` line (who,
-- the cut-off, the range and the count in its JSON detail) and then deletes the lines older
-- than the cut-off. A DELETE goes through only for a line that is older than the cut-off of
-- the newest line and came before it, when that newest line is an `audit.prune` line: no
-- line can go without the line that records it, and once a prune has committed nothing is
-- left that its line would let go. UPDATE and TRUNCATE stay refused whatever the line.
DROP TRIGGER audit_no_update ON audit;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE FUNCTION audit_delete_under_prune() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p audit%ROWTYPE;
BEGIN
    SELECT * INTO p FROM audit ORDER BY id DESC LIMIT 1;
    -- nested, so that the JSON of no other line is read (a detail is free text elsewhere)
    IF p.action = 'audit.prune' AND OLD.id < p.id THEN
        IF OLD.at < (p.detail::jsonb ->> 'before')::bigint THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only';
END;
$$;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION audit_delete_under_prune();
