//! `pkgrepo`: a package repository definition, as the host's package manager reads it.
//!
//! apt hosts get a deb822 `NAME.sources` in sources.list.d and, with a key, the key in
//! `KEYRING_DIR/NAME.asc` that the source's `Signed-By:` names (so the key signs this source
//! only, not every source as a key in trusted.gpg.d would). dnf and yum hosts get
//! `NAME.repo` in yum.repos.d, with a key text written to `KEYRING_DIR/RPM-GPG-KEY-NAME` and
//! named by `gpgkey=file://...`. The family is chosen from the programs present (apt-get, else
//! dnf or yum), as `package` does, so one resource carrying both blocks serves a mixed fleet.
//!
//! The files are rendered here and handed to the file provider, so they get its atomic
//! write, its refusal to replace what is not a regular file, and its "no implicit mkdir";
//! comparing their bytes is what makes a second apply change nothing. With `refresh`, a change
//! on apt is followed by `apt-get update` for this source alone; if that fails, the files are
//! put back as they were, so the next run writes them and refreshes again instead of leaving a
//! source whose index was never fetched.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;

use super::process;
use super::{file, Planned, Report};
use crate::state::{
    validate, AptRepository, FileResource, Mode, PkgrepoResource, Presence, YumRepository,
};

const APT_SOURCES_DIR: &str = "/etc/apt/sources.list.d";
const APT_KEYRING_DIR: &str = "/etc/apt/keyrings";
const YUM_REPOS_DIR: &str = "/etc/yum.repos.d";
const YUM_KEYRING_DIR: &str = "/etc/pki/rpm-gpg";

/// The mode of every file written: apt reads sources and keys as the unprivileged `_apt` user.
const FILE_MODE: &str = "0644";

/// An index download can be slow; this bounds a hung mirror.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(600);

/// Which package manager family this host has.
#[derive(Clone, Debug, PartialEq)]
enum Family {
    Apt { apt_get: PathBuf },
    Yum,
}

impl Family {
    fn describe(&self) -> &'static str {
        match self {
            Family::Apt { .. } => "apt (apt-get found)",
            Family::Yum => "yum (dnf or yum found)",
        }
    }
}

/// One file the repository consists of, and what it should hold (None: absent).
struct Managed {
    path: PathBuf,
    content: Option<String>,
}

pub(super) fn run(repo: &PkgrepoResource, mode: Mode, planned: &Planned) -> Result<Report, String> {
    run_with(repo, mode, planned, detect())
}

/// The provider with the family given, so tests choose it (and its apt-get).
fn run_with(
    repo: &PkgrepoResource,
    mode: Mode,
    planned: &Planned,
    family: Option<Family>,
) -> Result<Report, String> {
    let family = family.ok_or("no supported package manager found (need apt-get, dnf or yum)")?;
    let is_absent = repo.state == Some(Presence::Absent);
    let files = match (&family, &repo.apt, &repo.yum) {
        (Family::Apt { .. }, _, _) if is_absent => apt_files(repo, None),
        (Family::Yum, _, _) if is_absent => yum_files(repo, None),
        (Family::Apt { .. }, Some(apt), _) => apt_files(repo, Some(apt)),
        (Family::Yum, _, Some(yum)) => yum_files(repo, Some(yum)),
        (family, _, _) => {
            return Err(format!(
                "this host uses {}, but the resource has only {} block",
                family.describe(),
                if matches!(family, Family::Apt { .. }) {
                    "a yum"
                } else {
                    "an apt"
                }
            ))
        }
    };
    let refresh_with = match (&family, repo.refresh, is_absent) {
        (Family::Apt { apt_get }, Some(true), false) => Some(apt_get),
        _ => None,
    };
    // What the files held, to put back if the refresh fails.
    let previous: Vec<Option<Vec<u8>>> = match refresh_with {
        Some(_) if mode == Mode::Apply => {
            files.iter().map(|file| read_regular(&file.path)).collect()
        }
        _ => Vec::new(),
    };
    let mut changes = Vec::new();
    for managed in &files {
        let report = file::run(&managed.as_resource(), mode, planned, None)?;
        if report.changed {
            changes.push(format!("{}: {}", managed.file_name(), report.detail));
        }
    }
    if changes.is_empty() {
        return Ok(Report::unchanged(if is_absent {
            "already absent"
        } else {
            "already in state"
        }));
    }
    if let Some(apt_get) = refresh_with {
        // The source file is the last one (after its key).
        let source = &files[files.len() - 1].path;
        if mode == Mode::Check {
            changes.push("would run apt-get update for this source".into());
        } else if let Err(error) = refresh(apt_get, source) {
            let restored = restore(&files, previous, planned);
            return Err(format!("{error}; {restored}"));
        } else {
            changes.push("apt-get update for this source done".into());
        }
    }
    Ok(Report::changed(changes.join("; ")))
}

impl Managed {
    fn as_resource(&self) -> FileResource {
        FileResource {
            path: self.path.to_string_lossy().into_owned(),
            state: self.content.is_none().then_some(Presence::Absent),
            mode: self.content.is_some().then(|| FILE_MODE.to_string()),
            content: self.content.clone(),
            ..FileResource::default()
        }
    }

    fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The key file (when there is a key) and then the source: written in that order, so apt never
/// reads a source whose key is not there yet; removed in the other order.
fn apt_files(repo: &PkgrepoResource, apt: Option<&AptRepository>) -> Vec<Managed> {
    let sources_dir = Path::new(repo.dir.as_deref().unwrap_or(APT_SOURCES_DIR));
    let keyring_dir = Path::new(repo.keyring_dir.as_deref().unwrap_or(APT_KEYRING_DIR));
    let source_path = sources_dir.join(format!("{}.sources", repo.name));
    let key_path = keyring_dir.join(format!("{}.asc", repo.name));
    let Some(apt) = apt else {
        return vec![
            Managed {
                path: source_path,
                content: None,
            },
            Managed {
                path: key_path,
                content: None,
            },
        ];
    };
    let mut files = Vec::new();
    let mut text = format!(
        "# Managed by svc (pkgrepo {})\nTypes: deb\nURIs: {}\nSuites: {}\n",
        repo.name, apt.uri, apt.suite
    );
    if !apt.components.is_empty() {
        text.push_str(&format!("Components: {}\n", apt.components.join(" ")));
    }
    if let Some(arch) = &apt.arch {
        text.push_str(&format!("Architectures: {arch}\n"));
    }
    if let Some(key) = &apt.key {
        text.push_str(&format!("Signed-By: {}\n", key_path.display()));
        files.push(Managed {
            path: key_path,
            content: Some(key.clone()),
        });
    }
    files.push(Managed {
        path: source_path,
        content: Some(text),
    });
    files
}

/// Like apt: the key file first, then the repository file.
fn yum_files(repo: &PkgrepoResource, yum: Option<&YumRepository>) -> Vec<Managed> {
    let repos_dir = Path::new(repo.dir.as_deref().unwrap_or(YUM_REPOS_DIR));
    let keyring_dir = Path::new(repo.keyring_dir.as_deref().unwrap_or(YUM_KEYRING_DIR));
    let repo_path = repos_dir.join(format!("{}.repo", repo.name));
    let key_path = keyring_dir.join(format!("RPM-GPG-KEY-{}", repo.name));
    let Some(yum) = yum else {
        return vec![
            Managed {
                path: repo_path,
                content: None,
            },
            Managed {
                path: key_path,
                content: None,
            },
        ];
    };
    let flag = |value: Option<bool>| if value.unwrap_or(true) { 1 } else { 0 };
    let mut files = Vec::new();
    let mut text = format!(
        "# Managed by svc (pkgrepo {name})\n[{name}]\nname={name}\nbaseurl={}\nenabled={}\n\
         gpgcheck={}\n",
        yum.baseurl,
        flag(yum.enabled),
        flag(yum.gpgcheck),
        name = repo.name,
    );
    match &yum.gpgkey {
        Some(url) if validate::is_key_url(url) => text.push_str(&format!("gpgkey={url}\n")),
        Some(key) => {
            text.push_str(&format!("gpgkey=file://{}\n", key_path.display()));
            files.push(Managed {
                path: key_path,
                content: Some(key.clone()),
            });
        }
        None => {}
    }
    files.push(Managed {
        path: repo_path,
        content: Some(text),
    });
    files
}

fn detect() -> Option<Family> {
    if let Some(apt_get) = process::find_program("apt-get") {
        return Some(Family::Apt { apt_get });
    }
    process::find_program("dnf")
        .or_else(|| process::find_program("yum"))
        .map(|_| Family::Yum)
}

/// `apt-get update` reading this one source file and no other (sourceparts "-"), and keeping
/// the index files of the other sources (List-Cleanup off).
fn refresh(apt_get: &Path, source: &Path) -> Result<(), String> {
    let sourcelist = format!("Dir::Etc::sourcelist={}", source.display());
    let arguments = [
        "update",
        "-o",
        &sourcelist,
        "-o",
        "Dir::Etc::sourceparts=-",
        "-o",
        "APT::Get::List-Cleanup=0",
    ];
    let finished = process::run_program(
        apt_get,
        &arguments,
        &[("DEBIAN_FRONTEND", "noninteractive")],
        REFRESH_TIMEOUT,
    )?;
    if finished.is_success() {
        return Ok(());
    }
    Err(format!(
        "{} update for this source: {}{}",
        apt_get.display(),
        finished.describe_status(),
        finished.output_suffix()
    ))
}

/// The bytes of a regular file at `path`, None for anything else (which the file provider
/// refuses to replace anyway).
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_file() => fs::read(path).ok(),
        _ => None,
    }
}

/// Puts the files back as `previous` had them; says how that went, for the error message.
fn restore(files: &[Managed], previous: Vec<Option<Vec<u8>>>, planned: &Planned) -> String {
    let mut failures = Vec::new();
    for (managed, bytes) in files.iter().zip(previous) {
        let resource = FileResource {
            path: managed.path.to_string_lossy().into_owned(),
            state: bytes.is_none().then_some(Presence::Absent),
            content_base64: bytes
                .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
            ..FileResource::default()
        };
        if let Err(error) = file::run(&resource, Mode::Apply, planned, None) {
            failures.push(error);
        }
    }
    if failures.is_empty() {
        "the repository files were put back as they were, so the next run tries again".into()
    } else {
        format!(
            "putting the repository files back failed too: {}",
            failures.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake;
    use super::*;

    const KEY: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGR0ZXN0\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n";

    /// A temporary sources directory and keyring directory, and a resource writing into them.
    struct Scratch {
        dir: tempfile::TempDir,
    }

    impl Scratch {
        fn new() -> Scratch {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir(dir.path().join("sources")).unwrap();
            fs::create_dir(dir.path().join("keyrings")).unwrap();
            Scratch { dir }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn repo(&self) -> PkgrepoResource {
            PkgrepoResource {
                name: "example".into(),
                dir: Some(self.path("sources").to_str().unwrap().into()),
                keyring_dir: Some(self.path("keyrings").to_str().unwrap().into()),
                ..PkgrepoResource::default()
            }
        }

        /// apt-get standing in for the real one: records its arguments, fails while a file
        /// named `offline` exists.
        fn apt(&self) -> Family {
            let d = self.dir.path().display();
            let body = format!(
                "echo \"$DEBIAN_FRONTEND $*\" >> \"{d}/calls\"\n\
                 [ -e \"{d}/offline\" ] && {{ echo 'E: Failed to fetch' >&2; exit 100; }}\nexit 0"
            );
            Family::Apt {
                apt_get: fake::program(self.dir.path(), "apt-get", &body),
            }
        }

        fn calls(&self) -> String {
            fs::read_to_string(self.path("calls")).unwrap_or_default()
        }

        fn read(&self, name: &str) -> String {
            fs::read_to_string(self.path(name)).unwrap()
        }
    }

    fn apt_block() -> AptRepository {
        AptRepository {
            uri: "https://deb.example.com/debian".into(),
            suite: "bookworm".into(),
            components: vec!["main".into(), "contrib".into()],
            arch: Some("amd64".into()),
            key: Some(KEY.into()),
            key_source: None,
        }
    }

    fn outcome(
        repo: &PkgrepoResource,
        mode: Mode,
        family: &Family,
    ) -> Result<(bool, String), String> {
        run_with(repo, mode, &Planned::default(), Some(family.clone()))
            .map(|report| (report.changed, report.detail))
    }

    #[test]
    fn apt_source_and_key_written_once() {
        let scratch = Scratch::new();
        let apt = scratch.apt();
        let repo = PkgrepoResource {
            apt: Some(apt_block()),
            ..scratch.repo()
        };
        let keyring = scratch.path("keyrings/example.asc");
        let source_text = format!(
            "# Managed by svc (pkgrepo example)\nTypes: deb\n\
             URIs: https://deb.example.com/debian\nSuites: bookworm\n\
             Components: main contrib\nArchitectures: amd64\nSigned-By: {}\n",
            keyring.display()
        );
        let (changed, detail) = outcome(&repo, Mode::Check, &apt).unwrap();
        assert!(changed);
        assert_eq!(
            detail,
            format!(
                "example.asc: would create ({} bytes, mode 0644); example.sources: would create \
                 ({} bytes, mode 0644)",
                KEY.len(),
                source_text.len()
            )
        );
        assert!(
            !scratch.path("sources/example.sources").exists(),
            "check wrote"
        );
        assert!(!keyring.exists(), "check wrote");

        assert!(outcome(&repo, Mode::Apply, &apt).unwrap().0);
        assert_eq!(scratch.read("sources/example.sources"), source_text);
        assert_eq!(scratch.read("keyrings/example.asc"), KEY);
        for name in ["sources/example.sources", "keyrings/example.asc"] {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(scratch.path(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o644, "{name}");
        }
        for mode in [Mode::Apply, Mode::Check] {
            assert_eq!(
                outcome(&repo, mode, &apt).unwrap(),
                (false, "already in state".into())
            );
        }
        // Without refresh, apt-get is never run.
        assert_eq!(scratch.calls(), "");

        // Drift: an edited source is put back, the key is left as it is.
        fs::write(scratch.path("sources/example.sources"), "Types: deb\n").unwrap();
        let (changed, detail) = outcome(&repo, Mode::Apply, &apt).unwrap();
        assert!(changed);
        assert_eq!(
            detail,
            format!(
                "example.sources: content differs (11 -> {} bytes)",
                source_text.len()
            )
        );

        let absent = PkgrepoResource {
            state: Some(Presence::Absent),
            ..scratch.repo()
        };
        assert_eq!(
            outcome(&absent, Mode::Check, &apt).unwrap(),
            (
                true,
                format!(
                    "example.sources: would remove ({} bytes); example.asc: would remove ({} \
                     bytes)",
                    source_text.len(),
                    KEY.len()
                )
            )
        );
        assert!(outcome(&absent, Mode::Apply, &apt).unwrap().0);
        assert!(!scratch.path("sources/example.sources").exists());
        assert!(!keyring.exists());
        assert_eq!(
            outcome(&absent, Mode::Apply, &apt).unwrap(),
            (false, "already absent".into())
        );
    }

    #[test]
    fn flat_repository_without_key_or_arch() {
        let scratch = Scratch::new();
        let apt = scratch.apt();
        let repo = PkgrepoResource {
            apt: Some(AptRepository {
                uri: "file:/srv/debs".into(),
                suite: "./".into(),
                ..AptRepository::default()
            }),
            ..scratch.repo()
        };
        assert!(outcome(&repo, Mode::Apply, &apt).unwrap().0);
        assert_eq!(
            scratch.read("sources/example.sources"),
            "# Managed by svc (pkgrepo example)\nTypes: deb\nURIs: file:/srv/debs\nSuites: ./\n"
        );
        assert_eq!(fs::read_dir(scratch.path("keyrings")).unwrap().count(), 0);
    }

    /// The real apt reads what was written: `apt-get indextargets` parses the sources it is
    /// pointed at and lists the index files it would fetch, without fetching anything.
    #[test]
    fn apt_reads_the_source_file() {
        let Some(Family::Apt { apt_get }) = detect() else {
            return;
        };
        let scratch = Scratch::new();
        let repo = PkgrepoResource {
            apt: Some(apt_block()),
            ..scratch.repo()
        };
        run_with(&repo, Mode::Apply, &Planned::default(), Some(scratch.apt())).unwrap();
        fs::create_dir_all(scratch.path("lists/partial")).unwrap();
        fs::create_dir(scratch.path("cache")).unwrap();
        let options = [
            format!(
                "Dir::Etc::sourcelist={}",
                scratch.path("sources/example.sources").display()
            ),
            "Dir::Etc::sourceparts=-".into(),
            format!("Dir::State::Lists={}", scratch.path("lists").display()),
            format!("Dir::Cache={}", scratch.path("cache").display()),
        ];
        let mut arguments = Vec::new();
        for option in &options {
            arguments.extend(["-o", option.as_str()]);
        }
        arguments.extend([
            "indextargets",
            "--no-release-info",
            "--format",
            "$(URI)",
            "Identifier: Packages",
        ]);
        let finished =
            process::run_program(&apt_get, &arguments, &[], Duration::from_secs(60)).unwrap();
        assert!(finished.is_success(), "{finished:?}");
        // Architectures: amd64 is honoured: only amd64 and the "all" indices.
        let uris: Vec<&str> = finished.stdout.lines().collect();
        let base = "https://deb.example.com/debian/dists/bookworm";
        assert_eq!(
            uris,
            [
                format!("{base}/main/binary-amd64/Packages"),
                format!("{base}/main/binary-all/Packages"),
                format!("{base}/contrib/binary-amd64/Packages"),
                format!("{base}/contrib/binary-all/Packages"),
            ]
        );
    }

    #[test]
    fn refresh_runs_for_this_source_only_and_failures_roll_back() {
        let scratch = Scratch::new();
        let apt = scratch.apt();
        let repo = PkgrepoResource {
            apt: Some(apt_block()),
            refresh: Some(true),
            ..scratch.repo()
        };
        let source = scratch.path("sources/example.sources");
        let expected_call = format!(
            "noninteractive update -o Dir::Etc::sourcelist={} -o Dir::Etc::sourceparts=- -o \
             APT::Get::List-Cleanup=0\n",
            source.display()
        );

        let (changed, detail) = outcome(&repo, Mode::Check, &apt).unwrap();
        assert!(changed && detail.ends_with("; would run apt-get update for this source"));
        assert_eq!(scratch.calls(), "");

        // Offline: the update fails and the files are taken away again.
        fs::write(scratch.path("offline"), "").unwrap();
        let error = outcome(&repo, Mode::Apply, &apt).unwrap_err();
        assert!(
            error.contains("update for this source: exit code 100")
                && error.contains("E: Failed to fetch")
                && error.ends_with(
                    "; the repository files were put back as they were, so the next run tries \
                     again"
                ),
            "{error}"
        );
        assert!(!source.exists());
        assert!(!scratch.path("keyrings/example.asc").exists());
        assert_eq!(scratch.calls(), expected_call);

        // An earlier version of the source comes back as it was.
        fs::write(&source, "old\n").unwrap();
        outcome(&repo, Mode::Apply, &apt).unwrap_err();
        assert_eq!(scratch.read("sources/example.sources"), "old\n");

        fs::remove_file(scratch.path("offline")).unwrap();
        let (changed, detail) = outcome(&repo, Mode::Apply, &apt).unwrap();
        assert!(changed && detail.ends_with("; apt-get update for this source done"));
        assert_eq!(scratch.calls(), expected_call.repeat(3));
        // Nothing changed, nothing refreshed.
        assert!(!outcome(&repo, Mode::Apply, &apt).unwrap().0);
        assert_eq!(scratch.calls(), expected_call.repeat(3));
    }

    #[test]
    fn yum_repository_with_key_text_or_url() {
        let scratch = Scratch::new();
        let repo = PkgrepoResource {
            yum: Some(YumRepository {
                baseurl: "https://rpm.example.com/el9/$basearch/".into(),
                gpgkey: Some(KEY.into()),
                ..YumRepository::default()
            }),
            ..scratch.repo()
        };
        let (changed, detail) = outcome(&repo, Mode::Check, &Family::Yum).unwrap();
        assert!(changed && detail.starts_with("RPM-GPG-KEY-example: would create"));
        assert!(outcome(&repo, Mode::Apply, &Family::Yum).unwrap().0);
        let key_path = scratch.path("keyrings/RPM-GPG-KEY-example");
        assert_eq!(
            scratch.read("sources/example.repo"),
            format!(
                "# Managed by svc (pkgrepo example)\n[example]\nname=example\n\
                 baseurl=https://rpm.example.com/el9/$basearch/\nenabled=1\ngpgcheck=1\n\
                 gpgkey=file://{}\n",
                key_path.display()
            )
        );
        assert_eq!(fs::read_to_string(&key_path).unwrap(), KEY);
        assert!(!outcome(&repo, Mode::Apply, &Family::Yum).unwrap().0);

        let by_url = PkgrepoResource {
            yum: Some(YumRepository {
                baseurl: "https://rpm.example.com/el9/".into(),
                gpgkey: Some("https://rpm.example.com/key.asc".into()),
                gpgcheck: Some(true),
                enabled: Some(false),
                key_source: None,
            }),
            ..scratch.repo()
        };
        let (changed, detail) = outcome(&by_url, Mode::Apply, &Family::Yum).unwrap();
        assert!(changed, "{detail}");
        assert!(
            detail.starts_with("example.repo: content differs ("),
            "{detail}"
        );
        assert!(scratch
            .read("sources/example.repo")
            .ends_with("enabled=0\ngpgcheck=1\ngpgkey=https://rpm.example.com/key.asc\n"));
        // The key file written before is not this resource's any more; absent removes both.
        let absent = PkgrepoResource {
            state: Some(Presence::Absent),
            ..scratch.repo()
        };
        assert!(outcome(&absent, Mode::Apply, &Family::Yum).unwrap().0);
        assert!(!key_path.exists());
    }

    #[test]
    fn the_host_family_must_have_a_block() {
        let scratch = Scratch::new();
        let yum_only = PkgrepoResource {
            yum: Some(YumRepository {
                baseurl: "https://rpm.example.com/".into(),
                ..YumRepository::default()
            }),
            ..scratch.repo()
        };
        assert_eq!(
            outcome(&yum_only, Mode::Check, &scratch.apt()).unwrap_err(),
            "this host uses apt (apt-get found), but the resource has only a yum block"
        );
        let apt_only = PkgrepoResource {
            apt: Some(apt_block()),
            ..scratch.repo()
        };
        assert_eq!(
            outcome(&apt_only, Mode::Check, &Family::Yum).unwrap_err(),
            "this host uses yum (dnf or yum found), but the resource has only an apt block"
        );
        // Both blocks: each host takes its own.
        let both = PkgrepoResource {
            apt: apt_only.apt.clone(),
            ..yum_only.clone()
        };
        assert!(outcome(&both, Mode::Apply, &Family::Yum).unwrap().0);
        assert!(scratch.path("sources/example.repo").exists());
        assert!(outcome(&both, Mode::Apply, &scratch.apt()).unwrap().0);
        assert!(scratch.path("sources/example.sources").exists());

        let error = run_with(&both, Mode::Check, &Planned::default(), None).unwrap_err();
        assert!(error.starts_with("no supported package manager"), "{error}");
    }

    #[test]
    fn missing_directories_are_not_made() {
        let scratch = Scratch::new();
        let repo = PkgrepoResource {
            apt: Some(apt_block()),
            keyring_dir: Some(scratch.path("no-keyrings").to_str().unwrap().into()),
            ..scratch.repo()
        };
        let error = outcome(&repo, Mode::Apply, &scratch.apt()).unwrap_err();
        assert!(
            error.contains("no-keyrings does not exist (add a directory resource"),
            "{error}"
        );
        assert!(!scratch.path("sources/example.sources").exists());
    }
}
