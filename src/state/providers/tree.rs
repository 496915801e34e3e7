//! `tree`: a directory tree from the plan (every directory and file of a source directory,
//! with modes), and with `purge` nothing else below it.
//!
//! Built for trees of thousands of files: the destination is read once (one walk, one lstat
//! per entry), a file is read only when its size matches, and new content is written to
//! temporary files beside their targets that are made durable together by one `syncfs`
//! before the renames, and the renames by a second one — two syncs for the whole tree instead
//! of two per file. Readers see the old file or the new one, never half of one. As with
//! `file`, nothing but the tree's own kinds is replaced: a symlink or a device where the tree
//! has a file or a directory is an error, and purge removes symlinks themselves, never what
//! they point at.

use std::collections::{HashMap, HashSet};
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::attributes::Attributes;
use super::{describe, require_parent, temporary_path_beside, write_new_file, Planned, Report};
use crate::state::{validate, Mode, TreeResource};

/// The mode of the tree's directories unless `dir_mode` says otherwise.
const DEFAULT_DIR_MODE: u32 = 0o755;

/// What a run found or did, counted for the report.
#[derive(Default)]
struct Counts {
    created: usize,
    updated: usize,
    removed: usize,
}

pub(super) fn run(
    tree: &TreeResource,
    mode: Mode,
    planned: &mut Planned,
) -> Result<Report, String> {
    let root = Path::new(&tree.path);
    let dir_attributes = {
        let mut wanted = Attributes::resolve(
            tree.dir_mode.as_deref(),
            tree.owner.as_deref(),
            tree.group.as_deref(),
            planned,
        )?;
        wanted.mode.get_or_insert(DEFAULT_DIR_MODE);
        wanted
    };
    let file_owner =
        Attributes::resolve(None, tree.owner.as_deref(), tree.group.as_deref(), planned)?;
    let file_mode = tree.mode.as_deref().map(validate::parse_mode).transpose()?;

    let mut counts = Counts::default();
    let existing = match fs::symlink_metadata(root) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            require_parent(root, planned)?;
            counts.created += 1;
            if mode == Mode::Apply {
                make_directory(root, &dir_attributes)?;
            } else {
                planned.dirs.insert(root.to_path_buf());
            }
            HashMap::new()
        }
        Err(error) => return Err(format!("cannot inspect {}: {error}", root.display())),
        Ok(metadata) if !metadata.is_dir() => {
            return Err(format!(
                "{} is {}, not a directory; refusing to replace it",
                root.display(),
                describe(metadata.file_type())
            ))
        }
        Ok(metadata) => {
            converge_directory(root, &metadata, &dir_attributes, mode, &mut counts)?;
            walk(root)?
        }
    };

    for dir in &tree.dirs {
        let path = root.join(dir);
        match existing.get(dir.as_str()) {
            None => {
                counts.created += 1;
                if mode == Mode::Apply {
                    make_directory(&path, &dir_attributes)?;
                }
            }
            Some(metadata) if metadata.is_dir() => {
                converge_directory(&path, metadata, &dir_attributes, mode, &mut counts)?
            }
            Some(metadata) => return Err(in_the_way(&path, metadata)),
        }
    }

    // New content first goes to temporary files; they are renamed into place together.
    let mut renames: Vec<(PathBuf, PathBuf)> = Vec::new();
    let result = (|| {
        for file in &tree.files {
            let path = root.join(&file.path);
            let bytes = match (&file.content, &file.content_base64) {
                (Some(text), _) => text.as_bytes().to_vec(),
                (None, Some(encoded)) => validate::decode_base64(encoded)?,
                (None, None) => Vec::new(),
            };
            let wanted = Attributes {
                mode: Some(match file_mode {
                    Some(mode) => mode,
                    None => validate::parse_mode(&file.mode)?,
                }),
                ..file_owner.clone()
            };
            match existing.get(file.path.as_str()) {
                None => {
                    counts.created += 1;
                    if mode == Mode::Apply {
                        let temporary = write_temporary(&path, &bytes, &wanted)?;
                        renames.push((temporary, path));
                    }
                }
                Some(metadata) if metadata.is_file() => {
                    let same = metadata.len() == bytes.len() as u64
                        && read_equals(&path, &bytes)
                            .map_err(|error| format!("reading {}: {error}", path.display()))?;
                    if !same {
                        counts.updated += 1;
                        if mode == Mode::Apply {
                            let target = wanted.or_current(metadata);
                            let temporary = write_temporary(&path, &bytes, &target)?;
                            renames.push((temporary, path));
                        }
                    } else if !wanted.differences(metadata).is_empty() {
                        counts.updated += 1;
                        if mode == Mode::Apply {
                            set_attributes(&path, &wanted)?;
                        }
                    }
                }
                Some(metadata) => return Err(in_the_way(&path, metadata)),
            }
        }
        Ok(())
    })();
    if let Err(error) = result {
        for (temporary, _) in &renames {
            let _ = fs::remove_file(temporary);
        }
        return Err(error);
    }
    if !renames.is_empty() {
        sync_filesystem(root)?;
        for (temporary, path) in &renames {
            if let Err(error) = fs::rename(temporary, path) {
                let _ = fs::remove_file(temporary);
                return Err(format!("renaming into {}: {error}", path.display()));
            }
        }
    }

    if tree.purge {
        let keep: HashSet<&str> = tree
            .dirs
            .iter()
            .map(String::as_str)
            .chain(tree.files.iter().map(|file| file.path.as_str()))
            .collect();
        let mut extra: Vec<(&str, &Metadata)> = existing
            .iter()
            .filter(|(path, _)| !keep.contains(path.as_str()))
            .map(|(path, metadata)| (path.as_str(), metadata))
            .collect();
        // Deepest first, so a directory is empty by the time it is removed.
        crate::sort::sort_by_key(&mut extra, |(path, _)| {
            std::cmp::Reverse(path.matches('/').count())
        });
        for (relative, metadata) in extra {
            counts.removed += 1;
            if mode == Mode::Check {
                continue;
            }
            let path = root.join(relative);
            let removed = if metadata.is_dir() {
                fs::remove_dir(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|error| format!("removing {}: {error}", path.display()))?;
        }
    }
    if counts.created + counts.updated + counts.removed > 0 && mode == Mode::Apply {
        sync_filesystem(root)?;
    }
    Ok(report(&counts, tree, mode))
}

fn report(counts: &Counts, tree: &TreeResource, mode: Mode) -> Report {
    let total = tree.files.len();
    if counts.created + counts.updated + counts.removed == 0 {
        return Report::unchanged(format!("already in state ({total} files)"));
    }
    let mut parts = Vec::new();
    for (count, word) in [
        (counts.created, "created"),
        (counts.updated, "updated"),
        (counts.removed, "removed"),
    ] {
        if count > 0 {
            parts.push(format!("{count} {word}"));
        }
    }
    let prefix = if mode == Mode::Check { "would be " } else { "" };
    Report::changed(format!(
        "{prefix}{} (tree of {total} files)",
        parts.join(", ")
    ))
}

/// Every entry below `root` by its path relative to it, without following symlinks.
fn walk(root: &Path) -> Result<HashMap<String, Metadata>, String> {
    let mut found = HashMap::new();
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                // Not UTF-8: no plan names it, so only purge could touch it, and it is left.
                continue;
            };
            let relative = format!("{prefix}{name}");
            let metadata = fs::symlink_metadata(entry.path())
                .map_err(|e| format!("inspecting {}: {e}", entry.path().display()))?;
            if metadata.is_dir() {
                pending.push((entry.path(), format!("{relative}/")));
            }
            found.insert(relative, metadata);
        }
    }
    Ok(found)
}

fn in_the_way(path: &Path, metadata: &Metadata) -> String {
    format!(
        "{} is {}, which the tree does not replace",
        path.display(),
        describe(metadata.file_type())
    )
}

fn make_directory(path: &Path, attributes: &Attributes) -> Result<(), String> {
    DirBuilder::new()
        .mode(0o700)
        .create(path)
        .and_then(|()| {
            let directory = File::open(path)?;
            attributes.apply(&directory, &directory.metadata()?)
        })
        .map_err(|error| format!("creating {}: {error}", path.display()))
}

fn converge_directory(
    path: &Path,
    metadata: &Metadata,
    wanted: &Attributes,
    mode: Mode,
    counts: &mut Counts,
) -> Result<(), String> {
    if wanted.differences(metadata).is_empty() {
        return Ok(());
    }
    counts.updated += 1;
    if mode == Mode::Check {
        return Ok(());
    }
    let directory = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(path)
        .map_err(|error| format!("opening {}: {error}", path.display()))?;
    let current = directory
        .metadata()
        .map_err(|error| format!("inspecting {}: {error}", path.display()))?;
    wanted
        .apply(&directory, &current)
        .map_err(|error| format!("updating {}: {error}", path.display()))
}

/// Compares the file at `path` with `wanted` (whose length already matched).
fn read_equals(path: &Path, wanted: &[u8]) -> io::Result<bool> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mut bytes = Vec::with_capacity(wanted.len() + 1);
    file.take(wanted.len() as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes == wanted)
}

fn set_attributes(path: &Path, wanted: &Attributes) -> Result<(), String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| format!("opening {}: {error}", path.display()))?;
    let current = file
        .metadata()
        .map_err(|error| format!("inspecting {}: {error}", path.display()))?;
    wanted
        .apply(&file, &current)
        .map_err(|error| format!("updating {}: {error}", path.display()))
}

/// A new file beside `path` with the bytes and attributes, not yet synced (see the module
/// comment); removed again if writing fails.
fn write_temporary(path: &Path, bytes: &[u8], attributes: &Attributes) -> Result<PathBuf, String> {
    let temporary = temporary_path_beside(path);
    let written = write_new_file(&temporary, bytes)
        .and_then(|file| attributes.apply(&file, &file.metadata()?));
    match written {
        Ok(()) => Ok(temporary),
        Err(error) => {
            let _ = fs::remove_file(&temporary);
            Err(format!("writing {}: {error}", path.display()))
        }
    }
}

/// Flushes the filesystem that holds `path`: one sync for all the files written before it.
fn sync_filesystem(path: &Path) -> Result<(), String> {
    let directory =
        File::open(path).map_err(|error| format!("opening {}: {error}", path.display()))?;
    // SAFETY: syncfs takes a descriptor, which `directory` keeps open for the call.
    if unsafe { libc::syncfs(directory.as_raw_fd()) } != 0 {
        return Err(format!(
            "syncing {}: {}",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{run, Plan, Resource, RunOptions};
    use std::os::unix::fs::PermissionsExt;

    fn source_tree(root: &Path) {
        fs::create_dir_all(root.join("conf.d/empty")).unwrap();
        fs::write(root.join("index.html"), "<h1>hi</h1>\n").unwrap();
        fs::write(root.join("conf.d/a.conf"), "a = 1\n").unwrap();
        fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("logo.bin"), [0u8, 255, 1]).unwrap();
    }

    fn compiled(dir: &Path, yaml: &str) -> Plan {
        crate::state::compile(yaml, dir).unwrap()
    }

    #[test]
    fn copies_the_tree_then_changes_nothing_and_purges_only_with_purge() {
        let work = tempfile::tempdir().unwrap();
        source_tree(&work.path().join("site"));
        let dest = work.path().join("www");
        let yaml = format!("- tree: {{path: {}, source: site}}\n", dest.display());
        let plan = compiled(work.path(), &yaml);
        let options = RunOptions::default();

        let check = run(&plan, Mode::Check, &options);
        assert_eq!(
            (check[0].changed, check[0].detail.as_str()),
            (true, "would be 7 created (tree of 4 files)")
        );
        assert!(!dest.exists(), "check changed the host");
        let apply = run(&plan, Mode::Apply, &options);
        assert_eq!(apply[0].detail, "7 created (tree of 4 files)", "{apply:?}");
        assert_eq!(fs::read(dest.join("logo.bin")).unwrap(), [0, 255, 1]);
        assert_eq!(
            fs::read_to_string(dest.join("conf.d/a.conf")).unwrap(),
            "a = 1\n"
        );
        assert!(dest.join("conf.d/empty").is_dir());
        let mode = |path: &str| fs::metadata(dest.join(path)).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode("run.sh"), mode("conf.d"), mode("")),
            (0o755, 0o755, 0o755)
        );
        let again = run(&plan, Mode::Apply, &options);
        assert_eq!(
            (again[0].changed, again[0].detail.as_str()),
            (false, "already in state (4 files)")
        );

        // Edits on the host come back; extra files stay without purge.
        fs::write(dest.join("index.html"), "defaced\n").unwrap();
        fs::set_permissions(dest.join("run.sh"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(dest.join("conf.d/extra.conf"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dest.join("link")).unwrap();
        let repaired = run(&plan, Mode::Apply, &options);
        assert_eq!(repaired[0].detail, "2 updated (tree of 4 files)");
        assert_eq!(
            fs::read_to_string(dest.join("index.html")).unwrap(),
            "<h1>hi</h1>\n"
        );
        assert_eq!(mode("run.sh"), 0o755);
        assert!(dest.join("conf.d/extra.conf").exists());

        let purging = compiled(
            work.path(),
            &format!(
                "- tree: {{path: {}, source: site, purge: true, mode: '0640'}}\n",
                dest.display()
            ),
        );
        let check = run(&purging, Mode::Check, &options);
        assert_eq!(
            check[0].detail,
            "would be 4 updated, 2 removed (tree of 4 files)"
        );
        assert!(dest.join("link").symlink_metadata().is_ok());
        let purged = run(&purging, Mode::Apply, &options);
        assert!(purged[0].error.is_none(), "{purged:?}");
        assert!(dest.join("conf.d/extra.conf").symlink_metadata().is_err());
        assert!(dest.join("link").symlink_metadata().is_err());
        assert!(Path::new("/etc/passwd").exists());
        assert_eq!(mode("run.sh"), 0o640);
        assert!(!run(&purging, Mode::Apply, &options)[0].changed);
    }

    #[test]
    fn what_the_tree_does_not_own_is_refused_and_bad_sources_fail_to_compile() {
        let work = tempfile::tempdir().unwrap();
        source_tree(&work.path().join("site"));
        let dest = work.path().join("www");
        fs::create_dir_all(dest.join("index.html")).unwrap();
        let plan = compiled(
            work.path(),
            &format!("- tree: {{path: {}, source: site}}\n", dest.display()),
        );
        let outcome = &run(&plan, Mode::Apply, &RunOptions::default())[0];
        assert!(
            outcome
                .error
                .as_deref()
                .unwrap()
                .ends_with("index.html is a directory, which the tree does not replace"),
            "{outcome:?}"
        );
        // Nothing half done: no temporary file is left beside the targets.
        let leftovers: Vec<_> = fs::read_dir(dest.join("conf.d"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name())
                    .collect()
            })
            .unwrap_or_default();
        assert!(leftovers
            .iter()
            .all(|name| !name.to_string_lossy().starts_with('.')));

        std::os::unix::fs::symlink("/etc", work.path().join("site/etc")).unwrap();
        let error =
            crate::state::compile("- tree: {path: /srv, source: site}\n", work.path()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("symlinks and devices are not copied"),
            "{error}"
        );
        let error =
            crate::state::compile("- tree: {path: /srv, source: nope}\n", work.path()).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("line 1: tree: source 'nope' ("),
            "{error}"
        );
        // A plan that did not come from the compiler is checked again.
        let forged = Plan::of(vec![Resource::Tree(TreeResource {
            path: "/srv".into(),
            files: vec![crate::state::TreeFile {
                path: "../etc/passwd".into(),
                mode: "0644".into(),
                ..Default::default()
            }],
            ..Default::default()
        })]);
        let refused = crate::state::validate(&forged).unwrap_err();
        assert!(
            refused.contains("must be a relative path inside the tree"),
            "{refused}"
        );
    }
}
