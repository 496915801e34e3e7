//! Providers: one file per resource kind, each answering two questions about this host —
//! does it match the resource (check), and make it match (apply) — with the same code path, so
//! a check reports exactly what an apply would do.
//!
//! Shared rules: nothing is created implicitly (no parent directories), nothing that is not the
//! resource's own kind is replaced or removed (user data survives a wrong state file), and only
//! `command` resources use a shell; every other program is run with explicit arguments.

mod accounts;
mod attributes;
mod command;
mod cron;
mod directory;
mod file;
mod group;
mod line;
mod package;
mod process;
mod service;
mod symlink;
mod sysctl;
mod text;
mod user;

use std::collections::HashSet;
use std::fs::{self, FileType};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{validate, Mode, Outcome, Plan, Resource};

/// What a provider found (check) or did (apply).
#[derive(Debug)]
struct Report {
    changed: bool,
    detail: String,
}

impl Report {
    fn unchanged(detail: impl Into<String>) -> Self {
        Report {
            changed: false,
            detail: detail.into(),
        }
    }

    fn changed(detail: impl Into<String>) -> Self {
        Report {
            changed: true,
            detail: detail.into(),
        }
    }
}

/// Directories that earlier resources of the plan would create. In check mode they do not exist
/// yet, and without this a file planned inside one would be reported as an error although the
/// apply would succeed.
#[derive(Default)]
struct PlannedDirectories(HashSet<PathBuf>);

pub(super) fn run_plan(plan: &Plan, mode: Mode) -> Vec<Outcome> {
    let mut planned = PlannedDirectories::default();
    plan.resources
        .iter()
        .map(|resource| run_resource(resource, mode, &mut planned))
        .collect()
}

/// Checks or applies one resource. The agent runs what the server validated, but the values are
/// checked again here because this is the last stop before the host is touched.
fn run_resource(resource: &Resource, mode: Mode, planned: &mut PlannedDirectories) -> Outcome {
    let result = validate::check_compiled(resource).and_then(|()| match resource {
        Resource::File(resource) => file::run(resource, mode, planned),
        Resource::Directory(resource) => directory::run(resource, mode, planned),
        Resource::Symlink(resource) => symlink::run(resource, mode, planned),
        Resource::Package(resource) => package::run(resource, mode),
        Resource::Service(resource) => service::run(resource, mode),
        Resource::Command(resource) => command::run(resource, mode),
        Resource::User(resource) => user::run(resource, mode),
        Resource::Group(resource) => group::run(resource, mode),
        Resource::Cron(resource) => cron::run(resource, mode),
        Resource::Sysctl(resource) => sysctl::run(resource, mode),
        Resource::Line(resource) => line::run(resource, mode),
    });
    match result {
        Ok(report) => Outcome {
            resource: resource.label(),
            changed: report.changed,
            detail: report.detail,
            error: None,
        },
        Err(error) => Outcome {
            resource: resource.label(),
            changed: false,
            detail: String::new(),
            error: Some(error),
        },
    }
}

/// No implicit mkdir: a missing parent is the operator's to create (with a `directory`
/// resource, which says its mode and owner). In check mode, a parent that an earlier resource
/// would create counts as there.
fn require_parent(path: &Path, planned: &PlannedDirectories) -> Result<(), String> {
    let Some(parent) = path.parent() else {
        return Err(format!("{} has no parent directory", path.display()));
    };
    if planned.0.contains(parent) {
        return Ok(());
    }
    match fs::metadata(parent) {
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(_) => Err(format!("{} is not a directory", parent.display())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(format!(
            "parent directory {} does not exist (add a directory resource before this one)",
            parent.display()
        )),
        Err(error) => Err(format!("cannot inspect {}: {error}", parent.display())),
    }
}

/// A fresh name next to `path` for a file or link that is renamed over it: same directory, so
/// the rename is atomic; hidden, and unique per process and call.
fn temporary_path_beside(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    // The clock keeps a restarted agent that got the same pid off a crashed run's leftovers.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    path.with_file_name(format!(
        ".{name}.svc-{}-{unique}-{nanos}",
        std::process::id()
    ))
}

/// Makes a rename in `directory` durable: without this, a crash right after the rename can
/// bring back the old entry.
fn sync_directory(directory: &Path) -> io::Result<()> {
    fs::File::open(directory)?.sync_all()
}

/// "a directory", "a symlink", ... for messages about what was found at a path.
fn describe(file_type: FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symlink"
    } else if file_type.is_fifo() {
        "a fifo"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{
        run, CommandResource, DirectoryResource, FileResource, Plan, SymlinkResource,
    };

    /// The contract's promise: applying the same plan twice changes nothing the second time.
    #[test]
    fn a_second_apply_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let uid = unsafe { libc::getuid() }.to_string();
        let plan = Plan {
            resources: vec![
                Resource::Directory(DirectoryResource {
                    path: format!("{root}/app"),
                    mode: Some("0750".into()),
                    owner: Some(uid.clone()),
                    ..DirectoryResource::default()
                }),
                Resource::File(FileResource {
                    path: format!("{root}/app/config"),
                    content: Some("port = 80\n".into()),
                    mode: Some("0640".into()),
                    owner: Some(uid),
                    ..FileResource::default()
                }),
                Resource::File(FileResource {
                    path: format!("{root}/app/blob"),
                    content_base64: Some("AJ+SlgA=".into()),
                    ..FileResource::default()
                }),
                Resource::Symlink(SymlinkResource {
                    path: format!("{root}/current"),
                    target: "app".into(),
                    state: None,
                }),
                Resource::Command(CommandResource {
                    run: format!("echo built > {root}/app/built"),
                    creates: Some(format!("{root}/app/built")),
                    ..CommandResource::default()
                }),
            ],
        };
        // The files are checked inside a directory that does not exist yet but would be made.
        let check = run(&plan, Mode::Check);
        for outcome in &check {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert!(!Path::new(root).join("app").exists());
        let first = run(&plan, Mode::Apply);
        for outcome in &first {
            assert!(outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert_eq!(
            fs::read(format!("{root}/app/blob")).unwrap(),
            [0, 159, 146, 150, 0]
        );
        let second = run(&plan, Mode::Apply);
        for outcome in &second {
            assert!(!outcome.changed && outcome.error.is_none(), "{outcome:?}");
        }
        assert_eq!(second[0].resource, format!("directory:{root}/app"));
        assert_eq!(second[1].detail, "already in state");
        assert_eq!(run(&plan, Mode::Check), second);
    }

    #[test]
    fn a_failing_resource_does_not_stop_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let plan = Plan {
            resources: vec![
                Resource::File(FileResource {
                    path: format!("{root}/missing/file"),
                    ..FileResource::default()
                }),
                Resource::File(FileResource {
                    path: "relative".into(),
                    ..FileResource::default()
                }),
                // Planned directories only stand in for real ones in check mode.
                Resource::Directory(DirectoryResource {
                    path: format!("{root}/missing/sub"),
                    ..DirectoryResource::default()
                }),
                Resource::File(FileResource {
                    path: format!("{root}/file"),
                    ..FileResource::default()
                }),
            ],
        };
        let outcomes = run(&plan, Mode::Apply);
        let errors: Vec<_> = outcomes.iter().map(|o| o.error.as_deref()).collect();
        assert!(errors[0].unwrap().contains("does not exist"), "{errors:?}");
        assert!(
            errors[1].unwrap().contains("must be absolute"),
            "{errors:?}"
        );
        assert!(errors[2].unwrap().contains("does not exist"), "{errors:?}");
        assert_eq!(errors[3], None);
        assert!(outcomes[3].changed);
        assert_eq!(fs::read(format!("{root}/file")).unwrap(), b"");
    }

    #[test]
    fn run_refuses_uncompiled_sources() {
        let plan = Plan {
            resources: vec![Resource::File(FileResource {
                path: "/tmp/never-written".into(),
                source: Some("motd".into()),
                ..FileResource::default()
            })],
        };
        let outcomes = run(&plan, Mode::Apply);
        assert!(outcomes[0]
            .error
            .as_deref()
            .unwrap()
            .contains("source must be compiled"));
    }
}

/// Stand-ins for the host's tools (apt-get, rpm, systemctl), so the providers' apply paths run
/// for real in tests without changing the machine.
#[cfg(test)]
pub(super) mod fake {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    /// Writes an executable `/bin/sh` script `name` in `dir`. A script answers `probe` with
    /// exit 0 before its `body` runs: the first run is a probe, retried while the kernel says
    /// "text file busy" — a child forked by another test thread while the file was open for
    /// writing holds that descriptor until it execs.
    pub fn program(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        let script = format!("#!/bin/sh\n[ \"$1\" = probe ] && exit 0\n{body}\n");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        for _ in 0..100 {
            match std::process::Command::new(&path).arg("probe").status() {
                Ok(status) if status.success() => return path,
                Err(error) if error.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
        panic!("{} stayed busy", path.display());
    }
}
