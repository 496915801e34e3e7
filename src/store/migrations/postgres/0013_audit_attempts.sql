-- Audit before acting (docs/reliability.md, "Audit before acting"): a change writes an attempt
-- row (outcome `attempt`) before it runs, and its outcome row names it in detail.attempt. The
-- log hides an attempt whose outcome is there, so this finds an outcome by its attempt.
CREATE INDEX audit_events_attempt ON audit_events ((detail::jsonb ->> 'attempt'))
    WHERE (detail::jsonb ->> 'attempt') IS NOT NULL;
