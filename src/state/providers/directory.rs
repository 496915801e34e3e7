//! `directory`: one directory's existence, mode, owner and group, or its absence.
//!
//! Not recursive, on purpose: the parent must exist (or be made by an earlier resource), so
//! every level a plan creates is listed with its own mode and owner instead of inheriting
//! whatever `mkdir -p` would give. Absent removes an empty directory only: a state file never
//! deletes a tree of someone's files.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use super::attributes::Attributes;
use super::{describe, require_parent, Planned, Report};
use crate::state::{validate, DirectoryResource, Mode};

/// The mode of a new directory whose resource gives none.
const DEFAULT_MODE: u32 = 0o755;

pub(super) fn run(
    directory: &DirectoryResource,
    mode: Mode,
    planned: &mut Planned,
) -> Result<Report, String> {
    let path = Path::new(&directory.path);
    if directory.state == Some(crate::state::Presence::Absent) {
        return remove(path, mode);
    }
    let mut wanted = Attributes::resolve(
        directory.mode.as_deref(),
        directory.owner.as_deref(),
        directory.group.as_deref(),
        planned,
    )?;
    let inspect_error = |error: io::Error| format!("inspecting {}: {error}", path.display());

    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            require_parent(path, planned)?;
            let mode_text = validate::format_mode(*wanted.mode.get_or_insert(DEFAULT_MODE));
            if mode == Mode::Check {
                planned.dirs.insert(path.to_path_buf());
                return Ok(Report::changed(format!("would create (mode {mode_text})")));
            }
            match create(path, &wanted) {
                Ok(()) => Ok(Report::changed(format!("created (mode {mode_text})"))),
                // Made meanwhile by another writer (a second agent on this host): converge it
                // as an existing directory, as `mkdir -p` would not fail either.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                    existing(path, &wanted, mode)
                }
                Err(error) => Err(format!("creating {}: {error}", path.display())),
            }
        }
        Err(error) => Err(inspect_error(error)),
        Ok(metadata) if !metadata.is_dir() => Err(format!(
            "{} is {}, not a directory; refusing to replace it",
            path.display(),
            describe(metadata.file_type())
        )),
        Ok(_) => existing(path, &wanted, mode),
    }
}

/// An existing directory: its differences from `wanted`, put right when applying.
fn existing(path: &Path, wanted: &Attributes, mode: Mode) -> Result<Report, String> {
    let inspect_error = |error: io::Error| format!("inspecting {}: {error}", path.display());
    let opened = open_directory(path).map_err(inspect_error)?;
    let current = opened.metadata().map_err(inspect_error)?;
    let differences = wanted.differences(&current);
    if differences.is_empty() {
        return Ok(Report::unchanged("already in state"));
    }
    if mode == Mode::Apply {
        wanted
            .apply(&opened, &current)
            .map_err(|error| format!("updating {}: {error}", path.display()))?;
    }
    Ok(Report::changed(differences.join("; ")))
}

/// O_NOFOLLOW: a symlink swapped in since the lstat fails here instead of being followed.
fn open_directory(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

fn create(path: &Path, wanted: &Attributes) -> io::Result<()> {
    // 0700 until the owner and mode are set, so nobody else can slip a file in meanwhile.
    DirBuilder::new().mode(0o700).create(path)?;
    let opened = open_directory(path)?;
    wanted.apply(&opened, &opened.metadata()?)?;
    if let Some(parent) = path.parent() {
        super::sync_directory(parent)?;
    }
    Ok(())
}

fn remove(path: &Path, mode: Mode) -> Result<Report, String> {
    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Ok(Report::unchanged("already absent"))
        }
        Err(error) => Err(format!("cannot inspect {}: {error}", path.display())),
        Ok(metadata) if !metadata.is_dir() => Err(format!(
            "{} is {}, not a directory; refusing to remove it",
            path.display(),
            describe(metadata.file_type())
        )),
        Ok(_) => {
            let is_empty = fs::read_dir(path)
                .map_err(|error| format!("reading {}: {error}", path.display()))?
                .next()
                .is_none();
            if !is_empty {
                return Err(format!(
                    "{} is not empty; only empty directories are removed",
                    path.display()
                ));
            }
            if mode == Mode::Check {
                return Ok(Report::changed("would remove"));
            }
            // rmdir, never a recursive delete: if something appeared meanwhile, this fails.
            fs::remove_dir(path)
                .map_err(|error| format!("removing {}: {error}", path.display()))?;
            Ok(Report::changed("removed"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn resource(path: &Path) -> DirectoryResource {
        DirectoryResource {
            path: path.to_str().unwrap().into(),
            ..DirectoryResource::default()
        }
    }

    fn run_alone(directory: &DirectoryResource, mode: Mode) -> Result<Report, String> {
        run(directory, mode, &mut Planned::default())
    }

    fn mode_of(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn create_change_mode_then_nothing_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app");
        let directory = DirectoryResource {
            mode: Some("0750".into()),
            owner: Some(unsafe { libc::getuid() }.to_string()),
            ..resource(&path)
        };
        assert_eq!(
            run_alone(&directory, Mode::Check).unwrap().detail,
            "would create (mode 0750)"
        );
        assert!(!path.exists());
        assert_eq!(
            run_alone(&directory, Mode::Apply).unwrap().detail,
            "created (mode 0750)"
        );
        assert_eq!(mode_of(&path), 0o750);
        assert!(!run_alone(&directory, Mode::Apply).unwrap().changed);

        fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            run_alone(&directory, Mode::Check).unwrap().detail,
            "mode 0777 -> 0750"
        );
        assert_eq!(mode_of(&path), 0o777);
        assert!(run_alone(&directory, Mode::Apply).unwrap().changed);
        assert_eq!(mode_of(&path), 0o750);

        let default_mode = resource(&dir.path().join("plain"));
        assert_eq!(
            run_alone(&default_mode, Mode::Apply).unwrap().detail,
            "created (mode 0755)"
        );
        assert_eq!(mode_of(&dir.path().join("plain")), 0o755);
    }

    #[test]
    fn not_recursive_except_for_planned_parents() {
        let dir = tempfile::tempdir().unwrap();
        let parent = resource(&dir.path().join("a"));
        let child = resource(&dir.path().join("a/b"));
        let error = run_alone(&child, Mode::Apply).unwrap_err();
        assert!(
            error.contains("parent directory") && error.contains("does not exist"),
            "{error}"
        );
        // In check mode, a parent that an earlier resource would create counts.
        let mut planned = Planned::default();
        assert!(run(&parent, Mode::Check, &mut planned).unwrap().changed);
        assert_eq!(
            run(&child, Mode::Check, &mut planned).unwrap().detail,
            "would create (mode 0755)"
        );
        assert!(!dir.path().join("a").exists());
    }

    #[test]
    fn refuses_files_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "data").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        for (path, kind) in [(&file, "a regular file"), (&link, "a symlink")] {
            let error = run_alone(&resource(path), Mode::Apply).unwrap_err();
            assert!(
                error.ends_with(&format!(
                    "is {kind}, not a directory; refusing to replace it"
                )),
                "{error}"
            );
        }
        assert_eq!(fs::read_to_string(&file).unwrap(), "data");
    }

    #[test]
    fn absent_removes_only_empty_directories() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("precious"), "data").unwrap();
        let absent = DirectoryResource {
            state: Some(crate::state::Presence::Absent),
            ..resource(&path)
        };
        let error = run_alone(&absent, Mode::Apply).unwrap_err();
        assert!(error.contains("is not empty"), "{error}");
        assert!(path.join("precious").exists());

        fs::remove_file(path.join("precious")).unwrap();
        assert_eq!(
            run_alone(&absent, Mode::Check).unwrap().detail,
            "would remove"
        );
        assert!(path.exists());
        assert_eq!(run_alone(&absent, Mode::Apply).unwrap().detail, "removed");
        assert!(!path.exists());
        assert_eq!(
            run_alone(&absent, Mode::Apply).unwrap().detail,
            "already absent"
        );
    }
}
