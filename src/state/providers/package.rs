//! `package`: a package installed or absent, through the host's own package manager.
//!
//! Debian family: `dpkg-query` says what is installed, `apt-get` changes it. Red Hat family:
//! `rpm -q` and `dnf` (or `yum` where dnf is missing). The manager is detected per run from
//! the programs present, so one plan serves a mixed fleet. After a change the package is
//! queried again: a manager that exits 0 without reaching the state (a held package, a
//! virtual name) is reported as an error instead of changing again on every apply.
//!
//! A `version` pin is installed as `name=version` (apt, with `--allow-downgrades`: a pin is a
//! version, not a minimum) or `name-version` (dnf, which upgrades or downgrades to it; yum,
//! the fallback, cannot downgrade this way). The installed version is compared as each
//! manager reads the pin: whole for dpkg, as far as the pin goes for rpm (see
//! `Manager::version_matches`).
//!
//! The package index is not refreshed (no `apt-get update`): that is slow, needs the network,
//! and is a decision for the operator (a `command` resource with a guard).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::process::{self, Finished};
use super::Report;
use crate::state::{Mode, PackageResource};

/// Installing can mean downloading; this bounds a hung mirror, not a normal install.
const TIMEOUT: Duration = Duration::from_secs(600);
const QUERY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, PartialEq)]
enum Manager {
    Apt {
        dpkg_query: PathBuf,
        apt_get: PathBuf,
    },
    Dnf {
        rpm: PathBuf,
        dnf: PathBuf,
    },
}

pub(super) fn run(package: &PackageResource, mode: Mode) -> Result<Report, String> {
    run_with(package, mode, detect())
}

/// The provider with the manager given, so tests can take the "none found" path.
fn run_with(
    package: &PackageResource,
    mode: Mode,
    manager: Option<Manager>,
) -> Result<Report, String> {
    let manager = manager.ok_or(
        "no supported package manager found (need dpkg-query and apt-get, or rpm and dnf)",
    )?;
    let name = package.name.as_str();
    let wants_installed = package.state != Some(crate::state::PackageState::Absent);
    let pin = package.version.as_deref();
    let installed = installed_versions(&manager, name)?;
    let is_in_state = match (wants_installed, pin) {
        (false, _) => installed.is_empty(),
        (true, None) => !installed.is_empty(),
        (true, Some(pin)) => installed
            .iter()
            .any(|version| manager.version_matches(version, pin)),
    };
    if is_in_state {
        return Ok(Report::unchanged(match (wants_installed, pin) {
            (false, _) => "already absent".to_string(),
            (true, None) => "already installed".to_string(),
            (true, Some(pin)) => format!("already installed ({pin})"),
        }));
    }
    let (would, done) = match (wants_installed, pin) {
        (false, _) => ("would remove".to_string(), "removed".to_string()),
        (true, None) => ("would install".to_string(), "installed".to_string()),
        (true, Some(pin)) if installed.is_empty() => {
            (format!("would install {pin}"), format!("installed {pin}"))
        }
        (true, Some(pin)) => {
            let change = format!("version {} -> {pin}", installed.join(", "));
            (change.clone(), change)
        }
    };
    if mode == Mode::Check {
        return Ok(Report::changed(would));
    }
    let action = if wants_installed { "install" } else { "remove" };
    let spec = match pin {
        Some(pin) => manager.pinned(name, pin),
        None => name.to_string(),
    };
    let mut arguments = vec![action, "-y"];
    let (program, environment): (&PathBuf, &[(&str, &str)]) = match &manager {
        // noninteractive: no debconf prompt may wait for a terminal that is not there.
        Manager::Apt { apt_get, .. } => {
            // A pin is a version, not a minimum: apt-get only goes down when told it may.
            if pin.is_some() {
                arguments.push("--allow-downgrades");
            }
            (apt_get, &[("DEBIAN_FRONTEND", "noninteractive")])
        }
        // dnf install with a version upgrades or downgrades to it.
        Manager::Dnf { dnf, .. } => (dnf, &[]),
    };
    arguments.push(&spec);
    let command = format!("{} {}", program.display(), arguments.join(" "));
    let finished = process::run_program(program, &arguments, environment, TIMEOUT)?;
    if !finished.is_success() {
        return Err(format!(
            "{command}: {}{}",
            finished.describe_status(),
            finished.output_suffix()
        ));
    }
    let now = installed_versions(&manager, name)?;
    let is_reached = match (wants_installed, pin) {
        (false, _) => now.is_empty(),
        (true, None) => !now.is_empty(),
        (true, Some(pin)) => now
            .iter()
            .any(|version| manager.version_matches(version, pin)),
    };
    if !is_reached {
        let found = match (wants_installed, now.is_empty()) {
            (true, true) => "not installed".to_string(),
            (true, false) => format!("at version {}", now.join(", ")),
            (false, _) => "installed".to_string(),
        };
        return Err(format!(
            "{command} exited 0 but the package is still {found}"
        ));
    }
    Ok(Report::changed(done))
}

impl Manager {
    /// The argument that installs `name` at `version`.
    fn pinned(&self, name: &str, version: &str) -> String {
        match self {
            Manager::Apt { .. } => format!("{name}={version}"),
            Manager::Dnf { .. } => format!("{name}-{version}"),
        }
    }

    /// Whether an installed version is the pinned one. dpkg versions are compared whole, as
    /// apt takes `name=version` (the epoch is part of it). RPM versions as dnf takes
    /// `name-version`: a pin without an epoch ignores the epoch, one without a release
    /// ignores the release.
    fn version_matches(&self, installed: &str, pin: &str) -> bool {
        match self {
            Manager::Apt { .. } => installed == pin,
            Manager::Dnf { .. } => {
                let installed = RpmVersion::parse(installed);
                let pin = RpmVersion::parse(pin);
                // rpm prints no epoch for epoch 0.
                pin.version == installed.version
                    && pin
                        .epoch
                        .is_none_or(|epoch| epoch == installed.epoch.unwrap_or("0"))
                    && pin
                        .release
                        .is_none_or(|release| Some(release) == installed.release)
            }
        }
    }
}

/// `[epoch:]version[-release]`; RPM versions and releases have no `-` of their own.
struct RpmVersion<'a> {
    epoch: Option<&'a str>,
    version: &'a str,
    release: Option<&'a str>,
}

impl<'a> RpmVersion<'a> {
    fn parse(text: &'a str) -> RpmVersion<'a> {
        let (epoch, rest) = match text.split_once(':') {
            Some((epoch, rest)) => (Some(epoch), rest),
            None => (None, text),
        };
        let (version, release) = match rest.rsplit_once('-') {
            Some((version, release)) => (version, Some(release)),
            None => (rest, None),
        };
        RpmVersion {
            epoch,
            version,
            release,
        }
    }
}

fn detect() -> Option<Manager> {
    if let (Some(dpkg_query), Some(apt_get)) = (
        process::find_program("dpkg-query"),
        process::find_program("apt-get"),
    ) {
        return Some(Manager::Apt {
            dpkg_query,
            apt_get,
        });
    }
    let rpm = process::find_program("rpm")?;
    let dnf = process::find_program("dnf").or_else(|| process::find_program("yum"))?;
    Some(Manager::Dnf { rpm, dnf })
}

/// The versions of `name` installed (several for multiarch or multilib copies); empty when it
/// is not installed.
fn installed_versions(manager: &Manager, name: &str) -> Result<Vec<String>, String> {
    match manager {
        Manager::Apt { dpkg_query, .. } => {
            // One line per matching package (a name can match several architectures);
            // "install ok installed" and "hold ok installed" both end in "installed", while a
            // removed package left with its configuration is "deinstall ok config-files".
            let finished = query(
                dpkg_query,
                &["-W", "--showformat=${Status}\\t${Version}\\n", name],
            )?;
            match finished.status.and_then(|status| status.code()) {
                Some(0) => Ok(finished
                    .stdout
                    .lines()
                    .filter_map(|line| {
                        let (status, version) = line.split_once('\t')?;
                        (status.split_whitespace().nth(2) == Some("installed"))
                            .then(|| version.trim().to_string())
                    })
                    .collect()),
                // 1: no package by that name is known at all.
                Some(1) => Ok(Vec::new()),
                _ => Err(query_failure(dpkg_query, &finished)),
            }
        }
        Manager::Dnf { rpm, .. } => {
            let format = "%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\n";
            let finished = query(rpm, &["-q", "--queryformat", format, name])?;
            match finished.status.and_then(|status| status.code()) {
                Some(0) => Ok(finished
                    .stdout
                    .lines()
                    .map(|line| line.trim().to_string())
                    .filter(|line| !line.is_empty())
                    .collect()),
                Some(1) => Ok(Vec::new()),
                _ => Err(query_failure(rpm, &finished)),
            }
        }
    }
}

fn query(program: &Path, arguments: &[&str]) -> Result<Finished, String> {
    process::run_program(program, arguments, &[], QUERY_TIMEOUT)
}

fn query_failure(program: &Path, finished: &Finished) -> String {
    format!(
        "{}: {}{}",
        program.display(),
        finished.describe_status(),
        finished.output_suffix()
    )
}

#[cfg(test)]
mod tests {
    use super::super::fake;
    use super::*;

    fn package(name: &str, state: Option<&str>) -> PackageResource {
        PackageResource {
            name: name.into(),
            state: state.map(|s| serde_json::from_value(serde_json::json!(s)).unwrap()),
            version: None,
        }
    }

    fn pinned(name: &str, version: &str) -> PackageResource {
        PackageResource {
            version: Some(version.into()),
            ..package(name, None)
        }
    }

    #[test]
    fn no_manager_is_a_clear_error() {
        let error = run_with(&package("nginx", None), Mode::Check, None).unwrap_err();
        assert!(
            error.starts_with("no supported package manager found"),
            "{error}"
        );
    }

    /// apt-get and dpkg-query stand-ins keeping the package database in two files of `dir`:
    /// `installed` ("name version" lines), and `removed` (names left with configuration:
    /// "deinstall ok config-files"). `held` installs "successfully" without installing, `nope`
    /// does not exist, version 9.9 of anything does not exist, and asking about `locked` fails
    /// as a locked database does.
    fn fake_apt(dir: &Path) -> Manager {
        let d = dir.display();
        std::fs::write(dir.join("installed"), "").unwrap();
        std::fs::write(dir.join("removed"), "").unwrap();
        let dpkg_query = format!(
            r#"name="$3"
line=$(grep "^$name " "{d}/installed") && {{ printf 'install ok installed\t%s\n' "${{line#* }}"; exit 0; }}
grep -qx "$name" "{d}/removed" && {{ printf 'deinstall ok config-files\t1.0\n'; exit 0; }}
[ "$name" = locked ] && {{ echo "dpkg-query: database is locked" >&2; exit 2; }}
echo "dpkg-query: no packages found matching $name" >&2; exit 1"#
        );
        let apt_get = format!(
            r#"echo "$DEBIAN_FRONTEND $*" >> "{d}/calls"
for spec; do :; done
case "$spec" in *=*) name="${{spec%%=*}}"; version="${{spec#*=}}";; *) name="$spec"; version=1.0;; esac
[ "$name" = held ] && exit 0
[ "$name" = nope ] && {{ echo "E: Unable to locate package nope" >&2; exit 100; }}
[ "$version" = 9.9 ] && {{ echo "E: Version '9.9' for '$name' was not found" >&2; exit 100; }}
{}"#,
            database_update(&d.to_string())
        );
        Manager::Apt {
            dpkg_query: fake::program(dir, "dpkg-query", &dpkg_query),
            apt_get: fake::program(dir, "apt-get", &apt_get),
        }
    }

    /// rpm and dnf stand-ins over the same two files. dnf takes `name-version` and installs
    /// a version without a release as release 1.el9.
    fn fake_dnf(dir: &Path) -> Manager {
        let d = dir.display();
        std::fs::write(dir.join("installed"), "").unwrap();
        std::fs::write(dir.join("removed"), "").unwrap();
        let rpm = format!(
            r#"line=$(grep "^$4 " "{d}/installed") && {{ echo "${{line#* }}"; exit 0; }}
echo "package $4 is not installed"; exit 1"#
        );
        let dnf = format!(
            r#"echo "$*" >> "{d}/calls"
spec="$3"
name=$(echo "$spec" | sed 's/-[0-9].*//')
version="${{spec#"$name"}}"; version="${{version#-}}"
case "$version" in "") version=1.0-1.el9;; *-*) ;; *) version="$version-1.el9";; esac
{}"#,
            database_update(&d.to_string())
        );
        Manager::Dnf {
            rpm: fake::program(dir, "rpm", &rpm),
            dnf: fake::program(dir, "dnf", &dnf),
        }
    }

    /// `install|remove ... SPEC` against the files of the fakes above, once the caller has set
    /// `name` and `version` from SPEC.
    fn database_update(d: &str) -> String {
        format!(
            r#"grep -v "^$name " "{d}/installed" > "{d}/tmp"; mv "{d}/tmp" "{d}/installed"
case "$1" in
install) echo "$name $version" >> "{d}/installed"; grep -vx "$name" "{d}/removed" > "{d}/tmp"; mv "{d}/tmp" "{d}/removed";;
remove) echo "$name" >> "{d}/removed";;
esac"#
        )
    }

    fn outcome(package: &PackageResource, mode: Mode, manager: &Manager) -> (bool, String) {
        let report = run_with(package, mode, Some(manager.clone())).unwrap();
        (report.changed, report.detail)
    }

    fn calls(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("calls")).unwrap_or_default()
    }

    #[test]
    fn install_and_remove_through_apt_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let apt = fake_apt(dir.path());
        let nginx = package("nginx", None);
        assert_eq!(
            outcome(&nginx, Mode::Check, &apt),
            (true, "would install".into())
        );
        assert_eq!(calls(dir.path()), "", "check changed something");
        assert_eq!(
            outcome(&nginx, Mode::Apply, &apt),
            (true, "installed".into())
        );
        assert_eq!(
            outcome(&nginx, Mode::Apply, &apt),
            (false, "already installed".into())
        );
        // No debconf prompt can wait for a terminal.
        assert_eq!(calls(dir.path()), "noninteractive install -y nginx\n");

        let gone = package("nginx", Some("absent"));
        assert_eq!(
            outcome(&gone, Mode::Check, &apt),
            (true, "would remove".into())
        );
        assert_eq!(outcome(&gone, Mode::Apply, &apt), (true, "removed".into()));
        // Removed with its configuration left behind is absent.
        assert_eq!(
            outcome(&gone, Mode::Apply, &apt),
            (false, "already absent".into())
        );
        assert_eq!(
            calls(dir.path()),
            "noninteractive install -y nginx\nnoninteractive remove -y nginx\n"
        );
    }

    #[test]
    fn apt_failures_say_what_went_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let apt = fake_apt(dir.path());
        let error = run_with(&package("held", None), Mode::Apply, Some(apt.clone())).unwrap_err();
        assert!(
            error.ends_with("install -y held exited 0 but the package is still not installed"),
            "{error}"
        );
        let error = run_with(&package("nope", None), Mode::Apply, Some(apt.clone())).unwrap_err();
        assert!(
            error.contains("install -y nope: exit code 100")
                && error.ends_with("stderr:\nE: Unable to locate package nope"),
            "{error}"
        );
        let error = run_with(&package("locked", None), Mode::Check, Some(apt)).unwrap_err();
        assert!(
            error.contains("dpkg-query: exit code 2") && error.contains("database is locked"),
            "{error}"
        );
    }

    #[test]
    fn install_and_remove_through_dnf_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let dnf = fake_dnf(dir.path());
        let nginx = package("nginx", Some("installed"));
        assert_eq!(
            outcome(&nginx, Mode::Apply, &dnf),
            (true, "installed".into())
        );
        assert_eq!(
            outcome(&nginx, Mode::Apply, &dnf),
            (false, "already installed".into())
        );
        let gone = package("nginx", Some("absent"));
        assert_eq!(outcome(&gone, Mode::Apply, &dnf), (true, "removed".into()));
        assert_eq!(
            outcome(&gone, Mode::Apply, &dnf),
            (false, "already absent".into())
        );
        assert_eq!(calls(dir.path()), "install -y nginx\nremove -y nginx\n");
    }

    #[test]
    fn pins_through_apt() {
        let dir = tempfile::tempdir().unwrap();
        let apt = fake_apt(dir.path());
        let new = pinned("nginx", "1.22-1");
        assert_eq!(
            outcome(&new, Mode::Check, &apt),
            (true, "would install 1.22-1".into())
        );
        assert_eq!(calls(dir.path()), "", "check changed something");
        assert_eq!(
            outcome(&new, Mode::Apply, &apt),
            (true, "installed 1.22-1".into())
        );
        assert_eq!(
            outcome(&new, Mode::Apply, &apt),
            (false, "already installed (1.22-1)".into())
        );
        // Any version will do without a pin.
        assert_eq!(
            outcome(&package("nginx", None), Mode::Check, &apt),
            (false, "already installed".into())
        );

        let older = pinned("nginx", "1.20-1");
        let change = (true, "version 1.22-1 -> 1.20-1".to_string());
        assert_eq!(outcome(&older, Mode::Check, &apt), change);
        assert_eq!(outcome(&older, Mode::Apply, &apt), change);
        assert_eq!(
            outcome(&older, Mode::Apply, &apt),
            (false, "already installed (1.20-1)".into())
        );
        // apt compares whole versions: an epoch is part of one.
        assert_eq!(
            outcome(&pinned("nginx", "2:1.20-1"), Mode::Check, &apt),
            (true, "version 1.20-1 -> 2:1.20-1".into())
        );
        assert_eq!(
            calls(dir.path()),
            "noninteractive install -y --allow-downgrades nginx=1.22-1\n\
             noninteractive install -y --allow-downgrades nginx=1.20-1\n"
        );

        let missing =
            run_with(&pinned("nginx", "9.9"), Mode::Apply, Some(apt.clone())).unwrap_err();
        assert!(
            missing.contains("install -y --allow-downgrades nginx=9.9: exit code 100")
                && missing.ends_with("E: Version '9.9' for 'nginx' was not found"),
            "{missing}"
        );
        std::fs::write(dir.path().join("installed"), "held 1.0\n").unwrap();
        let held = run_with(&pinned("held", "2.0"), Mode::Apply, Some(apt)).unwrap_err();
        assert!(
            held.ends_with("held=2.0 exited 0 but the package is still at version 1.0"),
            "{held}"
        );
    }

    #[test]
    fn pins_through_dnf() {
        let dir = tempfile::tempdir().unwrap();
        let dnf = fake_dnf(dir.path());
        // A pin without a release takes any release.
        assert_eq!(
            outcome(&pinned("nginx", "2.4"), Mode::Apply, &dnf),
            (true, "installed 2.4".into())
        );
        for pin in ["2.4", "2.4-1.el9", "0:2.4-1.el9"] {
            assert_eq!(
                outcome(&pinned("nginx", pin), Mode::Apply, &dnf),
                (false, format!("already installed ({pin})"))
            );
        }
        let next = pinned("nginx", "2.4-2.el9");
        let change = (true, "version 2.4-1.el9 -> 2.4-2.el9".to_string());
        assert_eq!(outcome(&next, Mode::Check, &dnf), change);
        assert_eq!(outcome(&next, Mode::Apply, &dnf), change);
        assert!(!outcome(&next, Mode::Apply, &dnf).0);
        assert_eq!(
            calls(dir.path()),
            "install -y nginx-2.4\ninstall -y nginx-2.4-2.el9\n"
        );
    }

    #[test]
    fn rpm_versions_match_as_far_as_the_pin_goes() {
        let dnf = Manager::Dnf {
            rpm: PathBuf::from("/bin/rpm"),
            dnf: PathBuf::from("/bin/dnf"),
        };
        let cases = [
            ("1:2.4-1.el9", "2.4", true),
            ("1:2.4-1.el9", "2.4-1.el9", true),
            ("1:2.4-1.el9", "1:2.4-1.el9", true),
            ("1:2.4-1.el9", "1:2.4", true),
            ("1:2.4-1.el9", "0:2.4", false),
            ("1:2.4-1.el9", "2:2.4", false),
            ("1:2.4-1.el9", "2.4-2.el9", false),
            ("1:2.4-1.el9", "2.40", false),
            ("2.4-1.el9", "0:2.4", true),
        ];
        for (installed, pin, expected) in cases {
            assert_eq!(
                dnf.version_matches(installed, pin),
                expected,
                "{installed} {pin}"
            );
        }
        let apt = Manager::Apt {
            dpkg_query: PathBuf::from("/bin/dpkg-query"),
            apt_get: PathBuf::from("/bin/apt-get"),
        };
        assert!(apt.version_matches("1:2.4-1", "1:2.4-1"));
        assert!(!apt.version_matches("1:2.4-1", "2.4-1"));
    }

    /// Check mode only: tests never install or remove packages on this host.
    #[test]
    fn check_mode_against_this_host() {
        let Some(manager) = detect() else {
            // A host with neither: the fakes above cover both managers.
            return;
        };
        // coreutils is installed on every Debian and Red Hat system.
        let cases = [
            ("coreutils", None, false, "already installed"),
            ("coreutils", Some("absent"), true, "would remove"),
            (
                "svc-no-such-package",
                Some("absent"),
                false,
                "already absent",
            ),
            (
                "svc-no-such-package",
                Some("installed"),
                true,
                "would install",
            ),
        ];
        for (name, state, changed, detail) in cases {
            let report =
                run_with(&package(name, state), Mode::Check, Some(manager.clone())).unwrap();
            assert_eq!(
                (report.changed, report.detail.as_str()),
                (changed, detail),
                "{name} {state:?}"
            );
        }
        // A pin: the version installed here, then one that is not.
        let installed = installed_versions(&manager, "coreutils").unwrap();
        let version = installed.first().expect("coreutils is installed");
        let check = |pin: &str| {
            let report = run_with(
                &pinned("coreutils", pin),
                Mode::Check,
                Some(manager.clone()),
            )
            .unwrap();
            (report.changed, report.detail)
        };
        assert_eq!(
            check(version),
            (false, format!("already installed ({version})"))
        );
        assert_eq!(
            check("0.0.1-svc"),
            (
                true,
                format!("version {} -> 0.0.1-svc", installed.join(", "))
            )
        );
    }
}
