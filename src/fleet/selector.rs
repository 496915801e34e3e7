//! Target selectors (contract §10): `*`, a glob on agent ids (`web-*`), a comma list of ids
//! or globs (`web-01,db-*`), or labels (`role=web,env=prod`, every pair must match).

use std::collections::BTreeMap;

use crate::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// Any of these id globs matches.
    Ids(Vec<String>),
    /// Every label must be present with this value.
    Labels(BTreeMap<String, String>),
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
            return parse_labels(text).map(Selector::Labels).map_err(|e| {
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

    pub fn matches(&self, id: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Ids(globs) => globs.iter().any(|glob| glob_matches(glob, id)),
            Selector::Labels(wanted) => wanted.iter().all(|(k, v)| labels.get(k) == Some(v)),
        }
    }
}

/// Labels as `k=v,k2=v2` (items trimmed, empty items skipped): enrolment and selectors.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                labels.insert(key.trim().to_string(), value.trim().to_string());
            }
            _ => return Err(format!("'{pair}' is not key=value")),
        }
    }
    Ok(labels)
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
        let web = labels(&[("role", "web"), ("env", "prod")]);
        let all = Selector::parse("").unwrap();
        assert!(all.matches("anything", &BTreeMap::new()));
        let list = Selector::parse("web-01, db-*").unwrap();
        assert!(list.matches("db-7", &web) && list.matches("web-01", &web));
        assert!(!list.matches("web-02", &web));
        let by_label = Selector::parse("role=web,env=prod").unwrap();
        assert!(by_label.matches("x", &web));
        assert!(!by_label.matches("x", &labels(&[("role", "web")])));
        for bad in ["web-01,,x", "role=web,db-1", "a.b", "web>", "=x"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }
}
