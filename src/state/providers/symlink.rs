//! `symlink`: a symbolic link pointing at `target`, or its absence.
//!
//! Created or retargeted atomically: a new link is made under a temporary name beside the path
//! and renamed over it, so the path always resolves to the old target or the new one. Only
//! symlinks are replaced or removed; a file or directory at the path is an error, never
//! deleted. The target is compared as written (a relative target stays relative) and need not
//! exist.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::{describe, require_parent, sync_directory, temporary_path_beside, Planned, Report};
use crate::state::{Mode, SymlinkResource};

pub(super) fn run(link: &SymlinkResource, mode: Mode, planned: &Planned) -> Result<Report, String> {
    let path = Path::new(&link.path);
    if link.state == Some(crate::state::Presence::Absent) {
        return remove(path, mode);
    }
    let target = Path::new(&link.target);
    let (done, would) = match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            require_parent(path, planned)?;
            (
                format!("created -> {}", link.target),
                format!("would create -> {}", link.target),
            )
        }
        Err(error) => return Err(format!("cannot inspect {}: {error}", path.display())),
        Ok(metadata) if !metadata.file_type().is_symlink() => {
            return Err(format!(
                "{} is {}, not a symlink; refusing to replace it",
                path.display(),
                describe(metadata.file_type())
            ))
        }
        Ok(_) => {
            let current = fs::read_link(path)
                .map_err(|error| format!("reading {}: {error}", path.display()))?;
            if current == target {
                return Ok(Report::unchanged("already in state"));
            }
            let change = format!("target {} -> {}", current.display(), link.target);
            (change.clone(), change)
        }
    };
    if mode == Mode::Check {
        return Ok(Report::changed(would));
    }
    replace(path, target).map_err(|error| format!("linking {}: {error}", path.display()))?;
    Ok(Report::changed(done))
}

fn replace(path: &Path, target: &Path) -> io::Result<()> {
    let temporary = temporary_path_beside(path);
    symlink(target, &temporary)?;
    // rename(2) replaces a symlink but fails on a directory, so a directory that appeared
    // since the check is not touched either.
    if let Err(error) = fs::rename(&temporary, path) {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    sync_directory(path.parent().unwrap_or(Path::new("/")))
}

fn remove(path: &Path, mode: Mode) -> Result<Report, String> {
    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Ok(Report::unchanged("already absent"))
        }
        Err(error) => Err(format!("cannot inspect {}: {error}", path.display())),
        Ok(metadata) if !metadata.file_type().is_symlink() => Err(format!(
            "{} is {}, not a symlink; refusing to remove it",
            path.display(),
            describe(metadata.file_type())
        )),
        Ok(_) if mode == Mode::Check => Ok(Report::changed("would remove")),
        Ok(_) => {
            // unlink removes the link itself, never what it points at.
            fs::remove_file(path)
                .map_err(|error| format!("removing {}: {error}", path.display()))?;
            Ok(Report::changed("removed"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(path: &Path, target: &str) -> SymlinkResource {
        SymlinkResource {
            path: path.to_str().unwrap().into(),
            target: target.into(),
            state: None,
        }
    }

    fn run_alone(link: &SymlinkResource, mode: Mode) -> Result<Report, String> {
        run(link, mode, &Planned::default())
    }

    #[test]
    fn create_retarget_then_nothing_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("current");
        let first = resource(&path, "releases/1");
        assert_eq!(
            run_alone(&first, Mode::Check).unwrap().detail,
            "would create -> releases/1"
        );
        assert!(fs::symlink_metadata(&path).is_err());
        assert_eq!(
            run_alone(&first, Mode::Apply).unwrap().detail,
            "created -> releases/1"
        );
        assert_eq!(fs::read_link(&path).unwrap(), Path::new("releases/1"));
        let again = run_alone(&first, Mode::Apply).unwrap();
        assert_eq!(
            (again.changed, again.detail.as_str()),
            (false, "already in state")
        );

        let second = resource(&path, "releases/2");
        assert_eq!(
            run_alone(&second, Mode::Check).unwrap().detail,
            "target releases/1 -> releases/2"
        );
        assert_eq!(fs::read_link(&path).unwrap(), Path::new("releases/1"));
        assert!(run_alone(&second, Mode::Apply).unwrap().changed);
        assert_eq!(fs::read_link(&path).unwrap(), Path::new("releases/2"));
        assert!(!run_alone(&second, Mode::Apply).unwrap().changed);
        // Only the link is left: no temporary names.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn refuses_to_replace_or_remove_real_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "user data").unwrap();
        let directory = dir.path().join("directory");
        fs::create_dir(&directory).unwrap();
        for (path, kind) in [(&file, "a regular file"), (&directory, "a directory")] {
            let error = run_alone(&resource(path, "/etc"), Mode::Apply).unwrap_err();
            assert!(
                error.ends_with(&format!("is {kind}, not a symlink; refusing to replace it")),
                "{error}"
            );
            let absent = SymlinkResource {
                state: Some(crate::state::Presence::Absent),
                ..resource(path, "")
            };
            let error = run_alone(&absent, Mode::Apply).unwrap_err();
            assert!(
                error.ends_with("not a symlink; refusing to remove it"),
                "{error}"
            );
        }
        assert_eq!(fs::read_to_string(&file).unwrap(), "user data");
        assert!(directory.is_dir());
    }

    #[test]
    fn absent_removes_the_link_not_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "kept").unwrap();
        let path = dir.path().join("link");
        symlink(&target, &path).unwrap();
        let absent = SymlinkResource {
            state: Some(crate::state::Presence::Absent),
            ..resource(&path, "")
        };
        assert_eq!(
            run_alone(&absent, Mode::Check).unwrap().detail,
            "would remove"
        );
        assert_eq!(run_alone(&absent, Mode::Apply).unwrap().detail, "removed");
        assert!(fs::symlink_metadata(&path).is_err());
        assert_eq!(fs::read_to_string(&target).unwrap(), "kept");
        assert_eq!(
            run_alone(&absent, Mode::Apply).unwrap().detail,
            "already absent"
        );
    }

    #[test]
    fn missing_parent_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let error =
            run_alone(&resource(&dir.path().join("no/link"), "x"), Mode::Apply).unwrap_err();
        assert!(error.contains("does not exist"), "{error}");
    }
}
