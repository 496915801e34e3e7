//! `archive`: a tar (plain, gzip, bzip2, xz or zstd, as GNU tar detects) or zip archive
//! extracted into a directory, once.
//!
//! "Once" is a marker file, `.svc-archive-<first 16 digits of the sha256>`, left in the
//! directory after a successful extraction (or the resource's `creates` path): while it exists
//! the resource is in state, and a new sha256 means a new marker and a new extraction. The
//! extracted files themselves are not compared, so edits to them are not drift.
//!
//! Before anything is extracted the archive is complete on disk (inlined by compile, or
//! downloaded by `download`), its SHA-256 is the one the resource gives, and its member list
//! has no absolute path and no `..`: a mismatch or such a member is an error that changes
//! nothing. The tools do the extraction with explicit arguments: `tar --no-same-owner
//! --no-overwrite-dir` (owners from the archive only with `same_owner`; directories already
//! there keep their mode and owner), and `unzip -o` for zip. GNU tar also refuses to write
//! through a symlink the archive itself made (it makes such links last), and unzip to write
//! into one. Extraction is not atomic: a failure halfway leaves what was written and no
//! marker, so the next run extracts again over it.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::download::Downloads;
use super::process;
use super::{require_parent, temporary_path_beside, write_new_file, Planned, Report};
use crate::state::{validate, ArchiveResource, Mode};

/// Listing and extracting: generous for a large archive on a slow disk, bounded for a hung
/// tool.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Digits of the sha256 in the marker's name: enough to tell versions apart.
const MARKER_DIGITS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    /// Any tar GNU tar reads, compressed or not.
    Tar,
    Zip,
}

pub(super) fn run(
    archive: &ArchiveResource,
    mode: Mode,
    planned: &mut Planned,
) -> Result<Report, String> {
    let destination = Path::new(&archive.path);
    let sha256 = archive.sha256.to_ascii_lowercase();
    let done = match &archive.creates {
        Some(creates) => PathBuf::from(creates),
        None => destination.join(marker_name(&sha256)),
    };
    if fs::symlink_metadata(&done).is_ok() {
        return Ok(Report::unchanged(format!(
            "already extracted ({} exists)",
            done.display()
        )));
    }
    let must_create = match fs::metadata(destination) {
        Ok(metadata) if metadata.is_dir() => false,
        Ok(_) => {
            return Err(format!(
                "{} is not a directory; cannot extract into it",
                destination.display()
            ))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            if planned.dirs.contains(destination) {
                false
            } else if archive.mkdir == Some(true) {
                require_parent(destination, planned)?;
                true
            } else {
                return Err(format!(
                    "{} does not exist (add a directory resource before this one, or set \
                     mkdir: true)",
                    destination.display()
                ));
            }
        }
        Err(error) => return Err(format!("cannot inspect {}: {error}", destination.display())),
    };
    // An inlined archive is checked in both modes: a wrong checksum is found by a check too.
    let inlined = match &archive.content_base64 {
        Some(encoded) => {
            let bytes = validate::decode_base64(encoded)?;
            verify(&sha256, &hex::encode(Sha256::digest(&bytes)))?;
            Some(bytes)
        }
        None => None,
    };
    let mut steps = Vec::new();
    if must_create {
        if mode == Mode::Check {
            planned.dirs.insert(destination.to_path_buf());
            steps.push(format!(
                "would create {} (mode 0755)",
                destination.display()
            ));
        } else {
            create_directory(destination)?;
            steps.push(format!("created {} (mode 0755)", destination.display()));
        }
    }
    if mode == Mode::Check {
        steps.push(match (&inlined, &archive.url) {
            (Some(bytes), _) => format!("would extract a {}-byte archive", bytes.len()),
            (None, Some(url)) => format!("would download {url} and extract it"),
            (None, None) => "would extract".into(),
        });
        return Ok(Report::changed(steps.join("; ")));
    }

    let scratch = Scratch(temporary_path_beside(&destination.join(".svc-archive")));
    let size = match (inlined, &archive.url) {
        (Some(bytes), _) => {
            write_new(&scratch.0, &bytes)
                .map_err(|error| format!("writing {}: {error}", scratch.0.display()))?;
            bytes.len() as u64
        }
        (None, Some(url)) => {
            let fetched = Downloads::default().fetch(url, &scratch.0)?;
            verify(&sha256, &fetched.sha256)?;
            steps.push(format!("downloaded {url} ({} bytes)", fetched.bytes));
            fetched.bytes
        }
        (None, None) => return Err("nothing to extract: no content_base64 or url".into()),
    };
    let format = sniff(&scratch.0)?;
    let members = check_members(format, &scratch.0)?;
    extract(
        format,
        &scratch.0,
        destination,
        archive.same_owner == Some(true),
    )?;
    steps.push(format!(
        "extracted {members} entries ({size}-byte {}) into {}",
        match format {
            Format::Tar => "tar",
            Format::Zip => "zip",
        },
        destination.display()
    ));
    match &archive.creates {
        Some(creates) if fs::symlink_metadata(creates).is_err() => {
            return Err(format!(
                "{}, but {creates} still does not exist, so every run would extract again; \
                 fix creates",
                steps.join("; ")
            ))
        }
        Some(_) => {}
        None => write_new(&done, format!("{sha256}\n").as_bytes())
            .map_err(|error| format!("writing the marker {}: {error}", done.display()))?,
    }
    Ok(Report::changed(steps.join("; ")))
}

fn marker_name(sha256: &str) -> String {
    format!(
        ".svc-archive-{}",
        &sha256[..MARKER_DIGITS.min(sha256.len())]
    )
}

fn verify(wanted: &str, actual: &str) -> Result<(), String> {
    if wanted == actual {
        return Ok(());
    }
    Err(format!(
        "sha256 mismatch: the archive is {actual}, the resource says {wanted}; nothing extracted"
    ))
}

/// The archive on disk while it is listed and extracted; removed however the run ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A new private file with `bytes`, synced: the archive's scratch copy and its marker.
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_new_file(path, bytes)?.sync_all()
}

fn create_directory(path: &Path) -> Result<(), String> {
    match DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => {}
        // Made meanwhile by another writer: extracting into it is what was asked.
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
        Err(error) => return Err(format!("creating {}: {error}", path.display())),
    }
    if let Some(parent) = path.parent() {
        super::sync_directory(parent)
            .map_err(|error| format!("syncing {}: {error}", parent.display()))?;
    }
    Ok(())
}

/// Zip by its signature; everything else goes to tar, which tells compressed tars apart itself
/// and says so when the bytes are no tar at all.
fn sniff(path: &Path) -> Result<Format, String> {
    let mut start = [0u8; 4];
    let read = File::open(path)
        .and_then(|mut file| file.read(&mut start))
        .map_err(|error| format!("reading {}: {error}", path.display()))?;
    let is_zip = read == 4 && (start == *b"PK\x03\x04" || start == *b"PK\x05\x06");
    Ok(if is_zip { Format::Zip } else { Format::Tar })
}

fn program(name: &str, format: &str) -> Result<PathBuf, String> {
    process::find_program(name)
        .ok_or_else(|| format!("{name} is not installed; it is needed to extract a {format}"))
}

/// Counts the members and finds the first unsafe one, reading the names as the archive stores
/// them (tar -t and unzip -Z1 print them raw: a leading `/` or a `..` shows). The list goes
/// to a file beside the archive and is read in full: the tail a program's output is cut to
/// would let an early member through.
fn check_members(format: Format, archive: &Path) -> Result<usize, String> {
    let archive_path = archive.to_string_lossy();
    let (program, arguments) = match format {
        Format::Tar => (
            program("tar", "tar archive")?,
            vec!["-t", "-f", &archive_path],
        ),
        Format::Zip => (program("unzip", "zip archive")?, vec!["-Z1", &archive_path]),
    };
    let listing = Scratch(temporary_path_beside(archive));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&listing.0)
        .map_err(|error| format!("creating {}: {error}", listing.0.display()))?;
    let reader = file
        .try_clone()
        .map_err(|error| format!("reading {}: {error}", listing.0.display()))?;
    let finished = process::run_program_to_file(&program, &arguments, TIMEOUT, file)?;
    if !finished.is_success() {
        return Err(format!(
            "listing the archive with {}: {}{}",
            program.display(),
            finished.describe_status(),
            finished.output_suffix()
        ));
    }
    // The clone shares the offset the program left at the end: read from the start.
    let mut reader = io::BufReader::new(reader);
    io::Seek::seek(&mut reader, io::SeekFrom::Start(0))
        .map_err(|error| format!("reading {}: {error}", listing.0.display()))?;
    let mut count = 0;
    for line in io::BufRead::split(reader, b'\n') {
        let line = line.map_err(|error| format!("reading {}: {error}", listing.0.display()))?;
        let name = String::from_utf8_lossy(&line);
        if !is_safe_member(&name) {
            return Err(format!(
                "the archive has a member '{name}' with an absolute path or '..'; nothing \
                 extracted"
            ));
        }
        count += 1;
    }
    Ok(count)
}

fn is_safe_member(name: &str) -> bool {
    !name.starts_with('/') && !name.split('/').any(|part| part == "..")
}

fn extract(
    format: Format,
    archive: &Path,
    destination: &Path,
    same_owner: bool,
) -> Result<(), String> {
    let archive_path = archive.to_string_lossy();
    let destination_path = destination.to_string_lossy();
    let (program, arguments) = match format {
        Format::Tar => (
            program("tar", "tar archive")?,
            vec![
                "-x",
                "-f",
                &archive_path,
                "-C",
                &destination_path,
                if same_owner {
                    "--same-owner"
                } else {
                    "--no-same-owner"
                },
                "--no-overwrite-dir",
            ],
        ),
        Format::Zip => {
            let mut arguments = vec!["-q", "-o"];
            if same_owner {
                arguments.push("-X");
            }
            arguments.extend([archive_path.as_ref(), "-d", &destination_path]);
            (program("unzip", "zip archive")?, arguments)
        }
    };
    let finished = process::run_program(&program, &arguments, &[], TIMEOUT)?;
    if !finished.is_success() {
        return Err(format!(
            "extracting into {} with {}: {}{}",
            destination.display(),
            program.display(),
            finished.describe_status(),
            finished.output_suffix()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::download::loopback::{ok, Server};
    use super::*;
    use base64::Engine as _;
    use std::os::unix::fs::MetadataExt;

    /// A temporary directory with `DEST` (empty) and a `src` tree to make archives of.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            for sub in ["dest", "src/app/bin"] {
                fs::create_dir_all(dir.path().join(sub)).unwrap();
            }
            fs::write(
                dir.path().join("src/app/bin/tool"),
                "#!/bin/sh\necho tool\n",
            )
            .unwrap();
            fs::write(dir.path().join("src/app/README"), "read me\n").unwrap();
            Fixture { dir }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn dest(&self) -> PathBuf {
            self.path("dest")
        }

        /// `tar ARGUMENTS` run in `src`, returning the archive it wrote to `name`.
        fn tar(&self, name: &str, arguments: &[&str]) -> Vec<u8> {
            let output = self.path(name);
            let status = std::process::Command::new("tar")
                .arg("-c")
                .arg("-f")
                .arg(&output)
                .args(arguments)
                .current_dir(self.path("src"))
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "tar {arguments:?}");
            fs::read(output).unwrap()
        }

        /// The entries of `dest`, sorted, relative to it.
        fn extracted(&self) -> Vec<String> {
            let mut found = Vec::new();
            let mut pending = vec![self.dest()];
            while let Some(directory) = pending.pop() {
                for entry in fs::read_dir(&directory).unwrap() {
                    let path = entry.unwrap().path();
                    let relative = path.strip_prefix(self.dest()).unwrap();
                    found.push(relative.to_string_lossy().into_owned());
                    if fs::symlink_metadata(&path).unwrap().is_dir() {
                        pending.push(path);
                    }
                }
            }
            found.sort();
            found
        }
    }

    fn digest(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    fn inline(fixture: &Fixture, bytes: &[u8]) -> ArchiveResource {
        ArchiveResource {
            path: fixture.dest().to_str().unwrap().into(),
            content_base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            sha256: digest(bytes),
            ..ArchiveResource::default()
        }
    }

    fn outcome(archive: &ArchiveResource, mode: Mode) -> Result<(bool, String), String> {
        run(archive, mode, &mut Planned::default()).map(|report| (report.changed, report.detail))
    }

    const APP: [&str; 5] = [
        "app",
        "app/README",
        "app/bin",
        "app/bin/tool",
        ".svc-archive-",
    ];

    fn with_marker(sha256: &str) -> Vec<String> {
        let mut expected: Vec<String> = APP[..4].iter().map(|s| s.to_string()).collect();
        expected.push(format!("{}{}", APP[4], &sha256[..16]));
        expected.sort();
        expected
    }

    #[test]
    fn an_inlined_tarball_is_extracted_once() {
        let fixture = Fixture::new();
        let bytes = fixture.tar("app.tar.gz", &["-z", "app"]);
        let archive = inline(&fixture, &bytes);
        let dest = fixture.dest();

        assert_eq!(
            outcome(&archive, Mode::Check).unwrap(),
            (
                true,
                format!("would extract a {}-byte archive", bytes.len())
            )
        );
        assert_eq!(fixture.extracted(), Vec::<String>::new(), "check extracted");

        assert_eq!(
            outcome(&archive, Mode::Apply).unwrap(),
            (
                true,
                format!(
                    "extracted 4 entries ({}-byte tar) into {}",
                    bytes.len(),
                    dest.display()
                )
            )
        );
        assert_eq!(fixture.extracted(), with_marker(&archive.sha256));
        assert_eq!(
            fs::read_to_string(dest.join("app/bin/tool")).unwrap(),
            "#!/bin/sh\necho tool\n"
        );
        let marker = dest.join(marker_name(&archive.sha256));
        assert_eq!(
            fs::read_to_string(&marker).unwrap(),
            format!("{}\n", archive.sha256)
        );
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(
                outcome(&archive, mode).unwrap(),
                (
                    false,
                    format!("already extracted ({} exists)", marker.display())
                )
            );
        }

        // A new version (another sha256) is extracted over the old one.
        fs::write(fixture.path("src/app/README"), "version 2\n").unwrap();
        let second = fixture.tar("app2.tar.xz", &["-J", "app"]);
        let upgrade = inline(&fixture, &second);
        assert!(outcome(&upgrade, Mode::Apply).unwrap().0);
        assert_eq!(
            fs::read_to_string(dest.join("app/README")).unwrap(),
            "version 2\n"
        );
        assert!(!outcome(&upgrade, Mode::Apply).unwrap().0);
    }

    #[test]
    fn a_wrong_checksum_changes_nothing() {
        let fixture = Fixture::new();
        let bytes = fixture.tar("app.tar", &["app"]);
        let wrong = ArchiveResource {
            sha256: digest(b"something else"),
            ..inline(&fixture, &bytes)
        };
        let expected = format!(
            "sha256 mismatch: the archive is {}, the resource says {}; nothing extracted",
            digest(&bytes),
            wrong.sha256
        );
        for mode in [Mode::Check, Mode::Apply] {
            assert_eq!(outcome(&wrong, mode).unwrap_err(), expected);
        }
        assert_eq!(fixture.extracted(), Vec::<String>::new());

        // Downloaded: the same, and the download is not left behind.
        let server = Server::start(vec![ok(&bytes)], None);
        let downloaded = ArchiveResource {
            content_base64: None,
            url: Some(server.url("/app.tar")),
            ..wrong
        };
        assert_eq!(outcome(&downloaded, Mode::Apply).unwrap_err(), expected);
        assert_eq!(fixture.extracted(), Vec::<String>::new());
    }

    #[test]
    fn a_url_is_downloaded_only_when_extracting() {
        let fixture = Fixture::new();
        let bytes = fixture.tar("app.tgz", &["-z", "app"]);
        let server = Server::start(vec![ok(&bytes)], None);
        let url = server.url("/releases/app.tgz");
        let archive = ArchiveResource {
            content_base64: None,
            url: Some(url.clone()),
            ..inline(&fixture, &bytes)
        };
        assert_eq!(
            outcome(&archive, Mode::Check).unwrap(),
            (true, format!("would download {url} and extract it"))
        );
        assert_eq!(server.requests(), Vec::<String>::new(), "check downloaded");
        assert_eq!(
            outcome(&archive, Mode::Apply).unwrap(),
            (
                true,
                format!(
                    "downloaded {url} ({} bytes); extracted 4 entries ({}-byte tar) into {}",
                    bytes.len(),
                    bytes.len(),
                    fixture.dest().display()
                )
            )
        );
        assert_eq!(fixture.extracted(), with_marker(&archive.sha256));
        assert!(!outcome(&archive, Mode::Apply).unwrap().0);
        assert_eq!(server.requests(), ["GET /releases/app.tgz HTTP/1.1"]);
    }

    #[test]
    fn members_outside_the_directory_are_refused() {
        let fixture = Fixture::new();
        let readme = fixture.path("src/app/README");
        let readme = readme.to_str().unwrap();
        let cases = [
            (
                fixture.tar("dots.tar", &["--transform", "s,^,../,", "app/README"]),
                "../app/README",
            ),
            (fixture.tar("absolute.tar", &["-P", readme]), readme),
            (
                crate::zip::write([("ok", &b"fine"[..]), ("a/../../evil", b"x")]).unwrap(),
                "a/../../evil",
            ),
        ];
        for (bytes, member) in cases {
            if bytes.starts_with(b"PK") && process::find_program("unzip").is_none() {
                continue;
            }
            let error = outcome(&inline(&fixture, &bytes), Mode::Apply).unwrap_err();
            assert_eq!(
                error,
                format!(
                    "the archive has a member '{member}' with an absolute path or '..'; \
                     nothing extracted"
                )
            );
            assert_eq!(fixture.extracted(), Vec::<String>::new());
        }
        assert!(!fixture.path("evil").exists());
    }

    /// The member names are fine, but the first is a link out of the directory and the second
    /// a file through it: GNU tar makes such links last, so the file fails instead of landing
    /// outside.
    #[test]
    fn tar_does_not_write_through_a_link_from_the_archive() {
        let fixture = Fixture::new();
        let outside = fixture.path("outside");
        fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, fixture.path("src/link")).unwrap();
        fixture.tar("link.tar", &["link"]);
        fs::remove_file(fixture.path("src/link")).unwrap();
        fs::create_dir(fixture.path("src/link")).unwrap();
        fs::write(fixture.path("src/link/planted"), "x").unwrap();
        // Append the directory's file under the link's name.
        let status = std::process::Command::new("tar")
            .args(["-r", "-f"])
            .arg(fixture.path("link.tar"))
            .arg("link/planted")
            .current_dir(fixture.path("src"))
            .status()
            .unwrap();
        assert!(status.success());
        let bytes = fs::read(fixture.path("link.tar")).unwrap();
        let error = outcome(&inline(&fixture, &bytes), Mode::Apply).unwrap_err();
        assert!(error.contains("exit code 2"), "{error}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        // No marker: the next run tries again.
        assert!(!fixture
            .extracted()
            .iter()
            .any(|name| name.starts_with(".svc-archive")));
    }

    #[test]
    fn zip_archives_go_to_unzip() {
        if process::find_program("unzip").is_none() {
            return;
        }
        let fixture = Fixture::new();
        let bytes = crate::zip::write([
            ("app/README", &b"read me\n"[..]),
            ("app/bin/tool", b"#!/bin/sh\n"),
        ])
        .unwrap();
        let archive = inline(&fixture, &bytes);
        let (changed, detail) = outcome(&archive, Mode::Apply).unwrap();
        assert!(changed);
        assert!(detail.starts_with("extracted 2 entries ("), "{detail}");
        assert!(detail.contains("-byte zip) into"), "{detail}");
        assert_eq!(
            fs::read_to_string(fixture.dest().join("app/README")).unwrap(),
            "read me\n"
        );
        assert!(!outcome(&archive, Mode::Apply).unwrap().0);
    }

    #[test]
    fn the_directory_must_exist_unless_mkdir() {
        let fixture = Fixture::new();
        let bytes = fixture.tar("app.tar", &["app"]);
        let missing = fixture.path("missing");
        let archive = ArchiveResource {
            path: missing.to_str().unwrap().into(),
            ..inline(&fixture, &bytes)
        };
        assert_eq!(
            outcome(&archive, Mode::Apply).unwrap_err(),
            format!(
                "{} does not exist (add a directory resource before this one, or set mkdir: \
                 true)",
                missing.display()
            )
        );
        let mkdir = ArchiveResource {
            mkdir: Some(true),
            ..archive.clone()
        };
        let mut planned = Planned::default();
        let check = run(&mkdir, Mode::Check, &mut planned).unwrap();
        assert_eq!(
            check.detail,
            format!(
                "would create {} (mode 0755); would extract a {}-byte archive",
                missing.display(),
                bytes.len()
            )
        );
        assert!(!missing.exists());
        assert!(
            planned.dirs.contains(&missing),
            "later resources may use it"
        );
        let applied = outcome(&mkdir, Mode::Apply).unwrap();
        assert!(applied.1.starts_with(&format!(
            "created {} (mode 0755); extracted 4 entries",
            missing.display()
        )));
        assert!(missing.join("app/README").exists());

        // One level only, like a directory resource.
        let deep = ArchiveResource {
            path: fixture.path("a/b").to_str().unwrap().into(),
            ..mkdir
        };
        let error = outcome(&deep, Mode::Apply).unwrap_err();
        assert!(
            error.contains("does not exist (add a directory resource"),
            "{error}"
        );
    }

    #[test]
    fn creates_replaces_the_marker() {
        let fixture = Fixture::new();
        let bytes = fixture.tar("app.tar", &["app"]);
        let tool = fixture.dest().join("app/bin/tool");
        let archive = ArchiveResource {
            creates: Some(tool.to_str().unwrap().into()),
            ..inline(&fixture, &bytes)
        };
        assert!(outcome(&archive, Mode::Apply).unwrap().0);
        assert_eq!(fixture.extracted(), APP[..4]);
        assert_eq!(
            outcome(&archive, Mode::Apply).unwrap(),
            (
                false,
                format!("already extracted ({} exists)", tool.display())
            )
        );

        let never = ArchiveResource {
            creates: Some(
                fixture
                    .dest()
                    .join("app/bin/other")
                    .to_str()
                    .unwrap()
                    .into(),
            ),
            ..archive
        };
        let error = outcome(&never, Mode::Apply).unwrap_err();
        assert!(
            error.ends_with(
                "app/bin/other still does not exist, so every run would extract again; fix creates"
            ),
            "{error}"
        );
    }

    /// Owners stored in the archive are dropped unless same_owner; only root can keep them.
    #[test]
    fn owners_come_from_the_archive_only_when_asked() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let fixture = Fixture::new();
        let bytes = fixture.tar("owned.tar", &["--owner=4321", "--group=4321", "app"]);
        assert!(outcome(&inline(&fixture, &bytes), Mode::Apply).unwrap().0);
        assert_eq!(
            fs::metadata(fixture.dest().join("app/README"))
                .unwrap()
                .uid(),
            0
        );

        let other = fixture.path("other");
        fs::create_dir(&other).unwrap();
        let keep = ArchiveResource {
            path: other.to_str().unwrap().into(),
            same_owner: Some(true),
            ..inline(&fixture, &bytes)
        };
        assert!(outcome(&keep, Mode::Apply).unwrap().0);
        let metadata = fs::metadata(other.join("app/README")).unwrap();
        assert_eq!((metadata.uid(), metadata.gid()), (4321, 4321));
    }

    #[test]
    fn what_is_not_an_archive_is_an_error_without_a_marker() {
        let fixture = Fixture::new();
        let archive = inline(&fixture, b"just some text, not a tar file at all");
        let error = outcome(&archive, Mode::Apply).unwrap_err();
        assert!(error.starts_with("listing the archive with "), "{error}");
        assert_eq!(fixture.extracted(), Vec::<String>::new());
    }
}
