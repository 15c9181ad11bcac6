-- Migration 3: an applied operation says what it could not verify (ports not on the fabric).
ALTER TABLE operations ADD COLUMN warning TEXT;
