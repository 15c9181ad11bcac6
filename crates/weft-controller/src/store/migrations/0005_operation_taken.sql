-- Migration 5: an applied operation says what its delivery took away from what the SMs held
-- (removals in words, then every port and the keys it loses), one per line.
ALTER TABLE operations ADD COLUMN taken TEXT NOT NULL DEFAULT '';
