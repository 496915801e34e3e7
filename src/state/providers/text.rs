//! Text files that several kinds edit line by line (cron.d files, sysctl.d files, `line`):
//! reading one without following a link, splitting it into lines, and writing the edited text
//! back atomically with the `file` kind's writer, keeping the file's mode and owner.

use std::fs::{self, Metadata};
use std::io;
use std::path::Path;

use super::attributes::Attributes;
use super::{describe, file};

/// The mode of a file these kinds create: readable by all, as cron and systemd-sysctl expect
/// of their files, and writable by its owner only (cron skips files others can write).
const NEW_FILE_MODE: u32 = 0o644;

/// A text file as found: its metadata and content.
#[derive(Debug)]
pub(super) struct Found {
    pub metadata: Metadata,
    pub text: String,
}

/// The regular file at `path` and its text, or None if nothing is there. Anything else at the
/// path (a symlink, a directory) is an error: editing through a link would change a file the
/// resource does not name.
pub(super) fn read(path: &Path) -> Result<Option<Found>, String> {
    let metadata = match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot inspect {}: {error}", path.display())),
        Ok(metadata) if !metadata.is_file() => {
            return Err(format!(
                "{} is {}, not a regular file; refusing to edit it",
                path.display(),
                describe(metadata.file_type())
            ))
        }
        Ok(metadata) => metadata,
    };
    let bytes = fs::read(path).map_err(|error| format!("reading {}: {error}", path.display()))?;
    // These files are text; other bytes are reported rather than guessed at.
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{} is not UTF-8 text; refusing to edit it", path.display()))?;
    Ok(Some(Found { metadata, text }))
}

/// Writes `text` over the file atomically: an existing file keeps its mode and owner, a new
/// one gets 0644 and the agent's owner.
pub(super) fn write(path: &Path, text: &str, existing: Option<&Metadata>) -> Result<(), String> {
    let attributes = match existing {
        Some(metadata) => Attributes::default().or_current(metadata),
        None => Attributes {
            mode: Some(NEW_FILE_MODE),
            ..Attributes::default()
        },
    };
    file::write_atomically(path, text.as_bytes(), &attributes)
        .map_err(|error| format!("writing {}: {error}", path.display()))
}

/// The lines of a text, without their `\n` (a final newline does not start an empty line).
pub(super) fn split_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    if text.is_empty() || text.ends_with('\n') {
        lines.pop();
    }
    lines
}

/// Lines back into a text, each ended by a newline (an empty list is an empty text).
pub(super) fn join_lines(lines: &[&str]) -> String {
    let mut text = lines.join("\n");
    if !lines.is_empty() {
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn lines_split_and_join() {
        let cases: [(&str, &[&str]); 5] = [
            ("", &[]),
            ("a", &["a"]),
            ("a\n", &["a"]),
            ("a\n\nb\n", &["a", "", "b"]),
            ("\n", &[""]),
        ];
        for (text, lines) in cases {
            assert_eq!(split_lines(text), lines, "{text:?}");
        }
        assert_eq!(join_lines(&["a", "", "b"]), "a\n\nb\n");
        assert_eq!(join_lines(&[]), "");
    }

    #[test]
    fn reads_regular_text_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        assert!(read(&path).unwrap().is_none());
        fs::write(&path, "x\n").unwrap();
        assert_eq!(read(&path).unwrap().unwrap().text, "x\n");
        fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(read(&path)
            .unwrap_err()
            .ends_with("is not UTF-8 text; refusing to edit it"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read(&link)
            .unwrap_err()
            .ends_with("is a symlink, not a regular file; refusing to edit it"));
    }

    #[test]
    fn writes_keep_or_set_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        write(&path, "new\n", None).unwrap();
        assert_eq!(
            (fs::read_to_string(&path).unwrap(), mode(&path)),
            ("new\n".into(), 0o644)
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let found = read(&path).unwrap().unwrap();
        write(&path, "changed\n", Some(&found.metadata)).unwrap();
        assert_eq!(
            (fs::read_to_string(&path).unwrap(), mode(&path)),
            ("changed\n".into(), 0o600)
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
