-- Agent facts (docs/fleet.md, "Facts"): what each agent last reported about its host, as a
-- JSON object in text, beside its labels, so `svcctl agent show` has them after a restart and
-- on every cluster member. NULL until the agent reports (agents older than facts never do).

ALTER TABLE agents ADD COLUMN facts TEXT;
