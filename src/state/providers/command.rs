//! `command`: a shell command (`/bin/sh -c RUN`), with two guards that make it idempotent:
//! `creates` (skip when that path exists) and `unless` (skip when that command exits 0).
//!
//! Check mode evaluates the guards, since only they can tell whether the command would run,
//! but never runs `run` itself ("would run"). An unguarded command runs on every apply: that is
//! the operator's call, and the fleet does not count it as drift. This is the only provider
//! that uses a shell.

use std::fs;
use std::time::Duration;

use super::process;
use super::Report;
use crate::state::{validate, CommandResource, Mode};

/// The time limit of `run` and of `unless` when the resource gives none: long enough for a
/// build or a download, short enough that a hung command does not hold the agent for ever.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

pub(super) fn run(command: &CommandResource, mode: Mode) -> Result<Report, String> {
    let timeout = match &command.timeout {
        Some(text) => validate::parse_timeout(text)?,
        None => DEFAULT_TIMEOUT,
    };
    if let Some(creates) = &command.creates {
        // Anything at the path counts, even a dangling symlink: it was created.
        if fs::symlink_metadata(creates).is_ok() {
            return Ok(Report::unchanged(format!("skipped: {creates} exists")));
        }
    }
    if let Some(unless) = &command.unless {
        let guard = process::run_shell(unless, timeout)?;
        if guard.status.is_none() {
            return Err(format!(
                "unless {}{}",
                guard.describe_status(),
                guard.output_suffix()
            ));
        }
        if guard.is_success() {
            return Ok(Report::unchanged("skipped: unless exited 0"));
        }
    }
    if mode == Mode::Check {
        return Ok(Report::changed("would run"));
    }
    let finished = process::run_shell(&command.run, timeout)?;
    if !finished.is_success() {
        return Err(format!(
            "{}{}",
            finished.describe_status(),
            finished.output_suffix()
        ));
    }
    Ok(Report::changed(format!(
        "ran (exit 0){}",
        finished.output_suffix()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn command(run: &str) -> CommandResource {
        CommandResource {
            run: run.into(),
            ..CommandResource::default()
        }
    }

    #[test]
    fn check_mode_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let touch = command(&format!("touch {}", marker.display()));
        let report = run(&touch, Mode::Check).unwrap();
        assert_eq!(
            (report.changed, report.detail.as_str()),
            (true, "would run")
        );
        assert!(!marker.exists());
        let report = run(&touch, Mode::Apply).unwrap();
        assert_eq!(
            (report.changed, report.detail.as_str()),
            (true, "ran (exit 0)")
        );
        assert!(marker.exists());
    }

    #[test]
    fn creates_guard() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("built");
        let build = CommandResource {
            creates: Some(output.to_str().unwrap().into()),
            ..command(&format!("echo building; echo done > {}", output.display()))
        };
        assert_eq!(run(&build, Mode::Check).unwrap().detail, "would run");
        let first = run(&build, Mode::Apply).unwrap();
        assert_eq!(
            (first.changed, first.detail.as_str()),
            (true, "ran (exit 0)\nstdout:\nbuilding")
        );
        for mode in [Mode::Apply, Mode::Check] {
            let again = run(&build, mode).unwrap();
            assert_eq!(
                (again.changed, again.detail),
                (false, format!("skipped: {} exists", output.display()))
            );
        }
    }

    #[test]
    fn unless_guard_runs_in_both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("flag");
        let guarded = CommandResource {
            unless: Some(format!("test -e {}", flag.display())),
            ..command(&format!("touch {}", flag.display()))
        };
        assert_eq!(run(&guarded, Mode::Check).unwrap().detail, "would run");
        assert!(run(&guarded, Mode::Apply).unwrap().changed);
        let skipped = run(&guarded, Mode::Check).unwrap();
        assert_eq!(
            (skipped.changed, skipped.detail.as_str()),
            (false, "skipped: unless exited 0")
        );
        assert!(!run(&guarded, Mode::Apply).unwrap().changed);
    }

    #[test]
    fn failures_carry_the_exit_code_and_stderr() {
        let error = run(
            &command("echo partial; echo 'no such target' >&2; exit 2"),
            Mode::Apply,
        )
        .unwrap_err();
        assert_eq!(
            error,
            "exit code 2\nstdout:\npartial\nstderr:\nno such target"
        );
        let killed = run(&command("kill -9 $$"), Mode::Apply).unwrap_err();
        assert_eq!(killed, "killed by signal 9");
    }

    #[test]
    fn timeouts_apply_to_run_and_unless() {
        let slow = CommandResource {
            timeout: Some("200ms".into()),
            ..command("sleep 30")
        };
        assert_eq!(
            run(&slow, Mode::Apply).unwrap_err(),
            "timed out after 200ms (killed)"
        );
        let slow_guard = CommandResource {
            unless: Some("sleep 30".into()),
            timeout: Some("200ms".into()),
            ..command("true")
        };
        assert_eq!(
            run(&slow_guard, Mode::Check).unwrap_err(),
            "unless timed out after 200ms (killed)"
        );
    }

    #[test]
    fn runs_with_sh() {
        // Shell syntax works because the text goes to /bin/sh -c, as documented.
        assert!(Path::new("/bin/sh").exists());
        let report = run(
            &command("for word in a b; do printf %s $word; done"),
            Mode::Apply,
        )
        .unwrap();
        assert_eq!(report.detail, "ran (exit 0)\nstdout:\nab");
    }
}
