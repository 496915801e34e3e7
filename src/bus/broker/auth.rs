//! Who may use the bus, and for which subjects (contract §7).
//!
//! Owns the [`Authenticator`] trait the server implements (API keys, agent certificates),
//! the [`Permissions`] a successful CONNECT yields, and two built-in authenticators for tests
//! and static configuration. The broker asks once per CONNECT and then checks every PUB and
//! SUB against the returned permissions; nothing here touches sockets.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use async_trait::async_trait;
use rustls::pki_types::CertificateDer;

use crate::bus::subjects::{has_wildcard, pattern_is_subset, patterns_overlap, subject_matches};
use crate::config::Secret;

/// Decides whether a CONNECT is accepted, and with which permissions. Object-safe so the
/// server can hand the broker an `Arc<dyn Authenticator>`.
#[async_trait]
pub trait Authenticator: Send + Sync {
    /// Sent in INFO as `auth_required`. When true, ops before CONNECT are an Authorization
    /// Violation and a CONNECT must arrive within `auth_timeout`.
    fn auth_required(&self) -> bool;
    /// Whether INFO carries a `nonce` for the client to sign (nats-server sends one only when
    /// nkeys or JWTs are configured). Without it [`AuthRequest::nonce`] is empty.
    fn uses_nonce(&self) -> bool {
        false
    }
    /// `None` rejects the connection with `-ERR 'Authorization Violation'`.
    async fn authenticate(&self, request: &AuthRequest<'_>) -> Option<Permissions>;
}

/// The credentials of one CONNECT, plus what the broker knows about the peer.
pub struct AuthRequest<'a> {
    pub auth_token: Option<&'a str>,
    pub user: Option<&'a str>,
    pub pass: Option<&'a str>,
    /// An nkey public key; `sig` is then the base64url Ed25519 signature of `nonce`.
    pub nkey: Option<&'a str>,
    pub sig: Option<&'a str>,
    pub jwt: Option<&'a str>,
    /// The client's self-chosen name, for logs only.
    pub name: Option<&'a str>,
    /// The nonce this connection's INFO carried.
    pub nonce: &'a str,
    pub client_ip: IpAddr,
    /// The verified chain the client presented over TLS, leaf first; `None` without TLS or
    /// without a client certificate.
    pub peer_certificates: Option<&'a [CertificateDer<'static>]>,
}

impl AuthRequest<'_> {
    /// True when the client offered any credential at all (the anonymous case is "none").
    pub fn has_credentials(&self) -> bool {
        self.auth_token.is_some()
            || self.user.is_some()
            || self.nkey.is_some()
            || self.jwt.is_some()
            || self.peer_certificates.is_some()
    }
}

impl fmt::Debug for AuthRequest<'_> {
    // Tokens and passwords never reach a log.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |value: Option<&str>| value.map(|_| "<redacted>");
        formatter
            .debug_struct("AuthRequest")
            .field("auth_token", &redacted(self.auth_token))
            .field("user", &self.user)
            .field("pass", &redacted(self.pass))
            .field("nkey", &self.nkey)
            .field("name", &self.name)
            .field("client_ip", &self.client_ip)
            .field("peer_certificates", &self.peer_certificates.map(<[_]>::len))
            .finish_non_exhaustive()
    }
}

/// One allow or deny rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubjectRule {
    /// A subject pattern with `*` and `>`.
    Pattern(String),
    /// Subjects under `<prefix>.<token>.` where `<token>` is literal (no wildcard) and at
    /// least `min_token_len` long: a client may use an inbox it named itself, but never
    /// `_INBOX.>` or `_INBOX.*.x`, which would overhear other clients' inboxes. Contract §7's
    /// anonymous enrolment uses `private_inbox("_INBOX", 16)`.
    PrivateInbox {
        prefix: String,
        min_token_len: usize,
    },
}

impl SubjectRule {
    pub fn pattern(pattern: impl Into<String>) -> Self {
        SubjectRule::Pattern(pattern.into())
    }

    pub fn private_inbox(prefix: impl Into<String>, min_token_len: usize) -> Self {
        SubjectRule::PrivateInbox {
            prefix: prefix.into(),
            min_token_len,
        }
    }

    /// True when every subject `subject` (a literal or a pattern) can reach is covered.
    fn covers(&self, subject: &str) -> bool {
        match self {
            SubjectRule::Pattern(pattern) if has_wildcard(subject) => {
                pattern_is_subset(subject, pattern)
            }
            SubjectRule::Pattern(pattern) => subject_matches(pattern, subject),
            SubjectRule::PrivateInbox {
                prefix,
                min_token_len,
            } => {
                let Some(rest) = subject
                    .strip_prefix(prefix.as_str())
                    .and_then(|rest| rest.strip_prefix('.'))
                else {
                    return false;
                };
                let Some((token, tail)) = rest.split_once('.') else {
                    return false;
                };
                token.len() >= *min_token_len && token != "*" && token != ">" && !tail.is_empty()
            }
        }
    }
}

/// Allow and deny lists for one direction. Deny wins; an empty allow list allows all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowDeny {
    pub allow: Vec<SubjectRule>,
    pub deny: Vec<SubjectRule>,
}

impl AllowDeny {
    /// Allows everything.
    pub fn all() -> Self {
        AllowDeny::default()
    }

    /// Allows only subjects under the given patterns.
    pub fn only<I, S>(patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AllowDeny {
            allow: patterns.into_iter().map(SubjectRule::pattern).collect(),
            deny: Vec::new(),
        }
    }

    /// Allows nothing: an allow rule no subject can match.
    pub fn none() -> Self {
        AllowDeny {
            allow: Vec::new(),
            deny: vec![SubjectRule::pattern(">")],
        }
    }

    /// Adds deny patterns.
    pub fn deny<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deny
            .extend(patterns.into_iter().map(SubjectRule::pattern));
        self
    }

    /// True when `subject` (a literal, or a SUB pattern) is allowed.
    pub fn allows(&self, subject: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|rule| rule.covers(subject));
        allowed && !self.deny.iter().any(|rule| rule.covers(subject))
    }

    /// Deny patterns that overlap `pattern` without covering it; the broker withholds
    /// messages matching them from a subscription that was itself allowed.
    pub(crate) fn partial_denials(&self, pattern: &str) -> Vec<String> {
        self.deny
            .iter()
            .filter_map(|rule| match rule {
                SubjectRule::Pattern(deny) if patterns_overlap(pattern, deny) => Some(deny.clone()),
                _ => None,
            })
            .collect()
    }
}

/// What one authenticated connection may do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Shown in logs: an API key id, `agent:<id>`, `anonymous`.
    pub user: String,
    pub publish: AllowDeny,
    pub subscribe: AllowDeny,
    /// The embedding process's own connection (svc-server's client), not a client: served
    /// like any other, but left out of monitoring's `/connz` and of the broker's connection
    /// and message counters, as nats-server leaves out its internal clients.
    pub internal: bool,
    /// Every connection with this `user` shares one publish rate and one pending-bytes
    /// budget (`BrokerConfig::user_limits`): set for credentials (API keys, agents), not for
    /// the anonymous enrolment client (anyone is anonymous, so a shared budget would let
    /// one stranger starve every enrolment) nor for the embedding process.
    pub quota: bool,
}

impl Permissions {
    pub fn allow_all(user: impl Into<String>) -> Self {
        Permissions {
            user: user.into(),
            publish: AllowDeny::all(),
            subscribe: AllowDeny::all(),
            internal: false,
            quota: false,
        }
    }

    /// Every right, for the embedding process's own connection ([`Permissions::internal`]).
    pub fn internal(user: impl Into<String>) -> Self {
        Permissions {
            internal: true,
            ..Permissions::allow_all(user)
        }
    }

    /// Contract §7's unauthenticated client: publish only `svc.enroll`, subscribe only under
    /// an `_INBOX.<16+ chars>.` prefix it names literally.
    pub fn enrolment() -> Self {
        Permissions {
            user: "anonymous".into(),
            publish: AllowDeny::only([crate::bus::subjects::ENROLL]),
            subscribe: AllowDeny {
                allow: vec![SubjectRule::private_inbox("_INBOX", 16)],
                deny: Vec::new(),
            },
            internal: false,
            quota: false,
        }
    }

    pub(crate) fn is_unrestricted(&self) -> bool {
        self.publish == AllowDeny::all() && self.subscribe == AllowDeny::all()
    }
}

/// No authentication: every client may do everything. `auth_required` is false.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoAuth;

#[async_trait]
impl Authenticator for NoAuth {
    fn auth_required(&self) -> bool {
        false
    }

    async fn authenticate(&self, _request: &AuthRequest<'_>) -> Option<Permissions> {
        Some(Permissions::allow_all("anonymous"))
    }
}

/// A fixed table of tokens and user/password pairs, each with its permissions, plus an
/// optional anonymous permission set for clients that send no credentials at all (like
/// nats-server's `no_auth_user`; wrong credentials never fall back to it).
#[derive(Clone, Debug, Default)]
pub struct StaticAuth {
    tokens: Vec<(Secret, Permissions)>,
    users: HashMap<String, (Secret, Permissions)>,
    anonymous: Option<Permissions>,
}

impl StaticAuth {
    pub fn new() -> Self {
        StaticAuth::default()
    }

    pub fn with_token(mut self, token: impl Into<String>, permissions: Permissions) -> Self {
        self.tokens.push((Secret(token.into()), permissions));
        self
    }

    pub fn with_user(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
        permissions: Permissions,
    ) -> Self {
        self.users
            .insert(user.into(), (Secret(password.into()), permissions));
        self
    }

    pub fn with_anonymous(mut self, permissions: Permissions) -> Self {
        self.anonymous = Some(permissions);
        self
    }
}

#[async_trait]
impl Authenticator for StaticAuth {
    fn auth_required(&self) -> bool {
        true
    }

    async fn authenticate(&self, request: &AuthRequest<'_>) -> Option<Permissions> {
        if let Some(token) = request.auth_token {
            // Every entry is compared, so the time taken does not say which one matched.
            let mut found = None;
            for (expected, permissions) in &self.tokens {
                if constant_time_eq(expected.expose().as_bytes(), token.as_bytes()) {
                    found = Some(permissions.clone());
                }
            }
            return found;
        }
        if let Some(user) = request.user {
            let (expected, permissions) = self.users.get(user)?;
            let pass = request.pass.unwrap_or_default();
            return constant_time_eq(expected.expose().as_bytes(), pass.as_bytes())
                .then(|| permissions.clone());
        }
        if request.has_credentials() {
            return None;
        }
        self.anonymous.clone()
    }
}

/// Compares without an early exit on the first differing byte.
pub fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    let mut difference = expected.len() ^ given.len();
    for (index, byte) in expected.iter().enumerate() {
        difference |= usize::from(byte ^ given.get(index).copied().unwrap_or(!byte));
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(
        token: Option<&'a str>,
        user: Option<&'a str>,
        pass: Option<&'a str>,
    ) -> AuthRequest<'a> {
        AuthRequest {
            auth_token: token,
            user,
            pass,
            nkey: None,
            sig: None,
            jwt: None,
            name: None,
            nonce: "nonce",
            client_ip: IpAddr::from([127, 0, 0, 1]),
            peer_certificates: None,
        }
    }

    #[test]
    fn publish_permissions() {
        let rules = AllowDeny::only(["svc.>", "_INBOX.>"]).deny(["svc.secret"]);
        let cases = [
            ("svc.a", true),
            ("svc.secret", false),
            ("svc", false),
            ("_INBOX.x.y", true),
            ("other", false),
        ];
        for (subject, expected) in cases {
            assert_eq!(rules.allows(subject), expected, "{subject}");
        }
        assert!(AllowDeny::all().allows("anything.at.all"));
        assert!(!AllowDeny::none().allows("a"));
    }

    #[test]
    fn subscribe_permissions_with_wildcards() {
        let rules = AllowDeny::only(["svc.>"]).deny(["svc.hidden.>"]);
        let cases = [
            ("svc.*", true),
            ("svc.>", true),
            (">", false),
            ("*", false),
            ("svc.hidden.*", false),
            ("svc.hidden.a", false),
        ];
        for (subject, expected) in cases {
            assert_eq!(rules.allows(subject), expected, "{subject}");
        }
        assert_eq!(rules.partial_denials("svc.>"), ["svc.hidden.>"]);
        assert!(rules.partial_denials("svc.*").is_empty());
    }

    #[test]
    fn enrolment_permissions() {
        let permissions = Permissions::enrolment();
        let inbox = "_INBOX.abcdefghijklmnopqrstuv";
        let subscribe_cases = [
            (format!("{inbox}.*"), true),
            (format!("{inbox}.>"), true),
            (format!("{inbox}.reply1"), true),
            (inbox.to_string(), false),
            ("_INBOX.>".into(), false),
            ("_INBOX.*.x".into(), false),
            ("_INBOX.short.*".into(), false),
            ("svc.enroll".into(), false),
            (">".into(), false),
        ];
        for (subject, expected) in subscribe_cases {
            assert_eq!(
                permissions.subscribe.allows(&subject),
                expected,
                "SUB {subject}"
            );
        }
        let publish_cases = [
            ("svc.enroll", true),
            ("svc.agent.a.result", false),
            ("_INBOX.abcdefghijklmnopqrstuv.1", false),
        ];
        for (subject, expected) in publish_cases {
            assert_eq!(
                permissions.publish.allows(subject),
                expected,
                "PUB {subject}"
            );
        }
    }

    #[tokio::test]
    async fn static_auth() {
        let auth = StaticAuth::new()
            .with_token("tok", Permissions::allow_all("token-user"))
            .with_user("alice", "pw", Permissions::allow_all("alice"))
            .with_anonymous(Permissions::enrolment());
        let cases = [
            (request(Some("tok"), None, None), Some("token-user")),
            (request(Some("tok2"), None, None), None),
            (request(Some(""), None, None), None),
            (request(None, Some("alice"), Some("pw")), Some("alice")),
            (request(None, Some("alice"), Some("px")), None),
            (request(None, Some("alice"), None), None),
            (request(None, Some("bob"), Some("pw")), None),
            (request(None, None, None), Some("anonymous")),
        ];
        for (request, expected) in cases {
            let user = auth
                .authenticate(&request)
                .await
                .map(|permissions| permissions.user);
            assert_eq!(user.as_deref(), expected, "{request:?}");
        }
        let strict = StaticAuth::new().with_token("tok", Permissions::allow_all("t"));
        assert!(strict
            .authenticate(&request(None, None, None))
            .await
            .is_none());
    }

    #[test]
    fn constant_time_comparison() {
        let cases: [(&[u8], &[u8], bool); 4] = [
            (b"abc", b"abc", true),
            (b"abc", b"abd", false),
            (b"abc", b"ab", false),
            (b"", b"", true),
        ];
        for (expected, given, result) in cases {
            assert_eq!(constant_time_eq(expected, given), result);
        }
    }
}
