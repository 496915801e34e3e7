//! Where an agent's work runs, and the privileged half of a split agent.
//!
//! [`Executor`] is the one code path that runs a command: it checks the server's signature,
//! the agent id, the freshness window and that the job id is new (`crate::fleet::signature`),
//! then runs the exec (exec.rs), the state (`crate::state`) or the module
//! (`crate::modules::bundle`, which also checks the module's own signature) and gives the
//! [`Reply`]. The
//! daemon uses it in-process (`executor: inline`), or `svc-agent executor --socket PATH` runs
//! it as root behind a unix socket while the daemon, which talks to the network, runs as an
//! unprivileged user (`executor: PATH`; the units in systemd/, docs/fleet.md). A daemon
//! taken over can then reach the executor, but only with commands the server signed for this
//! agent, each once, within minutes of being issued.
//!
//! The socket speaks one JSON line each way per connection: [`Request`] (the command's exact
//! bytes as text and its signature), then [`Answer`]. Peers are checked with SO_PEERCRED:
//! root, the executor's own uid and `--peer-user` may connect; anyone else is told so and cut.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::config::AgentSection;
use crate::config::TrustPolicy;
use crate::fleet::protocol::{
    Command, ExecOutcome, PlanRef, Reply, ReplyOutcome, StateOutcome, Work,
};
use crate::fleet::signature::{Refused, SeenJobs, Verifier};
use crate::modules::bundle::{self, Call};
use crate::modules::sandbox::Limits;
use crate::program::{exit, CliError};

/// The longest request or answer line: a stored state plan (base64) beside its command, or
/// two capped outputs JSON-escaped.
const MAX_LINE: u64 = (crate::fleet::content::MAX_PLAN_BYTES as u64 / 3 + 1) * 4 + 1024 * 1024;
/// Jobs run at once by the executor (the daemon has the same limit).
const MAX_JOBS: usize = 16;
/// The file of job ids already run, under the executor's state directory.
const SEEN_FILE: &str = "seen-jobs";

/// What the daemon sends the executor: the command as it came off the bus.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// The command's JSON, byte for byte as signed.
    pub command: String,
    /// The `Svc-Signature` header's value (empty when there was none).
    #[serde(default)]
    pub signature: String,
    /// The stored plan the command names (`plan_ref`), as the daemon fetched it, base64;
    /// checked against the signed command's SHA-256 before it is used.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub plan_base64: String,
}

/// What the executor answers: the reply to publish (a refusal is a reply with its error), or
/// an error when there is no job to answer for (an unknown peer, a malformed request).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Answer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub struct Executor {
    /// Err: why no command can be verified (no command key), said in every refusal. Replaced
    /// by a command-key notice (`trust`).
    verifier: std::sync::RwLock<Result<Verifier, String>>,
    /// The command-key file (`agent.command_key`) and the CA chain bootstrap wrote, whose
    /// root a new command-signing certificate must chain to.
    key_path: PathBuf,
    ca_path: PathBuf,
    seen: Mutex<SeenJobs>,
    agent_id: String,
    /// The signatures a module must carry to run here (`modules:` of the agent's config).
    modules: Arc<TrustPolicy>,
}

impl Executor {
    /// For the agent in `agent`, with the job ids already run kept in `seen_file` (None: in
    /// memory only). `root_owned_key`: the key file must be root's and writable by root only
    /// (the executor running as root beside an unprivileged daemon).
    pub fn open(
        agent: &AgentSection,
        modules: TrustPolicy,
        seen_file: Option<PathBuf>,
        root_owned_key: bool,
    ) -> Result<Executor, String> {
        let path = agent.command_key_path();
        let verifier = (|| {
            if root_owned_key {
                check_root_owned(&path)?;
            }
            let pem = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "no command key at {} ({e}): enrol again with `svc-agent bootstrap` \
                     (the server must sign commands)",
                    path.display()
                )
            })?;
            Verifier::from_certificate_pem(&pem, &agent.id)
                .map_err(|e| format!("{}: {e}", path.display()))
        })();
        let now = now_ms();
        let seen = SeenJobs::open(seen_file, now).map_err(|e| e.to_string())?;
        Ok(Executor {
            verifier: std::sync::RwLock::new(verifier),
            key_path: path,
            ca_path: agent.state_dir.join(super::CA_FILE),
            seen: Mutex::new(seen),
            agent_id: agent.id.clone(),
            modules: Arc::new(modules),
        })
    }

    /// Why commands cannot be verified, if so (logged at start).
    pub fn problem(&self) -> Option<String> {
        self.verifier
            .read()
            .expect("verifier lock poisoned")
            .as_ref()
            .err()
            .cloned()
    }

    /// Takes a command-key notice (already checked: signed with a key trusted here): every
    /// certificate not trusted yet must be issued by the root CA in `ca.pem`; the set is
    /// written to the command-key file (atomically, 0644 like bootstrap's: it is public, and
    /// the daemon reads it to report the set) and used from the next command on.
    fn trust(&self, certificates: &str) -> Result<String, String> {
        use crate::identity::ca;
        let bundle = ca::pem_bundle(certificates).map_err(|e| e.to_string())?;
        let verifier = Verifier::from_certificate_pem(certificates, &self.agent_id)
            .map_err(|e| e.to_string())?;
        let current = std::fs::read_to_string(&self.key_path)
            .ok()
            .and_then(|pem| ca::pem_bundle(&pem).ok())
            .unwrap_or_default();
        let new: Vec<&Vec<u8>> = bundle.iter().filter(|der| !current.contains(der)).collect();
        if !new.is_empty() {
            let chain = std::fs::read_to_string(&self.ca_path)
                .map_err(|e| format!("cannot read {}: {e}", self.ca_path.display()))?;
            let root = ca::pem_bundle(&chain)
                .ok()
                .and_then(|mut chain| chain.pop())
                .ok_or_else(|| format!("no root CA in {}", self.ca_path.display()))?;
            if !new.iter().all(|der| ca::is_issued_by(der, &root)) {
                return Err(format!(
                    "a new command-signing certificate is not issued by the root CA in {}",
                    self.ca_path.display()
                ));
            }
        }
        if bundle != current {
            super::bootstrap::write_file(&self.key_path, certificates.as_bytes(), 0o644)
                .map_err(|e| e.message)?;
        }
        *self.verifier.write().expect("verifier lock poisoned") = Ok(verifier);
        crate::fleet::signature::key_set_id(certificates).map_err(|e| e.to_string())
    }

    /// Checks and runs one command. None when `bytes` is not a command at all (no job to
    /// answer for). `fetched`: the stored plan a state command names, as the daemon fetched it.
    pub async fn run(
        &self,
        bytes: &[u8],
        signature: &str,
        fetched: Option<&[u8]>,
    ) -> Option<Reply> {
        let started = Instant::now();
        let now = now_ms();
        let checked = match &*self.verifier.read().expect("verifier lock poisoned") {
            Ok(verifier) => verifier.check(bytes, signature, now),
            Err(why) => Err(Refused(why.clone())),
        }
        .and_then(|command| {
            self.seen
                .lock()
                .expect("seen jobs lock poisoned")
                .admit(&command, now)?;
            Ok(command)
        });
        let command = match checked {
            Ok(command) => command,
            Err(refused) => {
                tracing::warn!(reason = %refused.0, "command refused");
                return refusal(bytes, &refused.to_string(), started);
            }
        };
        let timeout = Duration::from_millis(command.timeout_ms.max(1));
        let outcome = match command.work {
            Work::Exec { argv } => {
                tracing::info!(job_id = %command.job_id, program = argv.first().map(String::as_str).unwrap_or(""), "exec");
                let env = [
                    ("SVC_AGENT_ID", self.agent_id.as_str()),
                    ("SVC_JOB_ID", command.job_id.as_str()),
                ];
                ReplyOutcome::Exec(super::exec::run(&argv, &env, timeout).await)
            }
            Work::State {
                mode,
                plan,
                diff,
                plan_ref,
            } => match stored_plan(plan, plan_ref.as_ref(), fetched) {
                Ok(plan) => {
                    tracing::info!(job_id = %command.job_id, ?mode, resources = plan.resources.len(), "state");
                    ReplyOutcome::State(run_state(plan, mode, diff, timeout).await)
                }
                Err(why) => ReplyOutcome::State(StateOutcome {
                    error: Some(why),
                    ..StateOutcome::default()
                }),
            },
            Work::CommandKeys { certificates } => {
                ReplyOutcome::Exec(match self.trust(&certificates) {
                    Ok(set) => {
                        tracing::info!(job_id = %command.job_id, set, "command keys updated");
                        ExecOutcome {
                            stdout: format!("trusting command keys {set}\n"),
                            ..ExecOutcome::default()
                        }
                    }
                    Err(why) => {
                        tracing::warn!(job_id = %command.job_id, %why, "command-key notice refused");
                        ExecOutcome {
                            exit_code: -1,
                            error: Some(format!("command keys not updated: {why}")),
                            ..ExecOutcome::default()
                        }
                    }
                })
            }
            Work::Module {
                mode,
                module,
                function,
                args,
                max_steps,
                max_memory,
            } => {
                tracing::info!(job_id = %command.job_id, ?mode, sha256 = %module.sha256, function, "module");
                let defaults = Limits::default();
                let limits = Limits {
                    max_steps: if max_steps == 0 {
                        defaults.max_steps
                    } else {
                        max_steps
                    },
                    max_heap_bytes: if max_memory == 0 {
                        defaults.max_heap_bytes
                    } else {
                        max_memory as usize
                    },
                };
                let policy = self.modules.clone();
                let work = move || {
                    let call = Call {
                        function: &function,
                        args: &args,
                        limits,
                    };
                    bundle::run_on_host(&module, &policy, &call, mode)
                };
                ReplyOutcome::State(run_blocking(work, timeout).await)
            }
        };
        Some(Reply {
            job_id: command.job_id,
            duration_ms: started.elapsed().as_millis() as u64,
            outcome,
        })
    }
}

/// The plan to run: the command's own, or the stored one it names, which must be exactly the
/// bytes the signed command describes (the daemon that fetched them is not trusted).
fn stored_plan(
    plan: crate::state::Plan,
    plan_ref: Option<&PlanRef>,
    fetched: Option<&[u8]>,
) -> Result<crate::state::Plan, String> {
    let Some(plan_ref) = plan_ref else {
        return Ok(plan);
    };
    let Some(bytes) = fetched else {
        return Err("the command names a stored plan, which was not fetched".into());
    };
    if bytes.len() as u64 != plan_ref.size || crate::files::sha256_hex(bytes) != plan_ref.sha256 {
        return Err(format!(
            "the fetched plan does not match the command's SHA-256 {}",
            plan_ref.sha256
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("the stored plan does not read: {e}"))
}

fn now_ms() -> u64 {
    crate::clock::now_millis().max(0) as u64
}

/// The answer for a command that was not run (refused, or the executor unreachable): its job
/// id and kind are read from the unverified bytes only to say so. None when they cannot be.
pub fn refusal(bytes: &[u8], why: &str, started: Instant) -> Option<Reply> {
    let command: Command = serde_json::from_slice(bytes).ok()?;
    let outcome = match command.work {
        Work::Exec { .. } | Work::CommandKeys { .. } => ReplyOutcome::Exec(ExecOutcome {
            exit_code: -1,
            error: Some(why.to_string()),
            ..ExecOutcome::default()
        }),
        Work::State { .. } | Work::Module { .. } => ReplyOutcome::State(StateOutcome {
            error: Some(why.to_string()),
            ..StateOutcome::default()
        }),
    };
    Some(Reply {
        job_id: command.job_id,
        duration_ms: started.elapsed().as_millis() as u64,
        outcome,
    })
}

async fn run_state(
    plan: crate::state::Plan,
    mode: crate::state::Mode,
    diff: bool,
    timeout: Duration,
) -> StateOutcome {
    let work = move || {
        // Read at each run: templates see the host as it is now.
        let options = crate::state::RunOptions {
            facts: serde_json::to_value(crate::facts::collect()).unwrap_or_default(),
            diff,
        };
        StateOutcome {
            outcomes: crate::state::run(&plan, mode, &options),
            ..StateOutcome::default()
        }
    };
    run_blocking(work, timeout).await
}

/// Runs a state or module run on the blocking pool, within `timeout`.
async fn run_blocking(
    work: impl FnOnce() -> StateOutcome + Send + 'static,
    timeout: Duration,
) -> StateOutcome {
    match tokio::time::timeout(timeout, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => StateOutcome {
            error: Some(format!("state run failed: {e}")),
            ..StateOutcome::default()
        },
        // The resources already started keep going on the blocking pool; the server is told
        // now rather than after an unknown time.
        Err(_) => StateOutcome {
            timed_out: true,
            error: Some(format!(
                "state run did not finish within {}",
                crate::clock::format_duration(timeout)
            )),
            ..StateOutcome::default()
        },
    }
}

/// A key file the executor (root) may trust: owned by root and writable by root only, in a
/// directory of the same kind, so the unprivileged daemon cannot replace the key.
fn check_root_owned(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let parent = path.parent().unwrap_or(Path::new("/"));
    for (what, checked) in [("command key", path), ("command key's directory", parent)] {
        let meta =
            std::fs::metadata(checked).map_err(|e| format!("{what} {}: {e}", checked.display()))?;
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(format!(
                "the {what} {} must be owned by root and writable by root only \
                 (set agent.command_key to a path like /etc/svc/command-key.pem)",
                checked.display()
            ));
        }
    }
    Ok(())
}

/// The daemon's side of the socket: sends one command, waits for its answer (the command's
/// own timeout and a minute more; the executor enforces the timeout itself).
pub async fn forward(
    socket: &Path,
    bytes: &[u8],
    signature: &str,
    fetched: Option<&[u8]>,
) -> Result<Option<Reply>, String> {
    let command = std::str::from_utf8(bytes).map_err(|_| "the command is not UTF-8".to_string())?;
    let timeout_ms = serde_json::from_slice::<Command>(bytes)
        .map(|c| c.timeout_ms)
        .unwrap_or(0);
    let wait = Duration::from_millis(timeout_ms) + Duration::from_secs(60);
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| format!("cannot reach the executor at {}: {e}", socket.display()))?;
        let mut line = serde_json::to_vec(&Request {
            command: command.to_string(),
            signature: signature.to_string(),
            plan_base64: fetched
                .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes))
                .unwrap_or_default(),
        })
        .map_err(|e| e.to_string())?;
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| format!("executor: {e}"))?;
        let mut answer = String::new();
        BufReader::new(stream)
            .take(MAX_LINE)
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("executor: {e}"))?;
        let answer: Answer = serde_json::from_str(&answer)
            .map_err(|e| format!("executor answered something else ({e})"))?;
        match answer {
            Answer {
                reply: Some(reply), ..
            } => Ok(Some(reply)),
            Answer {
                error: Some(error), ..
            } => Err(format!("executor: {error}")),
            _ => Ok(None),
        }
    };
    tokio::time::timeout(wait, exchange)
        .await
        .map_err(|_| "the executor did not answer in time".to_string())?
}

#[derive(argh::FromArgs, argh::ArgsInfo)]
/// Run the privileged executor: run the server-signed commands an unprivileged `svc-agent`
/// daemon hands over on a unix socket (docs/fleet.md).
#[argh(help_triggers("-h", "--help"))]
struct Args {
    /// the unix socket to listen on (made by the executor; a stale one is replaced)
    #[argh(option)]
    socket: PathBuf,
    /// the user the daemon runs as: may connect (with root and this process's own user), and
    /// the socket's group is set to its group
    #[argh(option)]
    peer_user: Option<String>,
    /// where job ids already run are kept across restarts (default $STATE_DIRECTORY, if set)
    #[argh(option)]
    state_dir: Option<PathBuf>,
    /// log level or filter (default info; SVC_LOG and RUST_LOG also work)
    #[argh(option, from_str_fn(crate::program::log_filter))]
    log_level: Option<String>,
}

pub fn main(program: &str, config_path: Option<PathBuf>, args: &[String]) -> i32 {
    let args = match crate::program::parse_args::<Args>(&format!("{program} executor"), args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let config = match super::load_config(program, config_path.as_deref()) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let agent = config.agent;
    let modules = config.modules;
    if agent.id.is_empty() {
        eprintln!("{program}: agent.id is not set: enrol first with `{program} bootstrap`");
        return exit::FAILED;
    }
    super::daemon::init_logging(args.log_level.as_deref().unwrap_or("info"));
    let state_dir = args
        .state_dir
        .clone()
        .or_else(|| std::env::var_os("STATE_DIRECTORY").map(PathBuf::from));
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let executor = match Executor::open(
        &agent,
        modules,
        state_dir.map(|d| d.join(SEEN_FILE)),
        is_root,
    ) {
        Ok(executor) => executor,
        Err(e) => {
            eprintln!("{program}: {e}");
            return exit::FAILED;
        }
    };
    if let Some(problem) = executor.problem() {
        eprintln!("{program}: {problem}");
        return exit::FAILED;
    }
    crate::program::run_async(program, serve(Arc::new(executor), args))
}

/// uid and gid of a user name.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd and result are written by getpwnam_r into memory we own; the strings it
    // points at live in `buffer`, which outlives the reads below.
    unsafe {
        let mut passwd: libc::passwd = std::mem::zeroed();
        let mut result = std::ptr::null_mut();
        let code = libc::getpwnam_r(
            name.as_ptr(),
            &mut passwd,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        );
        (code == 0 && !result.is_null()).then_some((passwd.pw_uid, passwd.pw_gid))
    }
}

async fn serve(executor: Arc<Executor>, args: Args) -> Result<(), CliError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let failed = |what: &str, e: std::io::Error| {
        CliError::failed(format!("{what} {}: {e}", args.socket.display()))
    };
    let peer = match &args.peer_user {
        Some(name) => Some(user_ids(name).ok_or_else(|| {
            CliError::failed(format!("--peer-user: no user '{name}' on this host"))
        })?),
        None => None,
    };
    if std::fs::symlink_metadata(&args.socket).is_ok_and(|m| m.file_type().is_socket()) {
        std::fs::remove_file(&args.socket).map_err(|e| failed("cannot remove", e))?;
    }
    let listener =
        tokio::net::UnixListener::bind(&args.socket).map_err(|e| failed("cannot listen on", e))?;
    // Only the daemon's group may connect (the peer check below is the second lock).
    let mode = if let Some((_, gid)) = peer {
        // SAFETY: chown only reads the path string.
        let path = std::ffi::CString::new(args.socket.as_os_str().as_encoded_bytes())
            .map_err(|_| CliError::failed("the socket path has a NUL byte"))?;
        if unsafe { libc::chown(path.as_ptr(), u32::MAX, gid) } != 0 {
            return Err(failed("cannot chown", std::io::Error::last_os_error()));
        }
        0o660
    } else {
        0o600
    };
    std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(mode))
        .map_err(|e| failed("cannot chmod", e))?;
    // SAFETY: geteuid has no preconditions.
    let own_uid = unsafe { libc::geteuid() };
    let allowed = move |uid: u32| uid == 0 || uid == own_uid || peer.is_some_and(|(p, _)| p == uid);
    tracing::info!(socket = %args.socket.display(), agent_id = %executor.agent_id, "svc-agent executor started");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_JOBS));
    let mut stop = super::daemon::StopSignals::install()?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let uid = stream.peer_cred().map(|cred| cred.uid()).ok();
                let executor = executor.clone();
                let slots = slots.clone();
                tokio::spawn(async move {
                    match uid {
                        Some(uid) if allowed(uid) => {
                            let Ok(_permit) = slots.acquire_owned().await else { return };
                            connection(&executor, stream).await;
                        }
                        _ => {
                            tracing::warn!(?uid, "connection refused: not the agent's user");
                            let why = format!("uid {} may not use this executor", uid.map_or("unknown".into(), |u| u.to_string()));
                            write_answer(stream, Answer { reply: None, error: Some(why) }).await;
                        }
                    }
                });
            }
            _ = stop.wait() => break,
        }
    }
    tracing::info!("stopping");
    let _ = tokio::time::timeout(Duration::from_secs(5), slots.acquire_many(MAX_JOBS as u32)).await;
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

/// One request, one answer.
async fn connection(executor: &Executor, stream: tokio::net::UnixStream) {
    let (read, write) = stream.into_split();
    let mut line = String::new();
    let read = BufReader::new(read)
        .take(MAX_LINE)
        .read_line(&mut line)
        .await;
    let answer = match read.map_err(|e| e.to_string()).and_then(|_| {
        serde_json::from_str::<Request>(&line).map_err(|e| format!("malformed request: {e}"))
    }) {
        Ok(request) => match fetched_plan(&request) {
            Err(error) => Answer {
                reply: None,
                error: Some(error),
            },
            Ok(fetched) => match executor
                .run(
                    request.command.as_bytes(),
                    &request.signature,
                    fetched.as_deref(),
                )
                .await
            {
                Some(reply) => Answer {
                    reply: Some(reply),
                    error: None,
                },
                None => Answer {
                    reply: None,
                    error: Some("command refused: not a command".into()),
                },
            },
        },
        Err(error) => Answer {
            reply: None,
            error: Some(error),
        },
    };
    write_answer(write, answer).await;
}

fn fetched_plan(request: &Request) -> Result<Option<Vec<u8>>, String> {
    if request.plan_base64.is_empty() {
        return Ok(None);
    }
    base64::engine::general_purpose::STANDARD
        .decode(&request.plan_base64)
        .map(Some)
        .map_err(|e| format!("malformed request: plan_base64: {e}"))
}

async fn write_answer(mut stream: impl tokio::io::AsyncWrite + Unpin, answer: Answer) {
    let mut bytes = serde_json::to_vec(&answer).expect("answers serialize");
    bytes.push(b'\n');
    if let Err(e) = stream.write_all(&bytes).await {
        tracing::warn!(error = %e, "answer not sent");
    }
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Plan;

    #[test]
    fn a_stored_plan_must_be_the_one_the_command_names() {
        let json = serde_json::to_vec(&Plan::default()).unwrap();
        let plan_ref = PlanRef {
            size: json.len() as u64,
            sha256: crate::files::sha256_hex(&json),
            chunk_size: 262144,
            chunks: vec![crate::files::sha256_hex(&json)],
            list_depth: 0,
        };
        assert_eq!(
            stored_plan(Plan::default(), Some(&plan_ref), Some(&json)),
            Ok(Plan::default())
        );
        let missing = stored_plan(Plan::default(), Some(&plan_ref), None).unwrap_err();
        assert!(missing.contains("was not fetched"), "{missing}");
        let mut other = json.clone();
        other[1] = b' ';
        let swapped = stored_plan(Plan::default(), Some(&plan_ref), Some(&other)).unwrap_err();
        assert!(swapped.contains("does not match"), "{swapped}");
        // A command that carries its plan ignores anything fetched.
        assert_eq!(
            stored_plan(Plan::default(), None, Some(b"junk")),
            Ok(Plan::default())
        );
    }
}
