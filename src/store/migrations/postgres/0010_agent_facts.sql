-- PostgreSQL edition of ../0010_agent_facts.sql.
ALTER TABLE agents ADD COLUMN facts TEXT COLLATE "C";
