//! The column lists both drivers select and insert, in one place: the schema is one (see
//! `store/mod.rs`), so the lists are too.

pub(crate) const API_KEY_COLUMNS: &str =
    "id, name, role, key_hash, created_at, last_used_at, expires_at, signing_sealed";
pub(crate) const AUDIT_COLUMNS: &str =
    "seq, id, timestamp, user_id, action, resource_type, resource_id, \
     outcome, policy_id, decision, severity, detail, prev_hash, hash";
pub(crate) const CA_COLUMNS: &str =
    "id, kind, cert_pem, key_encrypted, fingerprint, not_before, not_after, created_at, retired_at";
/// Retires the active rows of kind $2 but the newest, at $1. SQLite numbers `$N` parameters
/// by first appearance, so with $1 first one text serves both drivers.
pub(crate) const RETIRE_OLDER_CA: &str = "UPDATE ca SET retired_at = $1 \
     WHERE kind = $2 AND retired_at IS NULL AND id <> (SELECT id FROM ca \
     WHERE kind = $2 AND retired_at IS NULL ORDER BY created_at DESC, id DESC LIMIT 1)";
pub(crate) const JOIN_TOKEN_COLUMNS: &str =
    "id, token_hash, agent_id, created_by, created_at, expires_at, used_at, used_by, revoked_at";
pub(crate) const AGENT_COLUMNS: &str = "id, labels, fingerprint, enrolled_at, quarantined, \
     quarantine_reason, quarantined_at, last_heartbeat_at, facts, public_key";
pub(crate) const JWT_COLUMNS: &str =
    "id, subject, audience, kid, issued_by, issued_at, expires_at, revoked_at, revoked_by";
pub(crate) const MASTER_CHECK_ID: &str = "master";
pub(crate) const SECRET_COLUMNS: &str =
    "path, wrapped_key, current_version, created_at, updated_at";
pub(crate) const VERSION_COLUMNS: &str =
    "path, version, ciphertext, created_at, deleted_at, destroyed";
pub(crate) const TRANSIT_COLUMNS: &str =
    "name, key_type, latest_version, min_decryption_version, created_at, updated_at";
pub(crate) const TRANSIT_VERSION_COLUMNS: &str = "name, version, material, public_key, created_at";
pub(crate) const LEASE_COLUMNS: &str = "id, path, backend, backend_data, created_at, expires_at, \
     max_expires_at, renewable, revoked_at, last_error";
pub(crate) const WEBHOOK_COLUMNS: &str = "id, url, event_types, category, min_severity, \
     description, secret_sealed, created_by, created_at, updated_at, cursor_seq";
pub(crate) const DELIVERY_COLUMNS: &str = "id, webhook_id, event_id, event_seq, event_type, \
     body, status, attempts, created_at, next_attempt_at, deadline_at, last_attempt_at, \
     response_status, last_error";
pub(crate) const EXECUTION_COLUMNS: &str = "id, runbook, status, parameters, definition, \
     started_by, started_at, finished_at, trigger_event_id";
pub(crate) const STEP_COLUMNS: &str = "execution_id, step_id, status, attempts, started_at, \
     finished_at, output, error, approved_by";
pub(crate) const BLUEPRINT_COLUMNS: &str =
    "name, version, description, sha256, manifest, bundle, installed_by, installed_at";
pub(crate) const BLUEPRINT_APPLY_COLUMNS: &str =
    "id, name, version, kind, target, parameters, plan, results, applied_by, applied_at";
pub(crate) const BLUEPRINT_AGENT_COLUMNS: &str =
    "name, agent_id, version, apply_id, status, applied_at";
pub(crate) const JOB_COLUMNS: &str = "id, kind, target, description, created_by, created_at, \
     expires_at, finished_at, agents, counts";
