//! Authentication and authorization: API keys, roles, the `Principal`, rate limiting, and
//! who may do what on every surface (`access`).
//!
//! Every request passes one chain (contract §4): key → rate limit (`Domain::authenticate`) →
//! role check (the transport's against `access`, then the domain's). Keys are looked up by
//! their SHA-256; on SQLite a key already verified is answered from a cache that every delete
//! or change through this server empties before it returns (`cache`), and on PostgreSQL
//! (shared with other members) the store is read on every request. Either way a deleted key
//! fails its very next request.

pub mod access;
mod cache;
mod keys;
mod rate_limit;

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

pub use access::{bus_permissions, Access};
pub use cache::KeyCache;
pub use keys::{
    authenticate, authenticate_cached, create_key, delete_key, ensure_bootstrap_key, get_key,
    hash_key, list_keys, looks_like_api_key, recover_admin_key, seal_legacy_keys, signing_key,
    update_key, write_private_file, ApiKey, KeyUpdate, NewKey, BOOTSTRAP_KEY_NAME,
};
pub use rate_limit::{Admission, InFlight, KeyLimits, RateLimiter};

/// The roles of contract §4, ordered by what they may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Readonly,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Readonly => "readonly",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "readonly" => Ok(Role::Readonly),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(Error::Invalid(format!(
                "unknown role '{other}' (expected admin, operator or readonly)"
            ))),
        }
    }
}

/// Who is calling: passed into every domain call, used by authorization and audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The API key id, `agent:<id>`, or `server`.
    pub id: String,
    /// The key's name, agent id, or "server", for logs and audit.
    pub name: String,
    pub role: Role,
}

impl Principal {
    /// The server acting on its own behalf (start-up, reapers, internal subsystems).
    pub fn server() -> Self {
        Principal {
            id: "server".into(),
            name: "server".into(),
            role: Role::Admin,
        }
    }

    /// Fails with `Forbidden` unless this principal's role is at least `needed`.
    pub fn require(&self, needed: Role) -> Result<()> {
        if self.role >= needed {
            Ok(())
        } else {
            Err(Error::Forbidden(format!(
                "role '{}' may not do this (needs {})",
                self.role, needed
            )))
        }
    }
}

/// Takes the key out of an `Authorization: Bearer KEY` header value.
pub fn bearer_token(header: Option<&str>) -> Result<&str> {
    let header = header.ok_or_else(|| {
        Error::Unauthenticated("missing API key (Authorization: Bearer KEY)".into())
    })?;
    let mut parts = header.trim().splitn(2, ' ');
    match (parts.next(), parts.next()) {
        (Some(scheme), Some(token)) if scheme.eq_ignore_ascii_case("bearer") => Ok(token.trim()),
        _ => Err(Error::Unauthenticated(
            "malformed Authorization header (expected 'Bearer KEY')".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_order_and_parse() {
        assert!(Role::Admin > Role::Operator && Role::Operator > Role::Readonly);
        for role in [Role::Readonly, Role::Operator, Role::Admin] {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn bearer_header_forms() {
        let cases = [
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Basic abc"), None),
            (Some("Bearer"), None),
            (None, None),
        ];
        for (header, expected) in cases {
            assert_eq!(bearer_token(header).ok(), expected, "{header:?}");
        }
    }

    #[test]
    fn require_checks_rank() {
        let mut principal = Principal::server();
        principal.role = Role::Operator;
        assert!(principal.require(Role::Readonly).is_ok());
        assert!(matches!(
            principal.require(Role::Admin),
            Err(Error::Forbidden(_))
        ));
    }
}
