//! Target selectors (contract §10): `*`, a glob on agent ids (`web-*`), a comma list of ids
//! or globs (`web-01,db-*`), or `key=value` pairs (`role=web,os_family=debian`, every pair
//! must match) on labels and facts.
//!
//! Which a key names: one of the fact names (`crate::facts::NAMES`) is that fact;
//! `fact.NAME` is a fact explicitly and `label.NAME` a label explicitly (needed only for a
//! label named like a fact); any other key is a label, as before facts existed. A list fact
//! (`ip_addresses`) matches when one of its elements equals the value.
//!
//! Labels are the server's word (given at enrolment or by an operator); facts are what the
//! agent says about itself. A selector chooses where a command goes; it is never an
//! authorization decision, and one on facts must never become one.

use std::collections::BTreeMap;

use crate::facts::{self, Facts};
use crate::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// Any of these id globs matches.
    Ids(Vec<String>),
    /// Every label must be present with its value, and every fact must have its value.
    Pairs {
        labels: BTreeMap<String, String>,
        facts: BTreeMap<String, String>,
    },
}

impl Selector {
    /// An empty selector means every agent.
    pub fn parse(text: &str) -> Result<Selector> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Selector::Ids(vec!["*".into()]));
        }
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(Error::Invalid(format!(
                "invalid target '{text}': empty item in the list"
            )));
        }
        if parts.iter().any(|p| p.contains('=')) {
            return parse_pairs(text).map_err(|e| {
                Error::Invalid(format!(
                    "invalid target '{text}': {e} (labels and ids cannot be mixed)"
                ))
            });
        }
        for part in &parts {
            let is_valid = part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'*' | b'?'));
            if !is_valid {
                return Err(Error::Invalid(format!(
                    "invalid target '{text}': '{part}' is not an agent id or glob (letters, digits, '-', '_', '*', '?')"
                )));
            }
        }
        Ok(Selector::Ids(parts.into_iter().map(String::from).collect()))
    }

    /// Whether the selector looks at facts (callers that keep them as text parse them only
    /// then).
    pub fn uses_facts(&self) -> bool {
        matches!(self, Selector::Pairs { facts, .. } if !facts.is_empty())
    }

    pub fn matches(&self, id: &str, labels: &BTreeMap<String, String>, facts: &Facts) -> bool {
        match self {
            Selector::Ids(globs) => globs.iter().any(|glob| glob_matches(glob, id)),
            Selector::Pairs {
                labels: wanted_labels,
                facts: wanted_facts,
            } => {
                wanted_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
                    && wanted_facts
                        .iter()
                        .all(|(k, v)| facts.get(k).is_some_and(|fact| facts::has_value(fact, v)))
            }
        }
    }
}

/// `k=v,k2=v2` of a selector, each key sorted to labels or facts (the rule is in the file's
/// opening comment). A later pair for the same key replaces an earlier one.
fn parse_pairs(text: &str) -> Result<Selector, String> {
    let mut labels = BTreeMap::new();
    let mut facts = BTreeMap::new();
    for (key, value) in pairs(text)? {
        if let Some(name) = key.strip_prefix("label.") {
            if name.is_empty() {
                return Err(format!("'{key}' names no label"));
            }
            labels.insert(name.to_string(), value);
        } else if let Some(name) = key.strip_prefix("fact.") {
            if name.is_empty() {
                return Err(format!("'{key}' names no fact"));
            }
            facts.insert(name.to_string(), value);
        } else if facts::is_fact_name(&key) {
            facts.insert(key, value);
        } else {
            labels.insert(key, value);
        }
    }
    Ok(Selector::Pairs { labels, facts })
}

/// Labels as `k=v,k2=v2` (items trimmed, empty items skipped): enrolment.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    Ok(pairs(text)?.into_iter().collect())
}

/// `k=v,k2=v2` in the order written (items trimmed, empty items skipped).
fn pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                pairs.push((key.trim().to_string(), value.trim().to_string()));
            }
            _ => return Err(format!("'{pair}' is not key=value")),
        }
    }
    Ok(pairs)
}

/// Checks one label as `svcctl agent label` sets it: a key that is not empty and holds no
/// `=`, `,` or whitespace, and a value without `,` (so `--target k=v` can select it).
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    if key.is_empty() || key.contains(['=', ',']) || key.contains(char::is_whitespace) {
        return Err(format!(
            "invalid label key '{key}' (not empty; no '=', ',' or spaces)"
        ));
    }
    if value.contains(',') || value.trim() != value {
        return Err(format!(
            "invalid value for label '{key}': '{value}' (no ',' and no surrounding spaces)"
        ));
    }
    Ok(())
}

/// `*` matches any run of characters, `?` one character; everything else literally.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let (glob, text) = (glob.as_bytes(), text.as_bytes());
    let (mut g, mut t) = (0, 0);
    // Where the last `*` was, and the text position it currently stands for.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some(b'*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((star_g, star_t)) => {
                    g = star_g + 1;
                    t = star_t + 1;
                    star = Some((star_g, star_t + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn globs() {
        for (glob, text, expected) in [
            ("*", "web-01", true),
            ("web-*", "web-01", true),
            ("web-*", "db-01", false),
            ("*-01", "web-01", true),
            ("w?b-0*", "web-01", true),
            ("web-01", "web-01", true),
            ("web-01", "web-011", false),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbc", false),
            ("", "", true),
        ] {
            assert_eq!(glob_matches(glob, text), expected, "{glob} {text}");
        }
    }

    #[test]
    fn selectors() {
        let none = Facts::new();
        let web = labels(&[("role", "web"), ("env", "prod")]);
        let all = Selector::parse("").unwrap();
        assert!(all.matches("anything", &BTreeMap::new(), &none));
        let list = Selector::parse("web-01, db-*").unwrap();
        assert!(list.matches("db-7", &web, &none) && list.matches("web-01", &web, &none));
        assert!(!list.matches("web-02", &web, &none));
        let by_label = Selector::parse("role=web,env=prod").unwrap();
        assert!(by_label.matches("x", &web, &none));
        assert!(!by_label.matches("x", &labels(&[("role", "web")]), &none));
        assert!(!by_label.uses_facts());
        for bad in [
            "web-01,,x",
            "role=web,db-1",
            "a.b",
            "web>",
            "=x",
            "label.=x",
            "fact.=x",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_name_labels_or_facts() {
        let pairs = |list: &[(&str, &str)]| labels(list);
        let cases = [
            ("role=web", pairs(&[("role", "web")]), pairs(&[])),
            (
                "os_family=debian",
                pairs(&[]),
                pairs(&[("os_family", "debian")]),
            ),
            (
                "os_family=debian, arch=x86_64, role=web",
                pairs(&[("role", "web")]),
                pairs(&[("os_family", "debian"), ("arch", "x86_64")]),
            ),
            ("label.os=custom", pairs(&[("os", "custom")]), pairs(&[])),
            ("fact.rack=r1", pairs(&[]), pairs(&[("rack", "r1")])),
            ("fact.os=debian", pairs(&[]), pairs(&[("os", "debian")])),
            // A later pair for the same key wins, whichever way it was written.
            ("os=a,fact.os=b", pairs(&[]), pairs(&[("os", "b")])),
            ("role=a,role=b", pairs(&[("role", "b")]), pairs(&[])),
            ("label.x.y=1", pairs(&[("x.y", "1")]), pairs(&[])),
        ];
        for (text, labels, facts) in cases {
            assert_eq!(
                Selector::parse(text).unwrap(),
                Selector::Pairs { labels, facts },
                "{text}"
            );
        }
    }

    #[test]
    fn facts_match() {
        let facts: Facts = serde_json::from_value(serde_json::json!({
            "os": "debian", "os_family": "debian", "arch": "x86_64", "cpus": 4,
            "ip_addresses": ["10.0.0.5", "2001:db8::5"],
        }))
        .unwrap();
        let labelled = labels(&[("role", "web"), ("os", "custom")]);
        let cases = [
            ("os_family=debian", true),
            ("os_family=debian,arch=x86_64", true),
            ("os_family=debian,arch=aarch64", false),
            ("os_family=redhat", false),
            ("cpus=4", true),
            ("cpus=8", false),
            ("ip_addresses=10.0.0.5", true),
            ("ip_addresses=2001:db8::5", true),
            ("ip_addresses=10.0.0.6", false),
            ("memory_mb=1024", false),
            ("os=debian,role=web", true),
            ("os=custom", false),
            ("label.os=custom", true),
            ("label.os=debian", false),
            ("fact.os=debian", true),
            ("fact.rack=r1", false),
            ("role=web", true),
        ];
        for (text, expected) in cases {
            let selector = Selector::parse(text).unwrap();
            assert_eq!(selector.matches("a", &labelled, &facts), expected, "{text}");
        }
        // An agent that reported no facts matches no selector on them.
        let on_facts = Selector::parse("os_family=debian").unwrap();
        assert!(on_facts.uses_facts());
        assert!(!on_facts.matches("a", &labelled, &Facts::new()));
    }
}
