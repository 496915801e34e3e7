-- Nothing usable in the clear at rest (docs/secrets.md, "Encryption at rest").
--
-- `data_keys`: random 256-bit keys, each wrapped (AES-256-GCM) by master_key with
-- 'data_key:<name>' as associated data. The one named 'at-rest' seals the stored plans
-- (agent_states.plan, blueprint_applies.plan) and the file service's request-signing keys
-- (api_keys.signing_sealed). A master-key rotation re-wraps these rows with the secrets'
-- keys, in one transaction, however many rows they seal.
CREATE TABLE data_keys (
    name        TEXT PRIMARY KEY,
    key_sealed  TEXT NOT NULL,
    created_at  TEXT NOT NULL
);

-- The HMAC key of a file request signature (SHA-256 of the API key) sealed by the 'at-rest'
-- data key; key_hash becomes SHA-256 of that HMAC key, so it no longer signs. NULL for rows
-- written before this migration (key_hash is then the HMAC key): the server converts them
-- at its next start.
ALTER TABLE api_keys ADD COLUMN signing_sealed TEXT;
