//! `service`: a systemd unit running or stopped, enabled at boot or not, through `systemctl`.
//!
//! `is-active` and `is-enabled` tell the current state, `start`/`stop`/`enable`/`disable`
//! change it, and the unit is asked again afterwards: a unit that cannot be enabled (a static
//! one) or dies right after starting is an error, not a change repeated on every apply.
//! A host without systemctl, or one where systemd is not running (a container), is an error
//! that says so.

use std::path::Path;
use std::time::Duration;

use super::process::{self, Finished};
use super::Report;
use crate::state::{Mode, ServiceResource};

/// systemctl waits for a start or stop job to finish; a unit's own start timeout is 90 s by
/// default, so this only bounds a wedged systemd.
const TIMEOUT: Duration = Duration::from_secs(300);

pub(super) fn run(service: &ServiceResource, mode: Mode) -> Result<Report, String> {
    run_with(service, mode, process::find_program("systemctl").as_deref())
}

/// The provider with systemctl's path given, so tests can take the "not found" path.
fn run_with(
    service: &ServiceResource,
    mode: Mode,
    systemctl: Option<&Path>,
) -> Result<Report, String> {
    let systemctl =
        systemctl.ok_or("systemctl not found (services are managed through systemd)")?;
    let name = service.name.as_str();
    let mut changes = Vec::new();
    if let Some(state) = service.state.filter(|state| !state.is_action()) {
        let wants_running = state == crate::state::ServiceState::Running;
        let (is_running_now, current) = is_active(systemctl, name)?;
        if is_running_now != wants_running {
            let action = if wants_running { "start" } else { "stop" };
            if mode == Mode::Apply {
                call(systemctl, action, name)?;
                let (is_running_now, now) = is_active(systemctl, name)?;
                if is_running_now != wants_running {
                    return Err(format!(
                        "systemctl {action} {name} succeeded but the unit is {now}"
                    ));
                }
            }
            changes.push(format!("{current} -> {state}"));
        }
    }
    if let Some(wants_enabled) = service.enabled {
        let (is_enabled_now, current) = is_enabled(systemctl, name)?;
        if is_enabled_now != wants_enabled {
            let action = if wants_enabled { "enable" } else { "disable" };
            if mode == Mode::Apply {
                call(systemctl, action, name)?;
                let (is_enabled_now, now) = is_enabled(systemctl, name)?;
                if is_enabled_now != wants_enabled {
                    return Err(format!(
                        "systemctl {action} {name} succeeded but the unit is {now}"
                    ));
                }
            }
            changes.push(format!(
                "{current} -> {}",
                if wants_enabled { "enabled" } else { "disabled" }
            ));
        }
    }
    // After enabling: a unit that is restarted because its configuration changed should
    // also come back at boot.
    if let Some(state) = service.state.filter(|state| state.is_action()) {
        changes.push(act(systemctl, name, state, mode)?);
    }
    if changes.is_empty() {
        return Ok(Report::unchanged("already in state"));
    }
    Ok(Report::changed(changes.join("; ")))
}

/// restarted: `systemctl restart` (which also starts a stopped unit). reloaded: `systemctl
/// reload` when the unit runs, `start` when it does not (nothing to reload). Either way the
/// unit must be running afterwards.
fn act(
    systemctl: &Path,
    name: &str,
    state: crate::state::ServiceState,
    mode: Mode,
) -> Result<String, String> {
    let (is_running_now, current) = is_active(systemctl, name)?;
    let action = match state {
        crate::state::ServiceState::Reloaded if is_running_now => "reload",
        crate::state::ServiceState::Reloaded => "start",
        _ => "restart",
    };
    let done = match action {
        "reload" => "reloaded",
        "start" => "started (it was not running, so not reloaded)",
        _ => "restarted",
    };
    if mode == Mode::Check {
        let would = match action {
            "reload" => "would reload".to_string(),
            "start" => format!("would start ({current}; nothing to reload)"),
            _ => format!("would restart ({current})"),
        };
        return Ok(would);
    }
    call(systemctl, action, name)?;
    let (is_running_now, now) = is_active(systemctl, name)?;
    if !is_running_now {
        return Err(format!(
            "systemctl {action} {name} succeeded but the unit is {now}"
        ));
    }
    Ok(done.to_string())
}

/// Running or not, with systemd's word for it ("active", "inactive", "failed", ...).
fn is_active(systemctl: &Path, name: &str) -> Result<(bool, String), String> {
    let finished = process::run_program(systemctl, &["is-active", name], &[], TIMEOUT)?;
    let word = answer(systemctl, "is-active", name, &finished)?;
    // reloading is a running unit re-reading its configuration.
    let is_running = matches!(word.as_str(), "active" | "reloading");
    Ok((is_running, word))
}

/// Enabled or not, with systemd's word for it. is-enabled exits 0 for every state that starts
/// the unit at boot (enabled, static, indirect, generated, ...), which is the question here.
fn is_enabled(systemctl: &Path, name: &str) -> Result<(bool, String), String> {
    let finished = process::run_program(systemctl, &["is-enabled", name], &[], TIMEOUT)?;
    let word = answer(systemctl, "is-enabled", name, &finished)?;
    Ok((finished.is_success(), word))
}

/// The one-word answer of an is-* query. Its exit code also means "no" (3 for inactive), so
/// only a missing word is a failure: no systemd running, no such unit, no permission.
fn answer(systemctl: &Path, verb: &str, name: &str, finished: &Finished) -> Result<String, String> {
    let word = finished.stdout.trim();
    if finished.status.is_none() || word.is_empty() || word.contains(char::is_whitespace) {
        return Err(format!(
            "{} {verb} {name}: {}{}",
            systemctl.display(),
            finished.describe_status(),
            finished.output_suffix()
        ));
    }
    Ok(word.to_string())
}

fn call(systemctl: &Path, action: &str, name: &str) -> Result<(), String> {
    let finished = process::run_program(systemctl, &[action, name], &[], TIMEOUT)?;
    if finished.is_success() {
        return Ok(());
    }
    Err(format!(
        "systemctl {action} {name}: {}{}",
        finished.describe_status(),
        finished.output_suffix()
    ))
}

#[cfg(test)]
mod tests {
    use super::super::fake;
    use super::*;

    fn service() -> ServiceResource {
        ServiceResource {
            name: "svc-no-such-unit".into(),
            state: Some(crate::state::ServiceState::Running),
            enabled: Some(true),
        }
    }

    /// A systemctl stand-in keeping unit state as marker files in `dir`: `crashy` fails right
    /// after it starts, `static` cannot be disabled, and systemd knows no unit `missing`.
    fn fake_systemctl(dir: &Path) -> std::path::PathBuf {
        let d = dir.display();
        for state in ["active", "failed", "enabled"] {
            std::fs::create_dir(dir.join(state)).unwrap();
        }
        let body = format!(
            r#"unit="$2"
case "$1" in
is-active)
  [ -e "{d}/active/$unit" ] && {{ echo active; exit 0; }}
  [ -e "{d}/failed/$unit" ] && {{ echo failed; exit 3; }}
  echo inactive; exit 3;;
is-enabled)
  [ "$unit" = static ] && {{ echo static; exit 0; }}
  [ "$unit" = missing ] && {{ echo "Failed to get unit file state for missing.service: No such file or directory" >&2; exit 1; }}
  [ -e "{d}/enabled/$unit" ] && {{ echo enabled; exit 0; }}
  echo disabled; exit 1;;
esac
echo "$1 $unit" >> "{d}/calls"
case "$1" in
start|restart) if [ "$unit" = crashy ]; then touch "{d}/failed/$unit"; else touch "{d}/active/$unit"; fi;;
reload) [ -e "{d}/active/$unit" ] || exit 1;;
stop) rm -f "{d}/active/$unit";;
enable) touch "{d}/enabled/$unit";;
disable) rm -f "{d}/enabled/$unit";;
esac"#
        );
        fake::program(dir, "systemctl", &body)
    }

    fn unit(name: &str, state: &str, enabled: bool) -> ServiceResource {
        ServiceResource {
            name: name.into(),
            state: Some(serde_json::from_value(serde_json::json!(state)).unwrap()),
            enabled: Some(enabled),
        }
    }

    fn calls(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("calls")).unwrap_or_default()
    }

    #[test]
    fn start_enable_then_stop_disable_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let systemctl = fake_systemctl(dir.path());
        let outcome = |service: &ServiceResource, mode| {
            let report = run_with(service, mode, Some(&systemctl)).unwrap();
            (report.changed, report.detail)
        };
        let up = unit("nginx", "running", true);
        let change = "inactive -> running; disabled -> enabled".to_string();
        assert_eq!(outcome(&up, Mode::Check), (true, change.clone()));
        assert_eq!(calls(dir.path()), "", "check changed something");
        assert_eq!(outcome(&up, Mode::Apply), (true, change));
        assert_eq!(
            outcome(&up, Mode::Apply),
            (false, "already in state".into())
        );
        let down = unit("nginx", "stopped", false);
        assert_eq!(
            outcome(&down, Mode::Apply),
            (true, "active -> stopped; enabled -> disabled".into())
        );
        assert_eq!(
            outcome(&down, Mode::Apply),
            (false, "already in state".into())
        );
        assert_eq!(
            calls(dir.path()),
            "start nginx\nenable nginx\nstop nginx\ndisable nginx\n"
        );
        // Only what is set is managed: enabled alone never starts the unit.
        let boot_only = ServiceResource {
            name: "cron".into(),
            state: None,
            enabled: Some(true),
        };
        assert_eq!(
            outcome(&boot_only, Mode::Apply),
            (true, "disabled -> enabled".into())
        );
        assert!(!dir.path().join("active/cron").exists());
    }

    #[test]
    fn units_that_do_not_reach_the_state_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let systemctl = fake_systemctl(dir.path());
        let error = |service: &ServiceResource| {
            run_with(service, Mode::Apply, Some(&systemctl)).unwrap_err()
        };
        assert_eq!(
            error(&unit("crashy", "running", true)),
            "systemctl start crashy succeeded but the unit is failed"
        );
        assert_eq!(
            error(&unit("static", "stopped", false)),
            "systemctl disable static succeeded but the unit is static"
        );
        let missing = error(&unit("missing", "stopped", true));
        assert!(
            missing.ends_with(
                "is-enabled missing: exit code 1\nstderr:\nFailed to get unit file state for missing.service: No such file or directory"
            ),
            "{missing}"
        );
    }

    #[test]
    fn restarted_and_reloaded_act_every_run_and_leave_the_unit_running() {
        let dir = tempfile::tempdir().unwrap();
        let systemctl = fake_systemctl(dir.path());
        let outcome = |service: &ServiceResource, mode| {
            let report = run_with(service, mode, Some(&systemctl)).unwrap();
            (report.changed, report.detail)
        };
        let restart = unit("nginx", "restarted", true);
        assert_eq!(
            outcome(&restart, Mode::Check),
            (true, "disabled -> enabled; would restart (inactive)".into())
        );
        assert_eq!(calls(dir.path()), "", "check changed something");
        assert_eq!(
            outcome(&restart, Mode::Apply),
            (true, "disabled -> enabled; restarted".into())
        );
        assert_eq!(outcome(&restart, Mode::Apply), (true, "restarted".into()));
        let reload = ServiceResource {
            name: "nginx".into(),
            state: Some(crate::state::ServiceState::Reloaded),
            enabled: None,
        };
        assert_eq!(outcome(&reload, Mode::Check), (true, "would reload".into()));
        assert_eq!(outcome(&reload, Mode::Apply), (true, "reloaded".into()));
        // Nothing to reload in a stopped unit: it is started instead.
        let stopped = ServiceResource {
            name: "cron".into(),
            ..reload
        };
        assert_eq!(
            outcome(&stopped, Mode::Apply),
            (true, "started (it was not running, so not reloaded)".into())
        );
        assert_eq!(
            calls(dir.path()),
            "enable nginx\nrestart nginx\nrestart nginx\nreload nginx\nstart cron\n"
        );
        let crashy = unit("crashy", "restarted", true);
        assert_eq!(
            run_with(&crashy, Mode::Apply, Some(&systemctl)).unwrap_err(),
            "systemctl restart crashy succeeded but the unit is failed"
        );
    }

    #[test]
    fn missing_systemctl_is_a_clear_error() {
        let error = run_with(&service(), Mode::Check, None).unwrap_err();
        assert!(error.starts_with("systemctl not found"), "{error}");
    }

    /// Whatever this host has (no systemctl, systemd not running in a container, or a real
    /// systemd that does not know the unit), checking a unit that does not exist either fails
    /// with systemctl's reason or reports the change; it never claims "already in state".
    #[test]
    fn a_unit_that_does_not_exist_is_never_in_state() {
        match run(&service(), Mode::Check) {
            Err(error) => assert!(!error.is_empty()),
            Ok(report) => assert!(report.changed, "{report:?}"),
        }
    }

    #[test]
    fn is_queries_fail_without_a_word() {
        let finished = process::run_shell(
            "echo 'System has not been booted with systemd' >&2; exit 1",
            Duration::from_secs(60),
        )
        .unwrap();
        let error =
            answer(Path::new("/bin/systemctl"), "is-active", "nginx", &finished).unwrap_err();
        assert_eq!(
            error,
            "/bin/systemctl is-active nginx: exit code 1\nstderr:\nSystem has not been booted with systemd"
        );
        let inactive =
            process::run_shell("echo inactive; exit 3", Duration::from_secs(60)).unwrap();
        assert_eq!(
            answer(Path::new("systemctl"), "is-active", "nginx", &inactive),
            Ok("inactive".into())
        );
    }
}
