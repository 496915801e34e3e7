//! Running the programs providers need (sh for commands, apt-get, dnf, systemctl): no stdin,
//! a time limit, and only the tail of the output kept, so a chatty or stuck program can neither
//! fill the agent's memory nor hold a state run forever.
//!
//! Each child leads its own process group; a timeout kills the whole group, so `sh -c "make"`
//! takes make and its compilers with it.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Bytes of stdout and of stderr kept (the end, which is where errors are).
pub(super) const OUTPUT_TAIL_BYTES: usize = 4096;

/// How long to wait for the output pipes after the program exited: something it started in the
/// background may hold them open for ever, and the run must not wait for that.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// Directories searched after `PATH`: the agent may run with a minimal environment, and apt-get
/// or systemctl live in sbin directories that a user's PATH often lacks.
const SYSTEM_DIRECTORIES: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// How a program ended and the end of what it wrote.
#[derive(Debug)]
pub(super) struct Finished {
    /// None when it was killed for taking longer than its time limit.
    pub status: Option<ExitStatus>,
    pub timeout: Duration,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn is_success(&self) -> bool {
        self.status.is_some_and(|status| status.success())
    }

    /// "exit code 2", "killed by signal 9", "timed out after 10m (killed)".
    pub fn describe_status(&self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.status {
            None => format!(
                "timed out after {} (killed)",
                crate::clock::format_duration(self.timeout)
            ),
            Some(status) => match (status.code(), status.signal()) {
                (Some(code), _) => format!("exit code {code}"),
                (None, Some(signal)) => format!("killed by signal {signal}"),
                (None, None) => status.to_string(),
            },
        }
    }

    /// The captured output as a suffix for a message: "; stderr: ..." (empty when silent).
    pub fn output_suffix(&self) -> String {
        let mut suffix = String::new();
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let text = text.trim_end();
            if !text.is_empty() {
                suffix.push_str(&format!("\n{name}:\n{text}"));
            }
        }
        suffix
    }
}

/// Runs `script` with `/bin/sh -c`: only `command` resources may call this.
pub(super) fn run_shell(script: &str, timeout: Duration) -> Result<Finished, String> {
    run_program(Path::new("/bin/sh"), &["-c", script], &[], timeout)
}

/// Runs a program with explicit arguments (no shell), waiting at most `timeout`.
pub(super) fn run_program(
    program: &Path,
    arguments: &[&str],
    environment: &[(&str, &str)],
    timeout: Duration,
) -> Result<Finished, String> {
    run_program_with_stdout(program, arguments, environment, timeout, Stdio::piped())
}

/// [`run_program`] with the whole of stdout written to `stdout` (a file), for output that
/// must be read in full, such as an archive's member list; `Finished::stdout` is then empty.
pub(super) fn run_program_to_file(
    program: &Path,
    arguments: &[&str],
    timeout: Duration,
    stdout: std::fs::File,
) -> Result<Finished, String> {
    run_program_with_stdout(program, arguments, &[], timeout, Stdio::from(stdout))
}

fn run_program_with_stdout(
    program: &Path,
    arguments: &[&str],
    environment: &[(&str, &str)],
    timeout: Duration,
    stdout: Stdio,
) -> Result<Finished, String> {
    let mut child = Command::new(program)
        .args(arguments)
        .envs(environment.iter().copied())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|error| format!("cannot start {}: {error}", program.display()))?;
    let stdout = TailReader::start(child.stdout.take());
    let stderr = TailReader::start(child.stderr.take());

    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                kill_group(child.id());
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                // Quick programs finish in milliseconds; slow ones are polled 20 times a second.
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(error) => {
                kill_group(child.id());
                let _ = child.wait();
                return Err(format!("waiting for {}: {error}", program.display()));
            }
        }
    };
    let grace = Instant::now() + PIPE_GRACE;
    Ok(Finished {
        status,
        timeout,
        stdout: stdout.finish(grace),
        stderr: stderr.finish(grace),
    })
}

/// The path of an executable named `name` in PATH or the usual system directories.
pub(super) fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path_variable = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_variable)
        .chain(SYSTEM_DIRECTORIES.iter().map(PathBuf::from))
        .filter(|directory| directory.is_absolute())
        .map(|directory| directory.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|metadata| {
                metadata.is_file() && metadata.permissions().mode() & 0o111 != 0
            })
        })
}

fn kill_group(process_id: u32) {
    // SAFETY: kill has no memory effects. The child was started as the leader of its own
    // process group and has not been reaped yet, so the group id cannot have been reused.
    unsafe {
        libc::kill(-(process_id as libc::pid_t), libc::SIGKILL);
    }
}

/// Reads a pipe on its own thread, keeping the last OUTPUT_TAIL_BYTES.
struct TailReader {
    tail: Arc<Mutex<Tail>>,
    done: mpsc::Receiver<()>,
}

#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    total: usize,
}

impl TailReader {
    fn start(pipe: Option<impl Read + Send + 'static>) -> TailReader {
        let tail = Arc::new(Mutex::new(Tail::default()));
        let (sender, done) = mpsc::channel();
        if let Some(mut pipe) = pipe {
            let shared = Arc::clone(&tail);
            thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(read) = pipe.read(&mut chunk) {
                    if read == 0 {
                        break;
                    }
                    let mut tail = shared.lock().unwrap_or_else(|poison| poison.into_inner());
                    tail.total += read;
                    tail.bytes.extend_from_slice(&chunk[..read]);
                    // Trim in batches, not on every read.
                    if tail.bytes.len() > 2 * OUTPUT_TAIL_BYTES {
                        let excess = tail.bytes.len() - OUTPUT_TAIL_BYTES;
                        tail.bytes.drain(..excess);
                    }
                }
                let _ = sender.send(());
            });
        }
        TailReader { tail, done }
    }

    /// What was read by `deadline` (or EOF), as text.
    fn finish(self, deadline: Instant) -> String {
        let _ = self
            .done
            .recv_timeout(deadline.saturating_duration_since(Instant::now()));
        let tail = self
            .tail
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let kept = &tail.bytes[tail.bytes.len().saturating_sub(OUTPUT_TAIL_BYTES)..];
        let text = String::from_utf8_lossy(kept);
        if tail.total > kept.len() {
            format!("[{} earlier bytes cut]\n{text}", tail.total - kept.len())
        } else {
            text.into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn status_and_output_are_captured() {
        let finished = run_shell("echo out; echo err >&2; exit 3", MINUTE).unwrap();
        assert!(!finished.is_success());
        assert_eq!(finished.describe_status(), "exit code 3");
        assert_eq!(
            (finished.stdout.as_str(), finished.stderr.as_str()),
            ("out\n", "err\n")
        );
        assert_eq!(finished.output_suffix(), "\nstdout:\nout\nstderr:\nerr");
    }

    #[test]
    fn only_the_tail_is_kept() {
        let finished =
            run_shell("head -c 100000 /dev/zero | tr '\\0' a; echo END", MINUTE).unwrap();
        assert!(finished.is_success());
        assert!(
            finished.stdout.starts_with("[95908 earlier bytes cut]\n"),
            "{}",
            &finished.stdout[..40]
        );
        assert!(
            finished.stdout.ends_with("aaaaEND\n"),
            "{}",
            finished.stdout
        );
        assert_eq!(
            finished.stdout.len(),
            "[95908 earlier bytes cut]\n".len() + OUTPUT_TAIL_BYTES
        );
    }

    #[test]
    fn a_timeout_kills_the_whole_group() {
        let started = Instant::now();
        // The inner sleep is a grandchild: only a group kill ends it (and closes the pipe).
        let finished = run_shell("sleep 30 & sleep 30", Duration::from_millis(300)).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(finished.status, None);
        assert_eq!(finished.describe_status(), "timed out after 300ms (killed)");
    }

    #[test]
    fn background_children_do_not_hold_the_run() {
        let started = Instant::now();
        // The background sleep keeps stdout open after the shell exits; its own group kill is
        // not ours to do (the operator started it on purpose), so only the grace applies.
        let finished = run_shell("sleep 5 & echo started", MINUTE).unwrap();
        assert!(finished.is_success());
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(finished.stdout, "started\n");
    }

    #[test]
    fn programs_are_found_in_path_or_system_directories() {
        assert!(find_program("sh").is_some());
        assert_eq!(find_program("no-such-program-svc"), None);
    }
}
