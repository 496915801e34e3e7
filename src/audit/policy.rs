//! Policies in audit mode (contract §9): YAML files, evaluated on every audited action; the
//! decision is recorded and never blocks.
//!
//! Matching: `actions` are globs on the dotted action (`secret.*`); `principals` are `*`,
//! `role:NAME` or `user:NAME`; `resources` are globs on `TYPE:ID` (`secret:prod/*`).
//! A matching deny wins over a matching allow; with no match there is no decision.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::auth::Principal;

/// How serious an audited action is, least to most (wire names lowercase).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    #[default]
    Medium,
    High,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 4] = [
        Severity::Low,
        Severity::Medium,
        Severity::High,
        Severity::Critical,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Severity> {
        Severity::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub id: String,
    /// A policy file's severity; anything but the four names is refused when it loads.
    #[serde(default)]
    pub severity: Severity,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub policy_set: String,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Allow,
    Deny,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub effect: Effect,
    pub actions: Vec<String>,
    #[serde(default = "everything")]
    pub principals: Vec<String>,
    #[serde(default = "everything")]
    pub resources: Vec<String>,
}

fn everything() -> Vec<String> {
    vec!["*".into()]
}

/// What the policies say about one action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub effect: Effect,
    pub policy_id: String,
    pub severity: Severity,
}

/// A loaded policy file, with the path it came from.
#[derive(Clone, Debug)]
pub struct LoadedPolicy {
    pub policy: Policy,
    pub source: String,
    pub path: String,
}

#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    pub policies: Vec<LoadedPolicy>,
}

pub const SEVERITIES: &[&str] = &["low", "medium", "high", "critical"];

/// Parses and checks one policy file's text; errors name the line where YAML can tell.
pub fn parse(text: &str) -> Result<Policy, String> {
    let policy: Policy = crate::config::parse_yaml(text)?;
    if policy.id.trim().is_empty() {
        return Err("id must not be empty".into());
    }
    if policy.rules.is_empty() {
        return Err("a policy needs at least one rule".into());
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        if rule.actions.is_empty() {
            return Err(format!("rules[{i}]: actions must not be empty"));
        }
        for principal in &rule.principals {
            let ok = principal == "*"
                || principal.starts_with("role:")
                || principal.starts_with("user:");
            if !ok {
                return Err(format!(
                    "rules[{i}]: principal '{principal}' must be '*', 'role:NAME' or 'user:NAME'"
                ));
            }
        }
    }
    Ok(policy)
}

/// Loads every `*.yaml`/`*.yml` file in `dir` (a missing dir is an empty set). Returns the
/// set and one message per file that failed, which is skipped.
pub fn load_dir(dir: &Path) -> (PolicySet, Vec<String>) {
    let mut set = PolicySet::default();
    let mut problems = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (set, problems);
    };
    let mut paths: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    paths.sort();
    for path in paths {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        match parse(&text) {
            Ok(policy) if set.policies.iter().any(|p| p.policy.id == policy.id) => problems.push(
                format!("{}: duplicate policy id '{}'", path.display(), policy.id),
            ),
            Ok(policy) => set.policies.push(LoadedPolicy {
                policy,
                source: text,
                path: path.display().to_string(),
            }),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    (set, problems)
}

/// `*` matches any run of characters (including dots); everything else is literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn principal_matches(pattern: &str, principal: &Principal) -> bool {
    if pattern == "*" {
        return true;
    }
    if let Some(role) = pattern.strip_prefix("role:") {
        return role == principal.role.as_str();
    }
    if let Some(user) = pattern.strip_prefix("user:") {
        return glob_match(user, &principal.name) || user == principal.id;
    }
    false
}

impl PolicySet {
    /// Evaluates one action against every policy (audit mode: the caller only records it).
    pub fn evaluate(
        &self,
        action: &str,
        principal: &Principal,
        resource: &str,
    ) -> Option<Decision> {
        let mut allow = None;
        for loaded in &self.policies {
            let policy = &loaded.policy;
            for rule in &policy.rules {
                let matches = rule.actions.iter().any(|a| glob_match(a, action))
                    && rule
                        .principals
                        .iter()
                        .any(|p| principal_matches(p, principal))
                    && rule.resources.iter().any(|r| glob_match(r, resource));
                if !matches {
                    continue;
                }
                let decision = Decision {
                    effect: rule.effect,
                    policy_id: policy.id.clone(),
                    severity: policy.severity,
                };
                if rule.effect == Effect::Deny {
                    return Some(decision);
                }
                allow.get_or_insert(decision);
            }
        }
        allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    #[test]
    fn globs() {
        let cases = [
            ("secret.*", "secret.read", true),
            ("secret.*", "secretx", false),
            ("*", "", true),
            ("secret:prod/*", "secret:prod/db", true),
            ("secret:prod/*", "secret:staging/db", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact", "exact", true),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(glob_match(pattern, text), expected, "{pattern} vs {text}");
        }
    }

    #[test]
    fn deny_wins_and_audit_fields() {
        let text = "id: no-prod-reads\nseverity: high\nrules:\n  - effect: deny\n    actions: [\"secret.read\"]\n    principals: [\"role:readonly\"]\n    resources: [\"secret:prod/*\"]\n";
        let deny = parse(text).unwrap();
        let allow =
            parse("id: ops\nrules:\n  - effect: allow\n    actions: [\"secret.*\"]\n").unwrap();
        let set = PolicySet {
            policies: [allow, deny]
                .into_iter()
                .map(|policy| LoadedPolicy {
                    policy,
                    source: String::new(),
                    path: String::new(),
                })
                .collect(),
        };
        let reader = Principal {
            id: "k1".into(),
            name: "viewer".into(),
            role: Role::Readonly,
        };
        let decision = set
            .evaluate("secret.read", &reader, "secret:prod/db")
            .unwrap();
        assert_eq!(
            (decision.effect, decision.policy_id.as_str()),
            (Effect::Deny, "no-prod-reads")
        );
        let decision = set
            .evaluate("secret.read", &reader, "secret:dev/db")
            .unwrap();
        assert_eq!(
            (decision.effect, decision.policy_id.as_str()),
            (Effect::Allow, "ops")
        );
        assert_eq!(set.evaluate("apikey.create", &reader, "apikey:x"), None);
    }

    #[test]
    fn bad_files_are_explained() {
        let cases = [
            (
                "id: x\nrules:\n  - effect: maybe\n    actions: [a]\n",
                "line 3",
            ),
            (
                "id: x\nseverity: huge\nrules:\n  - effect: deny\n    actions: [a]\n",
                "severity: unknown variant `huge`, expected one of `low`, `medium`, `high`, `critical` at line 2",
            ),
            ("id: x\nrules: []\n", "at least one rule"),
            (
                "id: x\nrules:\n  - effect: deny\n    actions: [a]\n    principals: [bob]\n",
                "principal 'bob'",
            ),
            ("id: x\nbogus: 1\nrules: []\n", "unknown field `bogus`"),
        ];
        for (text, expected) in cases {
            let error = parse(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}

/// A policy as `svc-policy list|show` present it; for a policy set, `source_yaml` lists the
/// member ids, one a line.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyView {
    pub id: String,
    pub severity: String,
    pub source_yaml: String,
    pub policy_set: String,
}

impl From<&LoadedPolicy> for PolicyView {
    fn from(loaded: &LoadedPolicy) -> Self {
        PolicyView {
            id: loaded.policy.id.clone(),
            severity: loaded.policy.severity.to_string(),
            source_yaml: loaded.source.clone(),
            policy_set: loaded.policy.policy_set.clone(),
        }
    }
}

fn set_view(set: &str, members: Vec<String>) -> PolicyView {
    PolicyView {
        id: set.to_string(),
        severity: String::new(),
        source_yaml: members.join("\n"),
        policy_set: set.to_string(),
    }
}

/// `svc-policy list [--policy-sets]` (any key): the policies in force, or one entry per
/// policy set.
pub fn list(
    domain: &crate::domain::Domain,
    principal: &crate::auth::Principal,
    sets: bool,
) -> crate::Result<Vec<PolicyView>> {
    principal.require(crate::auth::Role::Readonly)?;
    let loaded = domain.auditor.policies();
    if !sets {
        return Ok(loaded.policies.iter().map(PolicyView::from).collect());
    }
    let mut names: Vec<&str> = loaded
        .policies
        .iter()
        .map(|p| p.policy.policy_set.as_str())
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    names.dedup();
    Ok(names
        .into_iter()
        .map(|set| set_view(set, members(&loaded, set)))
        .collect())
}

fn members(loaded: &PolicySet, set: &str) -> Vec<String> {
    loaded
        .policies
        .iter()
        .filter(|p| p.policy.policy_set == set)
        .map(|p| p.policy.id.clone())
        .collect()
}

/// What the API refuses to do to a policy: policies are files in `policy_dir`, loaded at
/// start and on SIGHUP, so `svc-policy create|update|delete` are refused by that rule
/// (`Unimplemented`, contract §9) and the refusal is audited (`policy.create`, ...) as
/// `denied`, as every refused change is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Create,
    Update,
    Delete,
}

/// Refuses `change` to policy `id`: audits the refusal and returns it.
pub async fn refuse_change(
    domain: &crate::domain::Domain,
    principal: &crate::auth::Principal,
    change: Change,
    id: &str,
) -> crate::Error {
    let (action, verb) = match change {
        Change::Create => ("policy.create", "create"),
        Change::Update => ("policy.update", "update"),
        Change::Delete => ("policy.delete", "delete"),
    };
    let refusal = crate::Error::Unimplemented(format!(
        "policy {verb} over the API (policies are files in policy_dir)"
    ));
    let action = super::Action::new(action, "policy", id);
    domain
        .auditor
        .record_failure(principal, action, &refusal)
        .await;
    refusal
}

/// `svc-policy show ID [--policy-set]` (any key).
pub fn get(
    domain: &crate::domain::Domain,
    principal: &crate::auth::Principal,
    id: &str,
    set: bool,
) -> crate::Result<PolicyView> {
    principal.require(crate::auth::Role::Readonly)?;
    let loaded = domain.auditor.policies();
    if set {
        let members = members(&loaded, id);
        if members.is_empty() {
            return Err(crate::Error::NotFound(format!(
                "policy set '{id}' not found"
            )));
        }
        return Ok(set_view(id, members));
    }
    loaded
        .policies
        .iter()
        .find(|p| p.policy.id == id)
        .map(PolicyView::from)
        .ok_or_else(|| crate::Error::NotFound(format!("policy '{id}' not found")))
}
