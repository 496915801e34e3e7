//! The identity-token table (migration 0006): one row per issued JWT-SVID, by `jti`. The
//! token itself is never stored; the row is what `jwt list` shows and what revocation marks.

use async_trait::async_trait;

use crate::Result;

/// An issued JWT-SVID as stored (never the token).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JwtSvidRow {
    /// The token's `jti`.
    pub id: String,
    pub subject: String,
    /// JSON array of strings, as text.
    pub audience: String,
    /// The `kid` it was signed under (the signing CA's fingerprint).
    pub kid: String,
    pub issued_by: String,
    pub issued_at: String,
    pub expires_at: String,
    pub revoked_at: Option<String>,
    pub revoked_by: Option<String>,
}

#[async_trait]
pub trait JwtStore: Send + Sync {
    async fn insert_jwt_svid(&self, row: &JwtSvidRow) -> Result<()>;
    async fn get_jwt_svid(&self, id: &str) -> Result<Option<JwtSvidRow>>;
    /// Tokens that expire after `now`, oldest first.
    async fn list_unexpired_jwt_svids(&self, now: &str) -> Result<Vec<JwtSvidRow>>;
    /// Revoked tokens that expire after `now` (what verifiers still need to know).
    async fn list_revoked_jwt_svids(&self, now: &str) -> Result<Vec<JwtSvidRow>>;
    /// Sets revoked_at/revoked_by unless already revoked; returns the row (None: unknown id).
    async fn revoke_jwt_svid(
        &self,
        id: &str,
        revoked_at: &str,
        revoked_by: &str,
    ) -> Result<Option<JwtSvidRow>>;
}
