-- Agent paging (docs/fleet.md, "Listing agents"): pages are keyset scans on the primary key,
-- and `state=quarantined` reads only quarantined agents, which are few; this partial index
-- keeps that filter from scanning the whole fleet.
CREATE INDEX agents_quarantined ON agents (id) WHERE quarantined = 1;
