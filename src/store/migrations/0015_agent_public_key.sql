-- Signed results and heartbeats (docs/fleet.md, "Signed results and heartbeats"): the public key
-- of the agent's certificate (base64url of the P-256 point), recorded at enrolment when the
-- agent says it signs. The server verifies every result and heartbeat against it. NULL for
-- agents enrolled before, or by an svc-agent that does not sign.

ALTER TABLE agents ADD COLUMN public_key TEXT;
