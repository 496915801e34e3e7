//! Versions (MAJOR.MINOR.PATCH, no pre-release tags) and version ranges (`requires:`), for
//! blueprints, modules and the store's catalogue alike. Small enough to keep here rather than
//! take the semver crate; a leaf, so the store and modules need not reach into `blueprint`.

use std::cmp::Ordering;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Version {
    pub fn parse(text: &str) -> Result<Version, String> {
        let parts: Vec<&str> = text.trim().split('.').collect();
        let number = |part: &str| {
            part.parse::<u64>()
                .ok()
                .filter(|_| !part.is_empty() && (part == "0" || !part.starts_with('0')))
        };
        match parts.as_slice() {
            [major, minor, patch] => match (number(major), number(minor), number(patch)) {
                (Some(major), Some(minor), Some(patch)) => Ok(Version {
                    major,
                    minor,
                    patch,
                }),
                _ => Err(format!("'{text}' is not MAJOR.MINOR.PATCH")),
            },
            _ => Err(format!("'{text}' is not MAJOR.MINOR.PATCH")),
        }
    }

    /// Like `parse`, but `1` and `1.2` stand for `1.0.0` and `1.2.0` (ranges only).
    fn parse_partial(text: &str) -> Result<Version, String> {
        let dots = text.matches('.').count();
        let full = match dots {
            0 => format!("{text}.0.0"),
            1 => format!("{text}.0"),
            _ => text.to_string(),
        };
        Version::parse(&full)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Compares two version strings; unparsable ones sort first.
pub fn compare(a: &str, b: &str) -> Ordering {
    Version::parse(a).ok().cmp(&Version::parse(b).ok())
}

/// Comma-separated comparators, all of which must hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Range {
    comparators: Vec<(Op, Version)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    Gt,
    Ge,
    Lt,
    Le,
    Caret,
}

impl Range {
    pub fn parse(text: &str) -> Result<Range, String> {
        let mut comparators = Vec::new();
        for part in text.split(',').map(str::trim) {
            if part == "*" {
                continue;
            }
            let (op, rest) = if let Some(rest) = part.strip_prefix(">=") {
                (Op::Ge, rest)
            } else if let Some(rest) = part.strip_prefix("<=") {
                (Op::Le, rest)
            } else if let Some(rest) = part.strip_prefix('>') {
                (Op::Gt, rest)
            } else if let Some(rest) = part.strip_prefix('<') {
                (Op::Lt, rest)
            } else if let Some(rest) = part.strip_prefix('=') {
                (Op::Eq, rest)
            } else if let Some(rest) = part.strip_prefix('^') {
                (Op::Caret, rest)
            } else {
                (Op::Eq, part)
            };
            let version =
                Version::parse_partial(rest.trim()).map_err(|e| format!("range '{text}': {e}"))?;
            comparators.push((op, version));
        }
        Ok(Range { comparators })
    }

    pub fn matches(&self, version: &Version) -> bool {
        self.comparators.iter().all(|(op, bound)| match op {
            Op::Eq => version == bound,
            Op::Gt => version > bound,
            Op::Ge => version >= bound,
            Op::Lt => version < bound,
            Op::Le => version <= bound,
            Op::Caret => {
                version >= bound
                    && if bound.major > 0 {
                        version.major == bound.major
                    } else {
                        version.major == 0 && version.minor == bound.minor
                    }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let cases = [
            ("*", "0.0.1", true),
            (">=1.0.0, <2.0.0", "1.9.9", true),
            (">=1.0.0, <2.0.0", "2.0.0", false),
            ("^1.2", "1.3.0", true),
            ("^1.2", "2.0.0", false),
            ("^0.2", "0.3.0", false),
            ("=1.2.3", "1.2.3", true),
            ("1.2.3", "1.2.4", false),
            (">1", "1.0.1", true),
        ];
        for (range, version, expected) in cases {
            let range = Range::parse(range).unwrap();
            let version = Version::parse(version).unwrap();
            assert_eq!(range.matches(&version), expected, "{range:?} {version}");
        }
        for bad in ["1.2.x", "01.0.0", "1.2.3.4", ""] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(compare("1.10.0", "1.9.0"), Ordering::Greater);
    }
}
