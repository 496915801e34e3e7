//! Running one `svcctl exec` command on this host: no shell (argv as given, argv[0] looked up
//! on PATH), stdin closed, stdout and stderr captured up to a cap each, and a timeout that
//! kills the whole process group, so a command that forked children leaves nothing behind.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::fleet::protocol::{ExecOutcome, MAX_OUTPUT_BYTES};

/// After the command ends, how long its output pipes may stay open (held by a child it left
/// running in the background) before the agent stops reading them.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// Runs `argv` with `env` added (SVC_AGENT_ID, SVC_JOB_ID: scripts may want to know).
pub async fn run(argv: &[String], env: &[(&str, &str)], timeout: Duration) -> ExecOutcome {
    let Some(program) = argv.first() else {
        return failed_to_start(-1, "no command given".into());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(&argv[1..])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so the timeout can kill what it started too.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            // The shell's conventions: 127 not found, 126 found but not runnable.
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return failed_to_start(code, format!("cannot run '{program}': {e}"));
        }
    };
    let stdout = tokio::spawn(read_capped(child.stdout.take()));
    let stderr = tokio::spawn(read_capped(child.stderr.take()));

    let mut outcome = ExecOutcome::default();
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            outcome.timed_out = true;
            if let Some(pid) = child.id() {
                // SAFETY: killpg only sends a signal; the group id is the child's pid, which
                // cannot be reused before `wait` below reaps it.
                unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
            }
            child.wait().await.ok()
        }
    };
    outcome.exit_code = match status {
        Some(status) => exit_code(status, &mut outcome),
        None => -1,
    };
    if outcome.timed_out {
        outcome.exit_code = -1;
        outcome.error = Some(format!(
            "timed out after {}; killed",
            crate::clock::format_duration(timeout)
        ));
    }
    for (handle, text) in [(stdout, &mut outcome.stdout), (stderr, &mut outcome.stderr)] {
        let (bytes, truncated) = tokio::time::timeout(PIPE_GRACE, handle)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        *text = String::from_utf8_lossy(&bytes).into_owned();
        outcome.truncated |= truncated;
    }
    outcome
}

fn exit_code(status: std::process::ExitStatus, outcome: &mut ExecOutcome) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => {
            outcome.error = Some(format!("killed by signal {signal}"));
            128 + signal
        }
        (None, None) => -1,
    }
}

fn failed_to_start(exit_code: i32, error: String) -> ExecOutcome {
    ExecOutcome {
        exit_code,
        error: Some(error),
        ..ExecOutcome::default()
    }
}

/// Reads a pipe to its end, keeping the first MAX_OUTPUT_BYTES; true when more came.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>) -> (Vec<u8>, bool) {
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES - kept.len();
                kept.extend_from_slice(&chunk[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    (kept, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[tokio::test]
    async fn output_exit_codes_and_failures() {
        let ok = run(
            &argv(&["sh", "-c", "echo $SVC_AGENT_ID; echo err >&2; exit 3"]),
            &[("SVC_AGENT_ID", "out")],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            (ok.exit_code, ok.stdout.as_str(), ok.stderr.as_str()),
            (3, "out\n", "err\n")
        );
        assert!(!ok.timed_out && ok.error.is_none());

        let missing = run(
            &argv(&["/nonexistent/program"]),
            &[],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(missing.exit_code, 127);
        assert!(missing.error.unwrap().contains("/nonexistent/program"));
    }

    #[tokio::test]
    async fn timeout_kills_the_process_group() {
        let started = std::time::Instant::now();
        // The background sleep keeps stdout open; the group kill must end it too.
        let slow = run(
            &argv(&["sh", "-c", "sleep 30 & echo started; sleep 30"]),
            &[],
            Duration::from_millis(300),
        )
        .await;
        assert!(slow.timed_out, "{slow:?}");
        assert_eq!(slow.exit_code, -1);
        assert_eq!(slow.stdout, "started\n");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn output_is_capped() {
        let big = run(
            &argv(&["head", "-c", "600000", "/dev/zero"]),
            &[],
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(big.exit_code, 0);
        assert!(big.truncated);
        assert_eq!(big.stdout.len(), MAX_OUTPUT_BYTES);
    }
}
