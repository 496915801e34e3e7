//! Bus subjects: validation, wildcard matching, and the names svc itself uses (contract §7).
//!
//! Owns what a subject *is* (dot-separated tokens, `*` one token, `>` one or more trailing
//! tokens) and the subjects of the control plane: enrolment, the agents', the events', the
//! files'. Not all: the server subscribes to agents' heartbeats and results with wildcards of
//! its own (`server/fleet.rs`), `fleet::protocol::agent_of` reads an agent id back out of a
//! subject, JWT-mode enrolment replies go under `identity::nats::ENROL_REPLY_PREFIX`, and the
//! JetStream streams name their internal subjects beside them (`stream/jetstream.rs`,
//! `files/jetstream.rs`). Pure functions only: no I/O, no allocation on
//! the matching path.

/// Enrolment requests from agents that have no credentials yet.
pub const ENROLL: &str = "svc.enroll";
/// An enrolled agent's renewal of its NATS user JWT (cluster mode, `bus.external_auth: jwt`),
/// sent with the enrolment JWT: it works even after the agent's own JWT has expired.
pub const ENROLL_RENEW: &str = "svc.enroll.renew";
/// Every agent's subjects, for permissions and server-side subscriptions.
pub const AGENTS_ALL: &str = "svc.agent.>";
/// Every event type, for `svc-events` and readonly principals.
pub const EVENTS_ALL: &str = "svc.events.>";

/// `svc.agent.<id>.heartbeat`: the agent's periodic liveness report.
pub fn agent_heartbeat(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.heartbeat")
}

/// `svc.agent.<id>.cmd`: exec and state dispatch from the server to one agent.
pub fn agent_command(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.cmd")
}

/// `svc.agent.<id>.result`: the agent's answers to commands.
pub fn agent_result(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.result")
}

/// Every agent's JWT-SVID requests (the server's subscription).
pub const AGENTS_JWT: &str = "svc.agent.*.jwt";

/// `svc.agent.<id>.jwt`: an agent asks for its own JWT-SVID. The reply subject must be
/// under [`agent_jwt_reply_prefix`], not an `_INBOX`: operator keys may read `_INBOX.>`, and
/// only the agent itself may read its own subjects.
pub fn agent_jwt(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.jwt")
}

/// `svc.agent.<id>.jwt.reply.`: the prefix of the subjects the server answers JWT-SVID
/// requests on; the agent adds a random last token.
pub fn agent_jwt_reply_prefix(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.jwt.reply.")
}

/// Every agent's requests for chunks of stored state plans (the server's subscription).
pub const AGENTS_CONTENT: &str = "svc.agent.*.content";

/// `svc.agent.<id>.content`: an agent asks for a chunk of a state plan its command named.
pub fn agent_content(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.content")
}

/// `svc.agent.<id>.content.reply.`: where the server answers content requests (the agent adds
/// a random last token), private to the agent like [`agent_jwt_reply_prefix`].
pub fn agent_content_reply_prefix(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.content.reply.")
}

/// `svc.agent.<id>.>`: everything one agent may publish and subscribe to.
pub fn agent_all(agent_id: &str) -> String {
    format!("svc.agent.{agent_id}.>")
}

/// `svc.events.<type>`: live fan-out of one event type.
pub fn event(event_type: &str) -> String {
    format!("svc.events.{event_type}")
}

/// `svc.files.<cluster>.<op>`: the file service.
pub fn files(cluster: &str, operation: &str) -> String {
    format!("svc.files.{cluster}.{operation}")
}

/// Every file-service request: only the server subscribes here, and the broker stamps the
/// sender on each (`BrokerConfig::sender_subjects`).
pub const FILES_ALL: &str = "svc.files.>";
/// The server's subscription: `svc.files.<cluster>.<op>`.
pub const FILES_REQUESTS: &str = "svc.files.*.*";
/// The file service's operations that only read (readonly keys may publish these).
pub const FILES_READ_OPERATIONS: &[&str] = &["limits", "stat", "list", "get", "read"];
/// The operations that write (operator and admin).
pub const FILES_WRITE_OPERATIONS: &[&str] = &["put", "chunk", "commit", "delete"];

/// True for a subject that may carry wildcards (what SUB accepts): non-empty tokens, no
/// whitespace, and `>` only as the last token. `a*` is a literal token, as in nats-server.
pub fn is_valid_pattern(subject: &str) -> bool {
    if subject.is_empty() {
        return false;
    }
    let mut tokens = subject.split('.').peekable();
    while let Some(token) = tokens.next() {
        if token.is_empty() || token.bytes().any(is_whitespace) {
            return false;
        }
        if token == ">" && tokens.peek().is_some() {
            return false;
        }
    }
    true
}

/// True for a subject a message may be published to: a valid pattern without wildcard tokens.
pub fn is_valid_literal(subject: &str) -> bool {
    is_valid_pattern(subject) && !has_wildcard(subject)
}

/// True when some token is exactly `*` or `>`.
pub fn has_wildcard(subject: &str) -> bool {
    subject.split('.').any(|token| token == "*" || token == ">")
}

/// True when the literal `subject` matches `pattern`.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for pattern_token in pattern.split('.') {
        if pattern_token == ">" {
            return subject_tokens.next().is_some();
        }
        match subject_tokens.next() {
            None => return false,
            Some(token) if pattern_token != "*" && pattern_token != token => return false,
            Some(_) => {}
        }
    }
    subject_tokens.next().is_none()
}

/// True when every subject `inner` can match is also matched by `outer` (both may be
/// patterns). Permission checks on SUB use this: `svc.*` is inside `svc.>`, `>` is not.
pub fn pattern_is_subset(inner: &str, outer: &str) -> bool {
    let mut inner_tokens = inner.split('.');
    for outer_token in outer.split('.') {
        let Some(inner_token) = inner_tokens.next() else {
            return false;
        };
        match outer_token {
            ">" => return true,
            "*" if inner_token != ">" => {}
            literal if literal == inner_token && inner_token != "*" && inner_token != ">" => {}
            _ => return false,
        }
    }
    inner_tokens.next().is_none()
}

/// True when some subject could match both patterns. Used to filter deliveries on a
/// subscription that only partly overlaps a deny rule.
pub fn patterns_overlap(first: &str, second: &str) -> bool {
    let mut first_tokens = first.split('.');
    let mut second_tokens = second.split('.');
    loop {
        match (first_tokens.next(), second_tokens.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(a), Some(b)) if a == "*" || b == "*" || a == b => {}
            _ => return false,
        }
    }
}

fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | b'\x0c')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_matching() {
        let cases = [
            ("a.*", "a.b", true),
            ("a.*", "a.b.c", false),
            ("a.>", "a", false),
            ("a.>", "a.b.c", true),
            (">", "a", true),
            ("*", "a.b", false),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.b.d", false),
            ("a*", "ab", false),
            ("a*", "a*", true),
            ("a.b", "a.b", true),
            ("a.b", "a.b.c", false),
        ];
        for (pattern, subject, expected) in cases {
            assert_eq!(
                subject_matches(pattern, subject),
                expected,
                "{pattern} vs {subject}"
            );
        }
    }

    #[test]
    fn validation() {
        let cases = [
            ("a", true, true),
            ("a.b.c", true, true),
            ("a.*", true, false),
            ("a.>", true, false),
            ("a.>.b", false, false),
            ("a..b", false, false),
            (".a", false, false),
            ("a.", false, false),
            ("", false, false),
            ("a b", false, false),
            ("a\tb", false, false),
            ("a*", true, true),
            (">", true, false),
        ];
        for (subject, pattern_ok, literal_ok) in cases {
            assert_eq!(is_valid_pattern(subject), pattern_ok, "pattern {subject:?}");
            assert_eq!(is_valid_literal(subject), literal_ok, "literal {subject:?}");
        }
    }

    #[test]
    fn subsets() {
        let cases = [
            ("svc.*", "svc.>", true),
            ("svc.>", "svc.>", true),
            (">", "svc.>", false),
            ("svc", "svc.>", false),
            ("svc.a.b", "svc.*.b", true),
            ("svc.*.b", "svc.a.b", false),
            ("svc.>", "svc.*", false),
            ("*", "*", true),
            ("a", "a", true),
            ("a", "b", false),
        ];
        for (inner, outer, expected) in cases {
            assert_eq!(
                pattern_is_subset(inner, outer),
                expected,
                "{inner} in {outer}"
            );
        }
    }

    #[test]
    fn overlaps() {
        let cases = [
            ("svc.>", "svc.hidden.>", true),
            ("svc.*", "svc.hidden.>", false),
            ("svc.*", "svc.hidden", true),
            ("a.b", "a.c", false),
            ("a.*", "a", false),
            (">", "a.b", true),
        ];
        for (first, second, expected) in cases {
            assert_eq!(
                patterns_overlap(first, second),
                expected,
                "{first} ~ {second}"
            );
        }
    }

    #[test]
    fn svc_subject_names() {
        assert_eq!(agent_heartbeat("a1"), "svc.agent.a1.heartbeat");
        assert_eq!(agent_command("a1"), "svc.agent.a1.cmd");
        assert_eq!(agent_result("a1"), "svc.agent.a1.result");
        assert_eq!(agent_jwt("a1"), "svc.agent.a1.jwt");
        assert!(subject_matches(AGENTS_JWT, &agent_jwt("a1")));
        let reply = format!("{}xyz", agent_jwt_reply_prefix("a1"));
        assert!(!subject_matches(AGENTS_JWT, &reply));
        assert!(subject_matches(&agent_all("a1"), &reply));
        assert_eq!(event("agent.enrolled"), "svc.events.agent.enrolled");
        assert!(subject_matches(&agent_all("a1"), &agent_result("a1")));
        assert!(subject_matches(EVENTS_ALL, &event("x")));
    }
}
