//! `line`: one line of a text file, or a block of lines between two marker lines, present or
//! absent; every other line of the file stays as it is.
//!
//! Line form: without `match`, the line is there when some line equals it, and is appended
//! otherwise. With `match`, every line the pattern matches is replaced by the line, in place:
//! a setting written twice then says the same thing twice, whichever copy the program reads
//! (sshd takes the first, most others the last). With no match the line is appended unless it
//! is there already, so a line its own pattern does not match is still idempotent. Absent
//! removes the lines equal to `line` and those `match` matches.
//!
//! Block form: the lines between `BEGIN` and `END` markers are replaced as a whole; a missing
//! block is appended. A BEGIN without its END (or the reverse) is an error: guessing where the
//! block ends could delete the operator's lines.
//!
//! The file is read and written as `text` does: regular files only (no links followed),
//! written atomically, mode and owner kept. A missing file is an error unless `create: true`.

use std::path::Path;

use regex::Regex;

use super::{require_parent, text, Planned, Report};
use crate::state::{validate, LineResource, Mode, Presence};

/// Lines named in a report before the rest are only counted.
const LINES_SHOWN: usize = 5;

pub(super) fn run(
    resource: &LineResource,
    mode: Mode,
    planned: &Planned,
) -> Result<Report, String> {
    let path = Path::new(&resource.path);
    let is_present = resource.state != Some(Presence::Absent);
    let found = text::read(path)?;
    if found.is_none() {
        if !is_present {
            return Ok(Report::unchanged("already absent"));
        }
        if resource.create != Some(true) {
            return Err(format!(
                "{} does not exist (set create: true to create it)",
                path.display()
            ));
        }
        require_parent(path, planned)?;
    }
    let content = found.as_ref().map_or("", |found| found.text.as_str());
    let lines = text::split_lines(content);
    let is_block = resource.block.is_some() || resource.marker.is_some();
    let edit = if is_block {
        edit_block(&lines, resource, is_present)?
    } else {
        edit_line(&lines, resource, is_present)?
    };
    if edit.changes.is_empty() {
        return Ok(Report::unchanged(if is_present {
            "already in state"
        } else {
            "already absent"
        }));
    }
    let mut detail = describe(&edit.changes, mode);
    if found.is_none() {
        let verb = if mode == Mode::Check {
            "would create the file"
        } else {
            "created the file"
        };
        detail = format!("{verb}; {detail}");
    }
    if mode == Mode::Apply {
        let new_lines: Vec<&str> = edit.lines.iter().map(String::as_str).collect();
        text::write(
            path,
            &text::join_lines(&new_lines),
            found.as_ref().map(|found| &found.metadata),
        )?;
    }
    Ok(Report::changed(detail))
}

/// The file's lines after an edit, and what the edit changed.
struct Edit {
    lines: Vec<String>,
    changes: Vec<Change>,
}

/// One change, with 1-based line numbers of the file as it was.
#[derive(Debug, PartialEq)]
enum Change {
    Append(String),
    Replace {
        number: usize,
        old: String,
        new: String,
    },
    Remove {
        number: usize,
        old: String,
    },
    AppendBlock(usize),
    ReplaceBlock {
        number: usize,
        old: usize,
        new: usize,
    },
    RemoveBlock {
        number: usize,
        lines: usize,
    },
}

fn edit_line(lines: &[&str], resource: &LineResource, is_present: bool) -> Result<Edit, String> {
    let pattern = resource
        .pattern
        .as_deref()
        .map(Regex::new)
        .transpose()
        .map_err(|error| format!("match is not a valid regex: {error}"))?;
    let wanted = resource.line.as_deref();
    let matches = |text: &str| {
        pattern
            .as_ref()
            .is_some_and(|pattern| pattern.is_match(text))
    };
    let mut output = Vec::with_capacity(lines.len() + 1);
    let mut changes = Vec::new();
    let mut is_matched = false;
    for (index, &current) in lines.iter().enumerate() {
        let number = index + 1;
        if is_present {
            match wanted {
                Some(wanted) if matches(current) => {
                    is_matched = true;
                    if current != wanted {
                        changes.push(Change::Replace {
                            number,
                            old: current.to_string(),
                            new: wanted.to_string(),
                        });
                    }
                    output.push(wanted.to_string());
                }
                _ => output.push(current.to_string()),
            }
        } else if matches(current) || Some(current) == wanted {
            changes.push(Change::Remove {
                number,
                old: current.to_string(),
            });
        } else {
            output.push(current.to_string());
        }
    }
    if let (true, Some(wanted)) = (is_present, wanted) {
        if !is_matched && !lines.contains(&wanted) {
            output.push(wanted.to_string());
            changes.push(Change::Append(wanted.to_string()));
        }
    }
    Ok(Edit {
        lines: output,
        changes,
    })
}

fn edit_block(lines: &[&str], resource: &LineResource, is_present: bool) -> Result<Edit, String> {
    let (begin, end) = validate::block_markers(resource.marker.as_deref());
    let position = |marker: &str, from: usize| {
        lines[from..]
            .iter()
            .position(|line| line.trim_end() == marker)
            .map(|at| at + from)
    };
    let found = match (position(&begin, 0), position(&end, 0)) {
        (None, None) => None,
        (Some(first), _) => match position(&end, first + 1) {
            Some(last) => Some((first, last)),
            None => {
                return Err(format!(
                    "line {}: '{begin}' has no '{end}' after it; fix the file by hand",
                    first + 1
                ))
            }
        },
        (None, Some(last)) => {
            return Err(format!(
                "line {}: '{end}' has no '{begin}' before it; fix the file by hand",
                last + 1
            ))
        }
    };
    let wanted: Vec<&str> = resource
        .block
        .as_deref()
        .map(text::split_lines)
        .unwrap_or_default();
    let mut output: Vec<String> = Vec::with_capacity(lines.len() + wanted.len() + 2);
    let mut changes = Vec::new();
    let block_lines = || {
        std::iter::once(begin.as_str())
            .chain(wanted.iter().copied())
            .chain(std::iter::once(end.as_str()))
            .map(str::to_string)
    };
    match found {
        None if is_present => {
            output.extend(lines.iter().map(|line| line.to_string()));
            output.extend(block_lines());
            changes.push(Change::AppendBlock(wanted.len()));
        }
        None => output.extend(lines.iter().map(|line| line.to_string())),
        Some((first, last)) => {
            output.extend(lines[..first].iter().map(|line| line.to_string()));
            let inside = &lines[first + 1..last];
            if is_present {
                output.extend(block_lines());
                if inside != wanted.as_slice() {
                    changes.push(Change::ReplaceBlock {
                        number: first + 1,
                        old: inside.len(),
                        new: wanted.len(),
                    });
                }
            } else {
                changes.push(Change::RemoveBlock {
                    number: first + 1,
                    lines: inside.len(),
                });
            }
            output.extend(lines[last + 1..].iter().map(|line| line.to_string()));
        }
    }
    Ok(Edit {
        lines: output,
        changes,
    })
}

/// "line 3: 'a' -> 'b'; would remove line 7 'c'; would append 'd'", with at most LINES_SHOWN
/// lines named.
fn describe(changes: &[Change], mode: Mode) -> String {
    let is_check = mode == Mode::Check;
    let pick = |would: &'static str, done: &'static str| if is_check { would } else { done };
    let plural = |count: usize| if count == 1 { "line" } else { "lines" };
    let mut parts: Vec<String> = changes
        .iter()
        .take(LINES_SHOWN)
        .map(|change| match change {
            Change::Append(line) => format!("{} '{line}'", pick("would append", "appended")),
            Change::Replace { number, old, new } => format!("line {number}: '{old}' -> '{new}'"),
            Change::Remove { number, old } => {
                format!("{} line {number} '{old}'", pick("would remove", "removed"))
            }
            Change::AppendBlock(count) => format!(
                "{} block ({count} {})",
                pick("would append", "appended"),
                plural(*count)
            ),
            Change::ReplaceBlock { number, old, new } => {
                format!("block at line {number}: {old} -> {new} {}", plural(*new))
            }
            Change::RemoveBlock { number, lines } => format!(
                "{} block at line {number} ({lines} {})",
                pick("would remove", "removed"),
                plural(*lines)
            ),
        })
        .collect();
    if changes.len() > LINES_SHOWN {
        parts.push(format!("and {} more", changes.len() - LINES_SHOWN));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The provider with nothing planned by earlier resources.
    fn run(resource: &LineResource, mode: Mode) -> Result<Report, String> {
        super::run(resource, mode, &Planned::default())
    }
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn line_form(path: &Path, line: Option<&str>, pattern: Option<&str>) -> LineResource {
        LineResource {
            path: path.to_str().unwrap().into(),
            line: line.map(str::to_string),
            pattern: pattern.map(str::to_string),
            ..LineResource::default()
        }
    }

    fn absent(resource: LineResource) -> LineResource {
        LineResource {
            state: Some(Presence::Absent),
            ..resource
        }
    }

    /// Runs `resource` on a file holding `before`: check first (which must not write), then
    /// apply; returns the apply's detail and the file after, and checks that a second apply
    /// changes nothing.
    fn apply_to(before: &str, resource: impl Fn(&Path) -> LineResource) -> (String, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        fs::write(&path, before).unwrap();
        let resource = resource(&path);
        let checked = run(&resource, Mode::Check).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), before, "check wrote");
        let applied = run(&resource, Mode::Apply).unwrap();
        assert_eq!(checked.changed, applied.changed);
        let after = fs::read_to_string(&path).unwrap();
        let again = run(&resource, Mode::Apply).unwrap();
        assert!(!again.changed, "second apply: {}", again.detail);
        assert_eq!(fs::read_to_string(&path).unwrap(), after);
        // Only the file: no temporary files left.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        (applied.detail, after)
    }

    #[test]
    fn the_line_form() {
        let sshd = "Port 22\n#PermitRootLogin yes\nX11Forwarding no\n";
        let cases: Vec<(&str, LineResource, &str, &str)> = vec![
            (
                sshd,
                LineResource {
                    line: Some("PermitRootLogin no".into()),
                    pattern: Some("^#?PermitRootLogin".into()),
                    ..LineResource::default()
                },
                "line 2: '#PermitRootLogin yes' -> 'PermitRootLogin no'",
                "Port 22\nPermitRootLogin no\nX11Forwarding no\n",
            ),
            (
                sshd,
                LineResource {
                    line: Some("UseDNS no".into()),
                    pattern: Some("^#?UseDNS".into()),
                    ..LineResource::default()
                },
                "appended 'UseDNS no'",
                "Port 22\n#PermitRootLogin yes\nX11Forwarding no\nUseDNS no\n",
            ),
            (
                sshd,
                LineResource {
                    line: Some("Port 22".into()),
                    ..LineResource::default()
                },
                "already in state",
                sshd,
            ),
            // No final newline: one is added before the new line.
            (
                "a\nb",
                LineResource {
                    line: Some("c".into()),
                    ..LineResource::default()
                },
                "appended 'c'",
                "a\nb\nc\n",
            ),
            // Every match says the same thing.
            (
                "Port 22\nListen x\nPort 2222\n",
                LineResource {
                    line: Some("Port 2200".into()),
                    pattern: Some("^Port ".into()),
                    ..LineResource::default()
                },
                "line 1: 'Port 22' -> 'Port 2200'; line 3: 'Port 2222' -> 'Port 2200'",
                "Port 2200\nListen x\nPort 2200\n",
            ),
            // A line its own pattern does not match is still found the second time.
            (
                "#Port 22\n",
                LineResource {
                    line: Some("Port 22".into()),
                    pattern: Some("^#Port".into()),
                    ..LineResource::default()
                },
                "line 1: '#Port 22' -> 'Port 22'",
                "Port 22\n",
            ),
            (
                "a\nb\na\n",
                LineResource {
                    state: Some(Presence::Absent),
                    line: Some("a".into()),
                    ..LineResource::default()
                },
                "removed line 1 'a'; removed line 3 'a'",
                "b\n",
            ),
            (
                "keep\nPermitRootLogin yes\n#PermitRootLogin no\n",
                LineResource {
                    state: Some(Presence::Absent),
                    pattern: Some("PermitRootLogin".into()),
                    ..LineResource::default()
                },
                "removed line 2 'PermitRootLogin yes'; removed line 3 '#PermitRootLogin no'",
                "keep\n",
            ),
            (
                "keep\n",
                LineResource {
                    state: Some(Presence::Absent),
                    line: Some("gone".into()),
                    ..LineResource::default()
                },
                "already absent",
                "keep\n",
            ),
            (
                "1\n1\n1\n1\n1\n1\n1\n2\n",
                LineResource {
                    state: Some(Presence::Absent),
                    line: Some("1".into()),
                    ..LineResource::default()
                },
                "removed line 1 '1'; removed line 2 '1'; removed line 3 '1'; removed line 4 '1'; \
                 removed line 5 '1'; and 2 more",
                "2\n",
            ),
        ];
        for (before, resource, detail, after) in cases {
            let made = |path: &Path| LineResource {
                path: path.to_str().unwrap().into(),
                ..resource.clone()
            };
            assert_eq!(
                apply_to(before, made),
                (detail.to_string(), after.to_string()),
                "{before:?} {resource:?}"
            );
        }
    }

    #[test]
    fn the_block_form() {
        let begin = "# BEGIN svc managed block";
        let end = "# END svc managed block";
        let block = |text: &str| LineResource {
            block: Some(text.to_string()),
            ..LineResource::default()
        };
        let cases: Vec<(String, LineResource, &str, String)> = vec![
            (
                "mine\n".into(),
                block("a\nb\n"),
                "appended block (2 lines)",
                format!("mine\n{begin}\na\nb\n{end}\n"),
            ),
            (
                format!("x\n{begin}\nold\n{end}\ny\n"),
                block("a\nb"),
                "block at line 2: 1 -> 2 lines",
                format!("x\n{begin}\na\nb\n{end}\ny\n"),
            ),
            (
                format!("x\n{begin}\na\n{end}\n"),
                block("a\n"),
                "already in state",
                format!("x\n{begin}\na\n{end}\n"),
            ),
            (
                format!("x\n{begin}\na\nb\n{end}\ny\n"),
                // The block's text is not compared: absent removes whatever it holds.
                LineResource {
                    state: Some(Presence::Absent),
                    ..block("other")
                },
                "removed block at line 2 (2 lines)",
                "x\ny\n".into(),
            ),
            // Two markers, two blocks.
            (
                format!("{begin}\na\n{end}\n"),
                LineResource {
                    marker: Some("// {mark} app".into()),
                    ..block("b")
                },
                "appended block (1 line)",
                format!("{begin}\na\n{end}\n// BEGIN app\nb\n// END app\n"),
            ),
        ];
        for (before, resource, detail, after) in cases {
            let made = |path: &Path| LineResource {
                path: path.to_str().unwrap().into(),
                ..resource.clone()
            };
            assert_eq!(
                apply_to(&before, made),
                (detail.to_string(), after),
                "{before:?} {resource:?}"
            );
        }
    }

    #[test]
    fn a_broken_block_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let cases = [
            (
                "a\n# BEGIN svc managed block\nb\n",
                "line 2: '# BEGIN svc managed block' has no '# END svc managed block' after it",
            ),
            (
                "a\n# END svc managed block\n# BEGIN svc managed block\n",
                "line 3: '# BEGIN svc managed block' has no '# END svc managed block' after it",
            ),
            (
                "# END svc managed block\n",
                "line 1: '# END svc managed block' has no '# BEGIN svc managed block' before it",
            ),
        ];
        for (before, expected) in cases {
            fs::write(&path, before).unwrap();
            let resource = LineResource {
                path: path.to_str().unwrap().into(),
                block: Some("x".into()),
                ..LineResource::default()
            };
            let error = run(&resource, Mode::Apply).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
            assert_eq!(fs::read_to_string(&path).unwrap(), before);
        }
    }

    #[test]
    fn missing_files_and_what_is_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts.allow");
        let wanted = line_form(&path, Some("sshd: 10.0.0.0/8"), None);
        let error = run(&wanted, Mode::Check).unwrap_err();
        assert_eq!(
            error,
            format!(
                "{} does not exist (set create: true to create it)",
                path.display()
            )
        );
        assert_eq!(
            run(&absent(wanted.clone()), Mode::Apply).unwrap().detail,
            "already absent"
        );

        let created = LineResource {
            create: Some(true),
            ..wanted
        };
        assert_eq!(
            run(&created, Mode::Check).unwrap().detail,
            "would create the file; would append 'sshd: 10.0.0.0/8'"
        );
        assert!(!path.exists(), "check created the file");
        assert_eq!(
            run(&created, Mode::Apply).unwrap().detail,
            "created the file; appended 'sshd: 10.0.0.0/8'"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "sshd: 10.0.0.0/8\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert!(!run(&created, Mode::Apply).unwrap().changed);

        let in_missing = line_form(&dir.path().join("no/file"), Some("x"), None);
        let error = run(
            &LineResource {
                create: Some(true),
                ..in_missing
            },
            Mode::Apply,
        )
        .unwrap_err();
        assert!(error.contains("does not exist"), "{error}");

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let error = run(&line_form(&link, Some("x"), None), Mode::Apply).unwrap_err();
        assert!(
            error.ends_with("is a symlink, not a regular file; refusing to edit it"),
            "{error}"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "sshd: 10.0.0.0/8\n");
    }

    #[test]
    fn the_mode_and_owner_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.conf");
        fs::write(&path, "a\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            run(&line_form(&path, Some("b"), None), Mode::Apply)
                .unwrap()
                .changed
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "a\nb\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o600
        );
    }
}
