-- PostgreSQL edition of ../0015_agent_public_key.sql.
ALTER TABLE agents ADD COLUMN public_key TEXT COLLATE "C";
