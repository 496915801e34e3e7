//! Query strings of the REST routes: `name=value&...`, percent-decoded (`+` is a space), and
//! the checks every list route shares (known names only, numbers that parse).
//!
//! A bad query is the caller's mistake: `Error::Invalid` (422) naming the parameter.

use http::Request;

use crate::{percent, Error, Result};

/// The decoded pairs of a request's query, in order; a name may repeat (`type=a&type=b`).
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parses the query of `request`, refusing names outside `known`.
    pub fn of<B>(request: &Request<B>, known: &[&str]) -> Result<Query> {
        let raw = request.uri().query().unwrap_or("");
        let mut pairs = Vec::new();
        for part in raw.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').unwrap_or((part, ""));
            let name = decode(name)?;
            if !known.contains(&name.as_str()) {
                return Err(Error::Invalid(format!(
                    "unknown query parameter '{name}' (this route takes: {})",
                    known.join(", ")
                )));
            }
            pairs.push((name, decode(value)?));
        }
        Ok(Query { pairs })
    }

    /// The last value given for `name`, or "" when absent.
    pub fn text(&self, name: &str) -> &str {
        self.pairs
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }

    /// Every value of `name`, each split on commas (`type=a,b&type=c`), empty ones dropped.
    pub fn list(&self, name: &str) -> Vec<String> {
        self.pairs
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// `name` as a number, 0 when absent.
    pub fn number(&self, name: &str) -> Result<u64> {
        match self.text(name) {
            "" => Ok(0),
            text => text.parse().map_err(|_| {
                Error::Invalid(format!("query parameter {name}='{text}' is not a number"))
            }),
        }
    }

    /// `name` as a flag: absent, `false` or `0` is false; `true`, `1` or empty-valued is true.
    pub fn flag(&self, name: &str) -> Result<bool> {
        if !self.pairs.iter().any(|(n, _)| n == name) {
            return Ok(false);
        }
        match self.text(name) {
            "" | "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(Error::Invalid(format!(
                "query parameter {name}='{other}' is not true or false"
            ))),
        }
    }
}

/// Percent-decoding (RFC 3986) with `+` as a space (HTML forms); the result must be UTF-8.
/// (`+` is replaced before decoding, so `%2B` stays a plus.)
fn decode(text: &str) -> Result<String> {
    let bad = || Error::Invalid(format!("query '{text}' is not percent-encoded UTF-8"));
    let bytes = percent::decode(&text.replace('+', " ")).map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding() {
        let cases = [
            ("a", Some("a")),
            ("a+b", Some("a b")),
            ("role%3Dweb", Some("role=web")),
            ("%E2%9C%93", Some("✓")),
            ("%", None),
            ("%zz", None),
            ("%ff", None),
        ];
        for (input, expected) in cases {
            assert_eq!(decode(input).ok().as_deref(), expected, "{input}");
        }
    }

    #[test]
    fn lists_numbers_and_unknown_names() {
        let request = Request::get("/x?type=a,b&type=c&limit=5&follow=false")
            .body(())
            .unwrap();
        let query = Query::of(&request, &["type", "limit", "follow"]).unwrap();
        assert_eq!(query.list("type"), ["a", "b", "c"]);
        assert_eq!(query.number("limit").unwrap(), 5);
        assert!(!query.flag("follow").unwrap());
        assert!(Query::of(&request, &["type"]).is_err());
    }
}
