//! `package`: a package installed or absent, through the host's own package manager.
//!
//! Debian family: `dpkg-query` says what is installed, `apt-get` changes it. Red Hat family:
//! `rpm -q` and `dnf` (or `yum` where dnf is missing). The manager is detected per run from
//! the programs present, so one plan serves a mixed fleet. After a change the package is
//! queried again: a manager that exits 0 without reaching the state (a held package, a
//! virtual name) is reported as an error instead of changing again on every apply.
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
    if is_installed(&manager, name)? == wants_installed {
        let state = if wants_installed {
            "installed"
        } else {
            "absent"
        };
        return Ok(Report::unchanged(format!("already {state}")));
    }
    let (would, done) = if wants_installed {
        ("would install", "installed")
    } else {
        ("would remove", "removed")
    };
    if mode == Mode::Check {
        return Ok(Report::changed(would));
    }
    let action = if wants_installed { "install" } else { "remove" };
    let (program, environment): (&PathBuf, &[(&str, &str)]) = match &manager {
        // noninteractive: no debconf prompt may wait for a terminal that is not there.
        Manager::Apt { apt_get, .. } => (apt_get, &[("DEBIAN_FRONTEND", "noninteractive")]),
        Manager::Dnf { dnf, .. } => (dnf, &[]),
    };
    let finished = process::run_program(program, &[action, "-y", name], environment, TIMEOUT)?;
    if !finished.is_success() {
        return Err(format!(
            "{} {action} -y {name}: {}{}",
            program.display(),
            finished.describe_status(),
            finished.output_suffix()
        ));
    }
    if is_installed(&manager, name)? != wants_installed {
        return Err(format!(
            "{} {action} -y {name} exited 0 but the package is still {}",
            program.display(),
            if wants_installed {
                "not installed"
            } else {
                "installed"
            }
        ));
    }
    Ok(Report::changed(done))
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

fn is_installed(manager: &Manager, name: &str) -> Result<bool, String> {
    match manager {
        Manager::Apt { dpkg_query, .. } => {
            // One status line per matching package (a name can match several architectures);
            // "install ok installed" and "hold ok installed" both end in "installed", while a
            // removed package left with its configuration is "deinstall ok config-files".
            let finished = query(dpkg_query, &["-W", "--showformat=${Status}\\n", name])?;
            match finished.status.and_then(|status| status.code()) {
                Some(0) => Ok(finished
                    .stdout
                    .lines()
                    .any(|status| status.split_whitespace().nth(2) == Some("installed"))),
                // 1: no package by that name is known at all.
                Some(1) => Ok(false),
                _ => Err(query_failure(dpkg_query, &finished)),
            }
        }
        Manager::Dnf { rpm, .. } => {
            let finished = query(rpm, &["-q", name])?;
            match finished.status.and_then(|status| status.code()) {
                Some(0) => Ok(true),
                Some(1) => Ok(false),
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
    /// `installed`, and `removed` (left with configuration: "deinstall ok config-files").
    /// `held` installs "successfully" without installing, `nope` does not exist, and asking
    /// about `locked` fails as a locked database does.
    fn fake_apt(dir: &Path) -> Manager {
        let d = dir.display();
        std::fs::write(dir.join("installed"), "").unwrap();
        std::fs::write(dir.join("removed"), "").unwrap();
        let dpkg_query = format!(
            r#"name="$3"
grep -qx "$name" "{d}/installed" && {{ echo "install ok installed"; exit 0; }}
grep -qx "$name" "{d}/removed" && {{ echo "deinstall ok config-files"; exit 0; }}
[ "$name" = locked ] && {{ echo "dpkg-query: database is locked" >&2; exit 2; }}
echo "dpkg-query: no packages found matching $name" >&2; exit 1"#
        );
        let apt_get = format!(
            r#"echo "$DEBIAN_FRONTEND $*" >> "{d}/calls"
[ "$3" = held ] && exit 0
[ "$3" = nope ] && {{ echo "E: Unable to locate package nope" >&2; exit 100; }}
{}"#,
            database_update(&d.to_string())
        );
        Manager::Apt {
            dpkg_query: fake::program(dir, "dpkg-query", &dpkg_query),
            apt_get: fake::program(dir, "apt-get", &apt_get),
        }
    }

    /// rpm and dnf stand-ins over the same two files.
    fn fake_dnf(dir: &Path) -> Manager {
        let d = dir.display();
        std::fs::write(dir.join("installed"), "").unwrap();
        std::fs::write(dir.join("removed"), "").unwrap();
        let rpm = format!(
            r#"grep -qx "$2" "{d}/installed" && {{ echo "$2-1.0-1.x86_64"; exit 0; }}
echo "package $2 is not installed"; exit 1"#
        );
        let dnf = format!(
            "echo \"$*\" >> \"{d}/calls\"\n{}",
            database_update(&d.to_string())
        );
        Manager::Dnf {
            rpm: fake::program(dir, "rpm", &rpm),
            dnf: fake::program(dir, "dnf", &dnf),
        }
    }

    /// `install|remove -y NAME` against the files of the fakes above.
    fn database_update(d: &str) -> String {
        format!(
            r#"case "$1" in
install) echo "$3" >> "{d}/installed"; grep -vx "$3" "{d}/removed" > "{d}/tmp"; mv "{d}/tmp" "{d}/removed";;
remove) grep -vx "$3" "{d}/installed" > "{d}/tmp"; mv "{d}/tmp" "{d}/installed"; echo "$3" >> "{d}/removed";;
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
    }
}
