//! `file`: one regular file's content, mode, owner and group, or its absence.
//!
//! New content is written atomically: a temporary file in the same directory gets the bytes,
//! the mode and the owner, is synced and renamed over the path, so readers see the old file or
//! the new one, never half of one. Only regular files are managed. A symlink, directory or
//! device at the path is an error, because replacing it could destroy data or write through a
//! link the operator did not mean to follow. Without content, only the metadata is managed (a
//! missing file is created empty).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::attributes::Attributes;
use super::{
    describe, diff, require_parent, sync_directory, temporary_path_beside, write_new_file, Planned,
    Report,
};
use crate::state::{validate, FileResource, Mode};

/// The mode of a new file whose resource gives none.
const DEFAULT_MODE: u32 = 0o644;

pub(super) fn run(
    file: &FileResource,
    mode: Mode,
    planned: &Planned,
    diff: Option<diff::Request>,
) -> Result<Report, String> {
    let path = Path::new(&file.path);
    if file.state == Some(crate::state::Presence::Absent) {
        return remove(path, mode);
    }
    let content = match (&file.content, &file.content_base64) {
        (Some(text), _) => Some(text.clone().into_bytes()),
        (None, Some(encoded)) => Some(validate::decode_base64(encoded)?),
        (None, None) => None,
    };
    let wanted = Attributes::resolve(
        file.mode.as_deref(),
        file.owner.as_deref(),
        file.group.as_deref(),
        planned,
    )?;

    let Some(existing) = open_existing(path, planned)? else {
        let bytes = content.unwrap_or_default();
        let mut wanted = wanted;
        let mode_text = validate::format_mode(*wanted.mode.get_or_insert(DEFAULT_MODE));
        if mode == Mode::Check {
            if let Some(diff) = diff {
                diff.put(&file.path, None, &bytes);
            }
            return Ok(Report::changed(format!(
                "would create ({} bytes, mode {mode_text})",
                bytes.len()
            )));
        }
        write_atomically(path, &bytes, &wanted)
            .map_err(|error| format!("writing {}: {error}", path.display()))?;
        return Ok(Report::changed(format!(
            "created ({} bytes, mode {mode_text})",
            bytes.len()
        )));
    };

    let current = existing
        .metadata()
        .map_err(|error| format!("inspecting {}: {error}", path.display()))?;
    let mut differences = Vec::new();
    let new_content = match content {
        Some(bytes)
            if content_differs(&existing, &current, &bytes)
                .map_err(|error| format!("reading {}: {error}", path.display()))? =>
        {
            differences.push(format!(
                "content differs ({} -> {} bytes)",
                current.len(),
                bytes.len()
            ));
            Some(bytes)
        }
        _ => None,
    };
    differences.extend(wanted.differences(&current));
    if differences.is_empty() {
        return Ok(Report::unchanged("already in state"));
    }
    let detail = differences.join("; ");
    if mode == Mode::Check {
        if let (Some(diff), Some(bytes)) = (diff, &new_content) {
            match read_for_diff(path, &current)
                .map_err(|error| format!("reading {}: {error}", path.display()))?
            {
                Some(old) => diff.put(&file.path, Some(&old), bytes),
                None => diff.summary(format!(
                    "file too large to diff ({} -> {} bytes)",
                    current.len(),
                    bytes.len()
                )),
            }
        }
        return Ok(Report::changed(detail));
    }
    match new_content {
        Some(bytes) => write_atomically(path, &bytes, &wanted.or_current(&current)),
        None => wanted.apply(&existing, &current),
    }
    .map_err(|error| format!("updating {}: {error}", path.display()))?;
    Ok(Report::changed(detail))
}

/// The regular file at `path`, opened for reading without following a symlink; None if
/// nothing is there.
fn open_existing(path: &Path, planned: &Planned) -> Result<Option<File>, String> {
    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            require_parent(path, planned)?;
            Ok(None)
        }
        Err(error) => Err(format!("cannot inspect {}: {error}", path.display())),
        Ok(metadata) if !metadata.is_file() => Err(format!(
            "{} is {}, not a regular file; refusing to replace it",
            path.display(),
            describe(metadata.file_type())
        )),
        Ok(_) => {
            // O_NOFOLLOW and O_NONBLOCK: if the path was swapped since the lstat, this fails or
            // returns at once instead of following a link or blocking on a fifo.
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .map_err(|error| format!("opening {}: {error}", path.display()))?;
            match file.metadata() {
                Ok(metadata) if metadata.is_file() => Ok(Some(file)),
                Ok(_) => Err(format!("{} changed while being checked", path.display())),
                Err(error) => Err(format!("inspecting {}: {error}", path.display())),
            }
        }
    }
}

/// The current bytes, for a diff: read again by path (the checked descriptor has been read
/// from), and not at all past the size a diff shows.
fn read_for_diff(path: &Path, current: &fs::Metadata) -> io::Result<Option<Vec<u8>>> {
    if current.len() > diff::MAX_FILE_BYTES as u64 {
        return Ok(None);
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mut bytes = Vec::new();
    file.take(diff::MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

fn content_differs(file: &File, current: &fs::Metadata, wanted: &[u8]) -> io::Result<bool> {
    if current.len() != wanted.len() as u64 {
        return Ok(true);
    }
    // Read one byte more than expected, in case the file grew since the stat.
    let mut bytes = Vec::with_capacity(wanted.len() + 1);
    file.take(wanted.len() as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes != wanted)
}

/// Writes `bytes` to a temporary file beside `path` with `attributes`, then renames it over
/// `path`. The temporary file is removed on failure (it is ours: created with O_EXCL).
pub(super) fn write_atomically(
    path: &Path,
    bytes: &[u8],
    attributes: &Attributes,
) -> io::Result<()> {
    let directory = path.parent().unwrap_or(Path::new("/"));
    let temporary = temporary_path_beside(path);
    let written = (|| {
        let file = write_new_file(&temporary, bytes)?;
        attributes.apply(&file, &file.metadata()?)?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    })();
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    sync_directory(directory)
}

/// Removes a regular file; never a directory, and not a symlink (that is a symlink
/// resource's job, and unlinking it would hide a wrong state file).
fn remove(path: &Path, mode: Mode) -> Result<Report, String> {
    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Ok(Report::unchanged("already absent"))
        }
        Err(error) => Err(format!("cannot inspect {}: {error}", path.display())),
        Ok(metadata) if !metadata.is_file() => Err(format!(
            "{} is {}, not a regular file; refusing to remove it",
            path.display(),
            describe(metadata.file_type())
        )),
        Ok(metadata) if mode == Mode::Check => Ok(Report::changed(format!(
            "would remove ({} bytes)",
            metadata.size()
        ))),
        Ok(metadata) => match fs::remove_file(path) {
            Ok(()) => Ok(Report::changed(format!(
                "removed ({} bytes)",
                metadata.size()
            ))),
            // Gone between the look and the removal (another process removed it): absent is
            // what was asked for.
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                Ok(Report::unchanged("already absent"))
            }
            Err(error) => Err(format!("removing {}: {error}", path.display())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn resource(path: &Path) -> FileResource {
        FileResource {
            path: path.to_str().unwrap().into(),
            ..FileResource::default()
        }
    }

    fn apply(file: &FileResource) -> Result<Report, String> {
        run(file, Mode::Apply, &Planned::default(), None)
    }

    fn check(file: &FileResource) -> Result<Report, String> {
        run(file, Mode::Check, &Planned::default(), None)
    }

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn create_then_nothing_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("motd");
        let file = FileResource {
            content: Some("hello\n".into()),
            mode: Some("0640".into()),
            ..resource(&path)
        };
        let checked = check(&file).unwrap();
        assert_eq!(
            (checked.changed, checked.detail.as_str()),
            (true, "would create (6 bytes, mode 0640)")
        );
        assert!(!path.exists(), "check must not write");

        let created = apply(&file).unwrap();
        assert_eq!(
            (created.changed, created.detail.as_str()),
            (true, "created (6 bytes, mode 0640)")
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "hello\n");
        assert_eq!(mode_of(&path), 0o640);

        for report in [check(&file).unwrap(), apply(&file).unwrap()] {
            assert_eq!(
                (report.changed, report.detail.as_str()),
                (false, "already in state")
            );
        }
        // No temporary files are left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn content_and_mode_differences() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        fs::write(&path, "twelve bytes").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let file = FileResource {
            content: Some("twenty bytes of text".into()),
            mode: Some("0644".into()),
            ..resource(&path)
        };
        let expected = "content differs (12 -> 20 bytes); mode 0600 -> 0644";
        assert_eq!(check(&file).unwrap().detail, expected);
        assert_eq!(fs::read_to_string(&path).unwrap(), "twelve bytes");
        let applied = apply(&file).unwrap();
        assert_eq!((applied.changed, applied.detail.as_str()), (true, expected));
        assert_eq!(fs::read_to_string(&path).unwrap(), "twenty bytes of text");
        assert_eq!(mode_of(&path), 0o644);

        // Same length, other bytes.
        let same_length = FileResource {
            content: Some("twenty bytes of TEXT".into()),
            ..file.clone()
        };
        assert_eq!(
            apply(&same_length).unwrap().detail,
            "content differs (20 -> 20 bytes)"
        );
    }

    #[test]
    fn replacing_content_keeps_unmanaged_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o750)).unwrap();
        let file = FileResource {
            content: Some("new".into()),
            ..resource(&path)
        };
        assert!(apply(&file).unwrap().changed);
        assert_eq!(mode_of(&path), 0o750);
    }

    #[test]
    fn metadata_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        fs::write(&path, "keep me").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let uid = unsafe { libc::getuid() };
        let gid = unsafe { libc::getgid() };
        let file = FileResource {
            mode: Some("0600".into()),
            owner: Some(uid.to_string()),
            group: Some(gid.to_string()),
            ..resource(&path)
        };
        assert_eq!(apply(&file).unwrap().detail, "mode 0644 -> 0600");
        assert_eq!(fs::read_to_string(&path).unwrap(), "keep me");
        assert_eq!(mode_of(&path), 0o600);
        assert!(!apply(&file).unwrap().changed);

        // A missing file without content is created empty.
        let empty = resource(&dir.path().join("empty"));
        assert_eq!(
            apply(&empty).unwrap().detail,
            "created (0 bytes, mode 0644)"
        );
        assert_eq!(fs::read(&empty.path).unwrap(), b"");
    }

    #[test]
    fn owner_changes_are_reported_and_applied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owned");
        fs::write(&path, "").unwrap();
        let uid = fs::metadata(&path).unwrap().uid();
        // Root (as in CI) can give the file away and take it back; anyone else only sees the
        // difference reported.
        let other = uid + 1;
        let file = FileResource {
            owner: Some(other.to_string()),
            ..resource(&path)
        };
        assert_eq!(
            check(&file).unwrap().detail,
            format!("owner {uid} -> {other}")
        );
        if uid == 0 {
            apply(&file).unwrap();
            assert_eq!(fs::metadata(&path).unwrap().uid(), other);
            let back = FileResource {
                owner: Some("root".into()),
                content: Some("x".into()),
                ..resource(&path)
            };
            assert_eq!(
                apply(&back).unwrap().detail,
                format!("content differs (0 -> 1 bytes); owner {other} -> root")
            );
            assert_eq!(fs::metadata(&path).unwrap().uid(), 0);
        }
    }

    #[test]
    fn binary_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let file = FileResource {
            content_base64: Some("AP8AAQ==".into()),
            ..resource(&path)
        };
        apply(&file).unwrap();
        assert_eq!(fs::read(&path).unwrap(), [0, 255, 0, 1]);
        assert!(!check(&file).unwrap().changed);
    }

    #[test]
    fn refuses_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "user data").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let directory = dir.path().join("directory");
        fs::create_dir(&directory).unwrap();

        let cases = [
            (
                link.clone(),
                "is a symlink, not a regular file; refusing to replace it",
            ),
            (directory.clone(), "is a directory, not a regular file"),
            (dir.path().join("missing/file"), "does not exist"),
            (target.join("under-a-file"), "Not a directory"),
        ];
        for (path, expected) in cases {
            let file = FileResource {
                content: Some("new".into()),
                ..resource(&path)
            };
            let error = apply(&file).unwrap_err();
            assert!(error.contains(expected), "{path:?}: {error}");
        }
        assert_eq!(fs::read_to_string(&target).unwrap(), "user data");
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn absent_removes_regular_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old");
        fs::write(&path, "bye").unwrap();
        let file = FileResource {
            state: Some(crate::state::Presence::Absent),
            ..resource(&path)
        };
        assert_eq!(check(&file).unwrap().detail, "would remove (3 bytes)");
        assert!(path.exists());
        assert_eq!(apply(&file).unwrap().detail, "removed (3 bytes)");
        assert!(!path.exists());
        let again = apply(&file).unwrap();
        assert_eq!(
            (again.changed, again.detail.as_str()),
            (false, "already absent")
        );

        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), "data").unwrap();
        assert!(apply(&file)
            .unwrap_err()
            .contains("is a directory, not a regular file; refusing to remove it"));
        assert!(path.join("inside").exists());
    }
}
