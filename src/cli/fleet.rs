//! `svcctl agent|exec|state` (FleetService): the registry, quarantine, remote exec and
//! declarative state. `state compile` runs here with no server; the other state commands
//! compile the file here too (so `source:` files are read on this machine) and send the plan.

use std::io::Write;
use std::path::{Path, PathBuf};

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::target;
use super::{exit, run_command, CliError, Common, Output};
use crate::proto::fleet_service_client::FleetServiceClient;
use crate::proto::{self, Agent};

/// Largest answer read: `agent list` of a big fleet is one message of about 650 bytes an
/// agent with its facts (12 MB for 18,000 agents), past tonic's default of 4 MiB.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

async fn client(
    common: &Common,
) -> Result<FleetServiceClient<tonic::transport::Channel>, CliError> {
    Ok(FleetServiceClient::new(grpc_channel(common).await?)
        .max_decoding_message_size(MAX_ANSWER_BYTES))
}

pub(super) fn duration(text: &Option<String>, flag: &str) -> Result<u64, CliError> {
    match text {
        None => Ok(0),
        Some(text) => crate::clock::parse_duration(text)
            .filter(|d| !d.is_zero())
            .map(|d| d.as_millis() as u64)
            .ok_or_else(|| CliError::usage(format!("invalid {flag} '{text}' (e.g. 30s, 5m)"))),
    }
}

// ---------------------------------------------------------------------------------------
// svcctl agent

#[derive(FromArgs, argh::ArgsInfo)]
/// Inspect registered agents; label, quarantine and unquarantine them.
#[argh(help_triggers("-h", "--help"))]
pub(super) struct AgentArgs {
    #[argh(subcommand)]
    command: AgentCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum AgentCommand {
    List(ListArgs),
    Show(ShowArgs),
    Label(LabelArgs),
    Quarantine(QuarantineArgs),
    Unquarantine(UnquarantineArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Change an agent's labels (operator): k=v sets or replaces a label, k- (or --remove k)
/// removes it; others stay. Audited; --target selects on the new labels at once.
#[argh(subcommand, name = "label", help_triggers("-h", "--help"))]
struct LabelArgs {
    /// agent id
    #[argh(positional)]
    id: String,
    /// k=v to set, k- to remove
    #[argh(positional)]
    changes: Vec<String>,
    /// a label key to remove (repeatable)
    #[argh(option)]
    remove: Vec<String>,
}

impl LabelArgs {
    /// The request, or a usage error naming the first malformed change.
    fn request(&self) -> Result<proto::SetLabelsRequest, CliError> {
        let mut set = std::collections::HashMap::new();
        let mut remove = self.remove.clone();
        for change in &self.changes {
            if let Some((key, value)) = change.split_once('=') {
                crate::fleet::selector::check_label(key, value).map_err(CliError::usage)?;
                set.insert(key.to_string(), value.to_string());
            } else if let Some(key) = change.strip_suffix('-').filter(|k| !k.is_empty()) {
                remove.push(key.to_string());
            } else {
                return Err(CliError::usage(format!(
                    "'{change}' is neither k=v (set) nor k- (remove)"
                )));
            }
        }
        if set.is_empty() && remove.is_empty() {
            return Err(CliError::usage(
                "nothing to change: svcctl agent label AGENT k=v... [k-...] [--remove k]",
            ));
        }
        Ok(proto::SetLabelsRequest {
            id: self.id.clone(),
            set,
            remove,
        })
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List enrolled agents with their state (connected, disconnected, pending, quarantined).
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct ListArgs {
    /// only agents matching: *, id globs (web-*), a comma list, or labels and facts (role=web,os_family=debian)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// only agents in these states, comma-separated: connected, disconnected, pending, quarantined
    #[argh(option)]
    state: Option<String>,
    /// stop after this many agents (default: all)
    #[argh(option)]
    limit: Option<usize>,
}

/// Agents asked for per page by `agent list`, which follows the server's cursors itself: the
/// table is printed a page at a time (its columns aligned within each page).
const LIST_PAGE: usize = 1000;

#[derive(FromArgs, argh::ArgsInfo)]
/// Show one agent, with the facts it reported about its host (os, arch, addresses, ...).
#[argh(subcommand, name = "show", help_triggers("-h", "--help"))]
struct ShowArgs {
    /// agent id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Quarantine an agent: its heartbeats are rejected and it gets no commands (operator).
#[argh(subcommand, name = "quarantine", help_triggers("-h", "--help"))]
struct QuarantineArgs {
    /// agent id
    #[argh(positional)]
    id: String,
    /// why, for the audit log and the agent record
    #[argh(option)]
    reason: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Lift an agent's quarantine (operator).
#[argh(subcommand, name = "unquarantine", help_triggers("-h", "--help"))]
struct UnquarantineArgs {
    /// agent id
    #[argh(positional)]
    id: String,
}

pub fn agent(program: &str, common: Common, args: &[String]) -> i32 {
    run_command::<AgentArgs, _>(
        program,
        &format!("{program} agent"),
        args,
        common,
        agent_command,
    )
}

fn agent_json(agent: &Agent) -> serde_json::Value {
    let optional = |text: &str| {
        if text.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::json!(text)
        }
    };
    let labels: std::collections::BTreeMap<_, _> = agent.labels.iter().collect();
    serde_json::json!({
        "id": agent.id, "state": agent.state, "labels": labels, "facts": facts_of(agent),
        "quarantined": agent.quarantined,
        "quarantine_reason": optional(&agent.quarantine_reason),
        "quarantined_at": optional(&agent.quarantined_at),
        "last_heartbeat_at": optional(&agent.last_heartbeat_at),
        "enrolled_at": agent.enrolled_at, "fingerprint": agent.fingerprint,
        "hostname": optional(&agent.hostname), "version": optional(&agent.version),
    })
}

/// The agent's facts (`facts_json`); empty when it reported none or the server is older.
fn facts_of(agent: &Agent) -> crate::facts::Facts {
    crate::facts::from_text(&agent.facts_json)
}

/// `svcctl agent show`: the facts under the agent's row, one per line, in the order of
/// `facts::NAMES` (then any others the agent reported).
fn print_facts(agent: &Agent) {
    let facts = facts_of(agent);
    if facts.is_empty() {
        println!("\nno facts reported yet");
        return;
    }
    let known = crate::facts::NAMES
        .iter()
        .filter_map(|name| facts.get_key_value(*name));
    let others = facts
        .iter()
        .filter(|(name, _)| !crate::facts::is_fact_name(name));
    let rows: Vec<Vec<String>> = known
        .chain(others)
        .map(|(name, value)| vec![name.clone(), crate::facts::display(value)])
        .collect();
    println!();
    print_table(&["FACT", "VALUE"], &rows);
}

fn print_agents(agents: &[Agent]) {
    print!("{}", format_agents(agents));
}

/// The table of `agents`, with its header line.
fn format_agents(agents: &[Agent]) -> String {
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|a| {
            let mut labels: Vec<String> =
                a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            let dash = |text: &str| {
                if text.is_empty() {
                    "-".to_string()
                } else {
                    text.to_string()
                }
            };
            vec![
                a.id.clone(),
                a.state.clone(),
                dash(&labels.join(",")),
                dash(&a.last_heartbeat_at),
                dash(&a.hostname),
                dash(&a.quarantine_reason),
            ]
        })
        .collect();
    crate::program::output::format_table(
        &[
            "ID",
            "STATE",
            "LABELS",
            "LAST HEARTBEAT",
            "HOSTNAME",
            "QUARANTINE REASON",
        ],
        &rows,
    )
}

/// `svcctl agent list`: every matching agent (up to `--limit`), page after page. The table
/// is printed as each page comes (its header once); JSON is one array, as it always was.
async fn list_agents(
    common: &Common,
    client: &mut FleetServiceClient<tonic::transport::Channel>,
    args: ListArgs,
) -> Result<(), CliError> {
    let wanted = args.limit.unwrap_or(usize::MAX);
    let mut cursor = String::new();
    let mut shown = 0;
    let mut all = Vec::new();
    while shown < wanted {
        let request = proto::ListAgentsRequest {
            target: args.target.clone().unwrap_or_default(),
            state: args.state.clone().unwrap_or_default(),
            limit: (wanted - shown).min(LIST_PAGE) as u32,
            cursor,
        };
        let page = client
            .list_agents(authorized(common, request)?)
            .await?
            .into_inner();
        shown += page.agents.len();
        match common.output {
            Output::Json => all.extend(page.agents),
            Output::Table => {
                let table = format_agents(&page.agents);
                // The header once, above the first page (even when it is empty).
                let body = if shown > page.agents.len() {
                    table.split_once('\n').map_or("", |(_, rest)| rest)
                } else {
                    &table
                };
                print!("{body}");
                let _ = std::io::stdout().flush();
            }
        }
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    if common.output == Output::Json {
        print_json(&all.iter().map(agent_json).collect::<Vec<_>>())?;
    }
    Ok(())
}

async fn agent_command(common: Common, args: AgentArgs) -> Result<(), CliError> {
    // A malformed change is a usage error before any connection is tried.
    if let AgentCommand::Label(label) = &args.command {
        label.request()?;
    }
    let mut client = client(&common).await?;
    let is_show = matches!(args.command, AgentCommand::Show(_));
    let one = match args.command {
        AgentCommand::List(args) => return list_agents(&common, &mut client, args).await,
        AgentCommand::Show(args) => {
            let request = proto::AgentRequest { id: args.id };
            client.get_agent(authorized(&common, request)?).await?
        }
        AgentCommand::Label(args) => {
            let request = args.request()?;
            client.set_labels(authorized(&common, request)?).await?
        }
        AgentCommand::Quarantine(args) => {
            let request = proto::QuarantineRequest {
                id: args.id,
                reason: args.reason.unwrap_or_default(),
            };
            client.quarantine(authorized(&common, request)?).await?
        }
        AgentCommand::Unquarantine(args) => {
            let request = proto::AgentRequest { id: args.id };
            client.unquarantine(authorized(&common, request)?).await?
        }
    }
    .into_inner();
    match common.output {
        Output::Json => print_json(&agent_json(&one)),
        Output::Table => {
            print_agents(std::slice::from_ref(&one));
            if is_show {
                print_facts(&one);
            }
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------------------
// svcctl exec

#[derive(FromArgs, argh::ArgsInfo)]
/// Run a program on agents (no shell: use `-- sh -c '...'` for one) and stream each agent's
/// exit code, output and duration as it arrives; past 20 targeted agents, print a summary
/// instead (counts, and each agent that did not succeed with its first line of output).
/// Exits 1 if any targeted agent failed, timed out, or did not run it (quarantined agents
/// are skipped; unreachable ones too). Every job is kept on the server: svcctl job show ID.
#[argh(help_triggers("-h", "--help"))]
pub(super) struct ExecArgs {
    /// which agents: * (default), id globs (web-*), a comma list, or labels and facts (role=web,os_family=debian)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// how long each agent may run it (default 60s; e.g. 30s, 5m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
    /// how many agents run it at once (default: all)
    #[argh(option)]
    concurrency: Option<u32>,
    /// print the job id and return at once; the server collects the results (svcctl job show ID)
    #[argh(switch, long = "async")]
    detach: bool,
    /// print every agent's result, however many agents are targeted
    #[argh(switch)]
    verbose: bool,
    /// the command and its arguments, after --
    #[argh(positional, greedy)]
    command: Vec<String>,
}

pub fn exec(program: &str, common: Common, args: &[String]) -> i32 {
    run_command::<ExecArgs, _>(
        program,
        &format!("{program} exec"),
        args,
        common,
        exec_command,
    )
}

/// Counts of results by status, for the summary line and the exit code.
#[derive(Default, serde::Serialize)]
pub(super) struct Summary {
    agents: u64,
    #[serde(flatten)]
    by_status: std::collections::BTreeMap<String, u64>,
    job_id: String,
    /// Targeted agents that did not run the job, with why: `web-2 (quarantined)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_run: Vec<String>,
}

/// Statuses of a targeted agent that did not run the job at all.
const NOT_RUN: &[&str] = &["skipped", "unreachable", "no_state"];

impl Summary {
    pub(super) fn add_agent(&mut self, agent_id: &str, status: &str, job_id: &str) {
        self.agents += 1;
        *self.by_status.entry(status.to_string()).or_default() += 1;
        if self.job_id.is_empty() {
            self.job_id = job_id.to_string();
        }
        if NOT_RUN.contains(&status) {
            let why = match status {
                "skipped" => "quarantined",
                "no_state" => "no state applied yet",
                _ => "unreachable",
            };
            self.not_run.push(format!("{agent_id} ({why})"));
        }
    }

    fn count(&self, statuses: &[&str]) -> u64 {
        statuses
            .iter()
            .map(|s| self.by_status.get(*s).copied().unwrap_or(0))
            .sum()
    }

    fn line(&self) -> String {
        format!(
            "{} agent{}: {} (job {})",
            self.agents,
            if self.agents == 1 { "" } else { "s" },
            counts_text(&self.by_status),
            self.job_id
        )
    }

    /// Prints the summary (stderr for tables, a last JSON line otherwise) and turns the
    /// counts of `failing` statuses into the exit code. A targeted agent that did not run the
    /// job (quarantined, unreachable, no state) always fails the run, and the message says
    /// which and why.
    pub(super) fn finish(&self, output: Output, failing: &[&str]) -> Result<(), CliError> {
        match output {
            Output::Json => println!("{}", serde_json::json!({ "summary": self })),
            Output::Table => eprintln!("{}", self.line()),
        }
        let not_run = self.count(NOT_RUN);
        let failed: u64 = self
            .by_status
            .iter()
            .filter(|(status, _)| {
                failing.contains(&status.as_str()) || NOT_RUN.contains(&status.as_str())
            })
            .map(|(_, n)| n)
            .sum();
        if failed == 0 {
            return Ok(());
        }
        // The details are above; the exit code carries the verdict.
        let mut message = if not_run == self.agents {
            "nothing ran".to_string()
        } else {
            format!("{failed} of {} agents did not succeed", self.agents)
        };
        if not_run > 0 {
            message.push_str(&format!("; not run on {}", self.not_run.join(", ")));
        }
        Err(CliError::new(exit::FAILED, message))
    }
}

fn write_block(out: &mut impl Write, label: &str, text: &[u8]) {
    if text.is_empty() {
        return;
    }
    let _ = writeln!(out, "  [{label}]");
    for line in String::from_utf8_lossy(text).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

async fn exec_command(common: Common, args: ExecArgs) -> Result<(), CliError> {
    if args.command.is_empty() {
        return Err(CliError::usage(
            "no command given: svcctl exec [--target SEL] -- CMD ARGS...",
        ));
    }
    let request = proto::ExecRequest {
        target: args.target.unwrap_or_default(),
        argv: args.command,
        timeout_ms: duration(&args.timeout, "--timeout")?,
        concurrency: args.concurrency.unwrap_or(0),
    };
    let mut client = client(&common).await?;
    if args.detach {
        let started = client
            .exec_async(authorized(&common, request)?)
            .await?
            .into_inner();
        return print_started(common.output, &started);
    }
    let mut stream = client
        .exec(authorized(&common, request)?)
        .await?
        .into_inner();
    let mut results = Results::new(common.output, args.verbose);
    while let Some(result) = stream.message().await? {
        results.exec(&result);
    }
    results.finish(EXEC_FAILING)
}

/// The statuses that fail an exec (and a state run; drift adds `drift`).
const EXEC_FAILING: &[&str] = &["failed", "timed_out", "unreachable"];

/// Above this many targeted agents, exec (and job show) print a summary on a table rather
/// than every result (docs/fleet.md, "Output").
pub(super) const SUMMARY_ABOVE: u32 = 20;

/// Prints a fan-out's results: each as it arrives, or, above [`SUMMARY_ABOVE`] targets on a
/// table without --verbose, only the agents that did not succeed with their first line, once
/// all are in. Then the counts and the exit code (`Summary::finish`).
pub(super) struct Results {
    output: Output,
    verbose: bool,
    summary: Summary,
    /// In summary mode: a row per agent that did not succeed.
    digest: Option<Vec<Vec<String>>>,
}

impl Results {
    pub(super) fn new(output: Output, verbose: bool) -> Results {
        Results {
            output,
            verbose,
            summary: Summary::default(),
            digest: None,
        }
    }

    /// Counts a result; true when it is to be printed in full.
    fn add(
        &mut self,
        agent_id: &str,
        status: &str,
        job_id: &str,
        agents: u32,
        first_line: impl FnOnce() -> String,
    ) -> bool {
        self.summary.add_agent(agent_id, status, job_id);
        if self.output == Output::Json || self.verbose || agents <= SUMMARY_ABOVE {
            return true;
        }
        let digest = self.digest.get_or_insert_with(Vec::new);
        if !matches!(status, "ok" | "changed") {
            digest.push(vec![agent_id.to_string(), status.to_string(), first_line()]);
        }
        false
    }

    pub(super) fn exec(&mut self, result: &proto::ExecResult) {
        let first = || {
            let (stderr, stdout) = (
                String::from_utf8_lossy(&result.stderr),
                String::from_utf8_lossy(&result.stdout),
            );
            match first_line(&result.error) {
                Some(error) => error.to_string(),
                None => {
                    let line = first_line(&stderr).or_else(|| first_line(&stdout));
                    format!("exit {}: {}", result.exit_code, line.unwrap_or_default())
                }
            }
        };
        self.print(
            (
                &result.agent_id,
                &result.status,
                &result.job_id,
                result.agents,
            ),
            first,
            || exec_json(result),
            |out| {
                let _ = writeln!(
                    out,
                    "== {}  {}  exit {}  {} ms",
                    result.agent_id, result.status, result.exit_code, result.duration_ms
                );
                if !result.error.is_empty() {
                    let _ = writeln!(out, "  error: {}", result.error);
                }
                write_block(out, "stdout", &result.stdout);
                write_block(out, "stderr", &result.stderr);
                if result.truncated {
                    let _ = writeln!(out, "  (output truncated)");
                }
            },
        );
    }

    pub(super) fn state(&mut self, result: &proto::StateResult, operation: &str) {
        let first = || {
            let failed = result
                .outcomes
                .iter()
                .find(|o| !o.error.is_empty())
                .map(|o| format!("{}: {}", o.resource, o.error));
            first_line(&result.error)
                .or(failed.as_deref().and_then(first_line))
                .map(str::to_string)
                .unwrap_or_else(|| result.drift.join(", "))
        };
        self.print(
            (
                &result.agent_id,
                &result.status,
                &result.job_id,
                result.agents,
            ),
            first,
            || state_json(result),
            |out| print_state_result(out, result, operation),
        );
    }

    /// Counts a result (agent, status, job, targeted agents) and prints it in full (`json`
    /// or `table`), or keeps its `first_line` for the summary.
    fn print(
        &mut self,
        (agent_id, status, job_id, agents): (&str, &str, &str, u32),
        first_line: impl FnOnce() -> String,
        json: impl FnOnce() -> serde_json::Value,
        table: impl FnOnce(&mut std::io::StdoutLock<'static>),
    ) {
        if !self.add(agent_id, status, job_id, agents, first_line) {
            return;
        }
        let mut out = std::io::stdout().lock();
        match self.output {
            Output::Json => {
                let _ = writeln!(out, "{}", json());
            }
            Output::Table => table(&mut out),
        }
        let _ = out.flush();
    }

    pub(super) fn finish(self, failing: &[&str]) -> Result<(), CliError> {
        if let Some(rows) = &self.digest {
            println!(
                "{} agents: more than {SUMMARY_ABOVE}, so only those that did not succeed are \
                 listed (--verbose or -o json prints every result)",
                self.summary.agents
            );
            if !rows.is_empty() {
                print_table(&["AGENT", "STATUS", "FIRST LINE"], rows);
            }
        }
        self.summary.finish(self.output, failing)
    }
}

/// The first line of `text` with something on it.
fn first_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|line| !line.is_empty())
}

fn exec_json(result: &proto::ExecResult) -> serde_json::Value {
    serde_json::json!({
        "agent_id": result.agent_id, "status": result.status,
        "exit_code": result.exit_code,
        "stdout": String::from_utf8_lossy(&result.stdout),
        "stderr": String::from_utf8_lossy(&result.stderr),
        "duration_ms": result.duration_ms, "timed_out": result.timed_out,
        "truncated": result.truncated,
        "error": (!result.error.is_empty()).then_some(&result.error),
        "job_id": result.job_id,
    })
}

/// What `--async` prints: the job's id (and how to follow it).
fn print_started(output: Output, started: &proto::JobStarted) -> Result<(), CliError> {
    match output {
        Output::Json => print_json(&serde_json::json!({
            "job_id": started.job_id, "agents": started.agents,
        })),
        Output::Table => {
            println!("{}", started.job_id);
            eprintln!(
                "job {} started on {} agent{}; the server collects the results: svcctl job show {}",
                started.job_id,
                started.agents,
                if started.agents == 1 { "" } else { "s" },
                started.job_id
            );
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------------------
// svcctl job

#[derive(FromArgs, argh::ArgsInfo)]
/// Jobs kept on the server (exec, state and module runs, synchronous or --async): list them,
/// or show one job's results from any terminal and any cluster member.
#[argh(help_triggers("-h", "--help"))]
pub(super) struct JobArgs {
    #[argh(subcommand)]
    command: JobCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum JobCommand {
    List(JobListArgs),
    Show(JobShowArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List jobs, newest first, with their results so far by status.
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct JobListArgs {
    /// at most this many (default 50, at most 1000)
    #[argh(option)]
    limit: Option<u32>,
    /// only jobs older than this job id (the next page)
    #[argh(option)]
    before: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show a job and each agent's result (status, exit code, output; past 20 agents a summary
/// unless --verbose or -o json). Exits 1 when an agent failed, as the exec or state run
/// would have; a job still running shows the results so far.
#[argh(subcommand, name = "show", help_triggers("-h", "--help"))]
struct JobShowArgs {
    /// the job id (svcctl job list, or what exec and state print)
    #[argh(positional)]
    id: String,
    /// print every agent's result, however many agents are targeted
    #[argh(switch)]
    verbose: bool,
}

pub fn job(program: &str, common: Common, args: &[String]) -> i32 {
    run_command::<JobArgs, _>(
        program,
        &format!("{program} job"),
        args,
        common,
        job_command,
    )
}

fn job_json(job: &proto::Job) -> serde_json::Value {
    let counts: std::collections::BTreeMap<_, _> = job.counts.iter().collect();
    serde_json::json!({
        "id": job.id, "kind": job.kind, "target": job.target, "description": job.description,
        "created_by": job.created_by, "created_at": job.created_at,
        "finished_at": (!job.finished_at.is_empty()).then_some(&job.finished_at),
        "status": job.status, "agents": job.agents, "counts": counts,
    })
}

/// `1 failed, 3 ok`: counts by status, in status order.
fn counts_text(counts: &std::collections::BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(status, n)| format!("{n} {}", status.replace('_', " ")))
        .collect();
    parts.join(", ")
}

async fn job_command(common: Common, args: JobArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    let show = match args.command {
        JobCommand::List(args) => {
            let request = proto::ListJobsRequest {
                limit: args.limit.unwrap_or(0),
                before: args.before.unwrap_or_default(),
            };
            let jobs = client
                .list_jobs(authorized(&common, request)?)
                .await?
                .into_inner()
                .jobs;
            return match common.output {
                Output::Json => print_json(&jobs.iter().map(job_json).collect::<Vec<_>>()),
                Output::Table => {
                    let rows: Vec<Vec<String>> = jobs
                        .iter()
                        .map(|j| {
                            vec![
                                j.id.clone(),
                                j.kind.clone(),
                                j.status.clone(),
                                j.agents.to_string(),
                                match counts_text(&j.counts.clone().into_iter().collect()) {
                                    text if text.is_empty() => "-".into(),
                                    text => text,
                                },
                                j.created_at.clone(),
                                j.created_by.clone(),
                                j.description.clone(),
                            ]
                        })
                        .collect();
                    print_table(
                        &[
                            "ID", "KIND", "STATUS", "AGENTS", "RESULTS", "CREATED", "BY", "WHAT",
                        ],
                        &rows,
                    );
                    Ok(())
                }
            };
        }
        JobCommand::Show(args) => args,
    };
    let request = proto::JobRequest { id: show.id };
    let mut stream = client
        .get_job(authorized(&common, request)?)
        .await?
        .into_inner();
    let Some(proto::JobPart {
        part: Some(proto::job_part::Part::Job(job)),
    }) = stream.message().await?
    else {
        return Err(CliError::failed("the server sent no job"));
    };
    match common.output {
        Output::Json => println!("{}", serde_json::json!({ "job": job_json(&job) })),
        Output::Table => {
            println!(
                "job {}  {}  {}  by {} at {}  target '{}'",
                job.id,
                job.kind,
                job.status,
                job.created_by,
                job.created_at,
                if job.target.is_empty() {
                    "*"
                } else {
                    &job.target
                }
            );
            println!("  {}", job.description);
        }
    }
    let operation = job.kind.rsplit('.').next().unwrap_or_default();
    let mut results = Results::new(common.output, show.verbose);
    while let Some(part) = stream.message().await? {
        match part.part {
            Some(proto::job_part::Part::Exec(result)) => results.exec(&result),
            Some(proto::job_part::Part::State(result)) => results.state(&result, operation),
            _ => {}
        }
    }
    let got = results.summary.agents;
    if job.status != "finished" {
        eprintln!(
            "job {} is {}: {got} of {} results in",
            job.id, job.status, job.agents
        );
    }
    results.finish(&state_failing(operation))
}

// ---------------------------------------------------------------------------------------
// svcctl state

#[derive(FromArgs, argh::ArgsInfo)]
/// Declarative state: compile (here, no server), check (dry run), apply, drift.
#[argh(help_triggers("-h", "--help"))]
pub(super) struct StateArgs {
    #[argh(subcommand)]
    command: StateCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum StateCommand {
    Compile(CompileArgs),
    Check(RunArgs),
    Apply(ApplyArgs),
    Drift(DriftArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Validate a state file and print its resources (no server needed); `-o json` prints the
/// compiled plan. Errors name the line.
#[argh(subcommand, name = "compile", help_triggers("-h", "--help"))]
struct CompileArgs {
    /// the state file (a YAML list of resources, or vars: and resources:)
    #[argh(positional)]
    file: PathBuf,
    /// a template parameter NAME=VALUE, over the file's vars (repeatable)
    #[argh(option, long = "set")]
    set: Vec<String>,
    /// a secret template parameter NAME=VALUE: redacted from diffs (repeatable)
    #[argh(option, long = "set-secret")]
    set_secret: Vec<String>,
}

// Flags shared by check and apply (argh has no flatten, so apply repeats them). A plain
// comment: a doc comment here would be glued onto the command's help.
#[derive(FromArgs, argh::ArgsInfo)]
/// Report what applying the state file would change on the targeted agents (dry run).
#[argh(subcommand, name = "check", help_triggers("-h", "--help"))]
struct RunArgs {
    /// the state file (a YAML list of resources, or vars: and resources:)
    #[argh(positional)]
    file: PathBuf,
    /// which agents: * (default), id globs, a comma list, or labels and facts (role=web,arch=x86_64)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
    /// how many agents work at once (default: all)
    #[argh(option)]
    concurrency: Option<u32>,
    /// a template parameter NAME=VALUE, over the file's vars (repeatable)
    #[argh(option, long = "set")]
    set: Vec<String>,
    /// a secret template parameter NAME=VALUE: redacted from diffs (repeatable)
    #[argh(option, long = "set-secret")]
    set_secret: Vec<String>,
    /// show a unified diff of each file that would change
    #[argh(switch)]
    diff: bool,
    /// print every agent's result, however many agents are targeted
    #[argh(switch)]
    verbose: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Apply the state file on the targeted agents and report what changed. Applying the same
/// state again changes nothing. Exits 1 if any resource or agent failed.
#[argh(subcommand, name = "apply", help_triggers("-h", "--help"))]
struct ApplyArgs {
    /// the state file (a YAML list of resources, or vars: and resources:)
    #[argh(positional)]
    file: PathBuf,
    /// which agents: * (default), id globs, a comma list, or labels and facts (role=web,arch=x86_64)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
    /// how many agents work at once (default: all)
    #[argh(option)]
    concurrency: Option<u32>,
    /// a template parameter NAME=VALUE, over the file's vars (repeatable)
    #[argh(option, long = "set")]
    set: Vec<String>,
    /// a secret template parameter NAME=VALUE (repeatable)
    #[argh(option, long = "set-secret")]
    set_secret: Vec<String>,
    /// print the job id and return at once; the server collects the results (svcctl job show ID)
    #[argh(switch, long = "async")]
    detach: bool,
    /// print every agent's result, however many agents are targeted
    #[argh(switch)]
    verbose: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Check each agent's last applied state against the host now; exits 1 when anything
/// drifted (or an agent failed).
#[argh(subcommand, name = "drift", help_triggers("-h", "--help"))]
struct DriftArgs {
    /// which agents: * (default), id globs, a comma list, or labels and facts (role=web,arch=x86_64)
    #[argh(option, short = 't', from_str_fn(target))]
    target: Option<String>,
    /// how long each agent may take (default 10m)
    #[argh(option, from_str_fn(super::values::duration))]
    timeout: Option<String>,
    /// print every agent's result, however many agents are targeted
    #[argh(switch)]
    verbose: bool,
}

pub fn state(program: &str, common: Common, args: &[String]) -> i32 {
    run_command::<StateArgs, _>(
        program,
        &format!("{program} state"),
        args,
        common,
        state_command,
    )
}

/// Compiles a state file on this machine (sources and templates relative to its directory),
/// with `--set` and `--set-secret` as template parameters.
fn compile(
    file: &Path,
    set: &[String],
    set_secret: &[String],
) -> Result<crate::state::Plan, CliError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::failed(format!("cannot read {}: {e}", file.display())))?;
    let base = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut settings = Vec::new();
    for (values, secret) in [(set, false), (set_secret, true)] {
        for value in values {
            let flag = if secret { "--set-secret" } else { "--set" };
            let Some((name, value)) = value.split_once('=').filter(|(name, _)| !name.is_empty())
            else {
                return Err(CliError::usage(format!(
                    "{flag} '{}': expected NAME=VALUE",
                    if secret { "..." } else { value.as_str() }
                )));
            };
            settings.push(crate::state::Setting {
                name: name.to_string(),
                value: value.to_string(),
                secret,
            });
        }
    }
    crate::state::compile_with(&text, base, &settings)
        .map_err(|e| CliError::failed(format!("{}: {e}", file.display())))
}

/// What check, apply and drift send.
struct StateRun {
    operation: &'static str,
    plan: Option<crate::state::Plan>,
    target: Option<String>,
    timeout: Option<String>,
    concurrency: Option<u32>,
    diff: bool,
    detach: bool,
    verbose: bool,
}

async fn state_command(common: Common, args: StateArgs) -> Result<(), CliError> {
    let run = match args.command {
        StateCommand::Compile(args) => {
            let plan = compile(&args.file, &args.set, &args.set_secret)?;
            return match common.output {
                Output::Json => print_json(&plan),
                Output::Table => {
                    let rows: Vec<Vec<String>> = plan
                        .resources
                        .iter()
                        .enumerate()
                        .map(|(i, resource)| {
                            let mut settings = settings(resource);
                            if let Some(links) = plan.links_of(i).filter(|l| !l.is_empty()) {
                                settings.push_str(&links_text(links));
                            }
                            vec![(i + 1).to_string(), resource.label(), settings]
                        })
                        .collect();
                    print_table(&["#", "RESOURCE", "SETTINGS"], &rows);
                    Ok(())
                }
            };
        }
        StateCommand::Check(a) => StateRun {
            operation: "check",
            plan: Some(compile(&a.file, &a.set, &a.set_secret)?),
            target: a.target,
            timeout: a.timeout,
            concurrency: a.concurrency,
            diff: a.diff,
            detach: false,
            verbose: a.verbose,
        },
        StateCommand::Apply(a) => StateRun {
            operation: "apply",
            plan: Some(compile(&a.file, &a.set, &a.set_secret)?),
            target: a.target,
            timeout: a.timeout,
            concurrency: a.concurrency,
            diff: false,
            detach: a.detach,
            verbose: a.verbose,
        },
        StateCommand::Drift(a) => StateRun {
            operation: "drift",
            plan: None,
            target: a.target,
            timeout: a.timeout,
            concurrency: None,
            diff: false,
            detach: false,
            verbose: a.verbose,
        },
    };
    let plan = match &run.plan {
        Some(plan) => serde_json::to_string(plan)
            .map_err(|e| CliError::failed(format!("cannot encode the plan: {e}")))?,
        None => String::new(),
    };
    let request = proto::StateRequest {
        target: run.target.unwrap_or_default(),
        plan,
        timeout_ms: duration(&run.timeout, "--timeout")?,
        concurrency: run.concurrency.unwrap_or(0),
        diff: run.diff,
    };
    let operation = run.operation;
    let mut client = client(&common).await?;
    let request = authorized(&common, request)?;
    if run.detach {
        let started = client.state_apply_async(request).await?.into_inner();
        return print_started(common.output, &started);
    }
    let stream = match operation {
        "check" => client.state_check(request).await?,
        "apply" => client.state_apply(request).await?,
        _ => client.state_drift(request).await?,
    }
    .into_inner();
    print_state_stream(Results::new(common.output, run.verbose), stream, operation).await
}

/// Prints each agent's state result as it arrives (or a summary, see [`Results`]); an error
/// when any agent failed, timed out or was unreachable (or drifted, for drift).
pub(super) async fn print_state_stream(
    mut results: Results,
    mut stream: tonic::Streaming<proto::StateResult>,
    operation: &str,
) -> Result<(), CliError> {
    while let Some(result) = stream.message().await? {
        results.state(&result, operation);
    }
    results.finish(&state_failing(operation))
}

/// The statuses that fail a state run of `operation` (check, apply, drift).
fn state_failing(operation: &str) -> Vec<&'static str> {
    let mut failing = EXEC_FAILING.to_vec();
    if operation == "drift" {
        failing.push("drift");
    }
    failing
}

/// A resource's settings other than what its label shows, as `key=value` (content as a size).
fn settings(resource: &crate::state::Resource) -> String {
    let value = serde_json::to_value(resource).unwrap_or_default();
    let Some((_, fields)) = value.as_object().and_then(|o| o.iter().next()) else {
        return String::new();
    };
    let mut parts = Vec::new();
    for (key, field) in fields.as_object().into_iter().flatten() {
        match (key.as_str(), field) {
            ("path" | "name" | "run", _) => {}
            ("content" | "content_base64", serde_json::Value::String(text)) => {
                parts.push(format!("{key}=({} bytes)", text.len()))
            }
            (_, serde_json::Value::String(text)) => parts.push(format!("{key}={text}")),
            (_, other) => parts.push(format!("{key}={other}")),
        }
    }
    parts.join(" ")
}

/// ` id=x require=a,b onchanges=c`, for the compile table.
fn links_text(links: &crate::state::Links) -> String {
    let mut text = String::new();
    if let Some(id) = &links.id {
        text.push_str(&format!(" id={id}"));
    }
    for (key, ids) in [("require", &links.require), ("onchanges", &links.onchanges)] {
        if !ids.is_empty() {
            text.push_str(&format!(" {key}={}", ids.join(",")));
        }
    }
    text
}

pub(super) fn state_json(result: &proto::StateResult) -> serde_json::Value {
    let outcomes: Vec<serde_json::Value> = result
        .outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "resource": o.resource, "changed": o.changed, "detail": o.detail,
                "error": (!o.error.is_empty()).then_some(&o.error),
                "diff": (!o.diff.is_empty()).then_some(&o.diff),
            })
        })
        .collect();
    serde_json::json!({
        "agent_id": result.agent_id, "status": result.status, "outcomes": outcomes,
        "drift": result.drift, "duration_ms": result.duration_ms,
        "error": (!result.error.is_empty()).then_some(&result.error),
        "job_id": result.job_id, "logs": result.logs,
    })
}

pub(super) fn print_state_result(
    out: &mut impl Write,
    result: &proto::StateResult,
    operation: &str,
) {
    let _ = writeln!(
        out,
        "== {}  {}  {} ms",
        result.agent_id, result.status, result.duration_ms
    );
    if !result.error.is_empty() {
        let _ = writeln!(out, "  error: {}", result.error);
    }
    for line in &result.logs {
        let _ = writeln!(out, "  log: {line}");
    }
    let rows: Vec<Vec<String>> = result
        .outcomes
        .iter()
        .map(|o| {
            let word = match (o.error.is_empty(), o.changed, operation) {
                (false, _, _) => "failed",
                (true, true, "apply") => "changed",
                (true, true, "drift") if result.drift.contains(&o.resource) => "drifted",
                (true, true, _) => "would change",
                (true, false, _) => "ok",
            };
            let detail = if o.error.is_empty() {
                o.detail.clone()
            } else {
                o.error.clone()
            };
            vec![format!("  {word}"), o.resource.clone(), detail]
        })
        .collect();
    if !rows.is_empty() {
        let _ = write!(
            out,
            "{}",
            super::output::format_table(&["  RESULT", "RESOURCE", "DETAIL"], &rows)
        );
    }
    for outcome in result.outcomes.iter().filter(|o| !o.diff.is_empty()) {
        let _ = writeln!(out, "  diff {}:", outcome.resource);
        for line in outcome.diff.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_and_exit() {
        let mut summary = Summary::default();
        summary.add_agent("a", "ok", "J");
        summary.add_agent("b", "failed", "J");
        assert_eq!(summary.line(), "2 agents: 1 failed, 1 ok (job J)");
        assert_eq!(summary.count(&["failed", "timed_out"]), 1);
        assert!(summary.finish(Output::Table, &["timed_out"]).is_ok());
        assert_eq!(
            summary.finish(Output::Table, &["failed"]).unwrap_err().code,
            exit::FAILED
        );
        // A skipped agent did not run the job: that fails the run, and the message says why.
        summary.add_agent("c", "skipped", "J");
        let error = summary.finish(Output::Table, &["timed_out"]).unwrap_err();
        assert_eq!(error.code, exit::FAILED);
        assert_eq!(
            error.message,
            "1 of 3 agents did not succeed; not run on c (quarantined)"
        );
        let mut nothing = Summary::default();
        nothing.add_agent("web-2", "skipped", "J");
        nothing.add_agent("web-3", "unreachable", "J");
        assert_eq!(
            nothing
                .finish(Output::Table, &["failed"])
                .unwrap_err()
                .message,
            "nothing ran; not run on web-2 (quarantined), web-3 (unreachable)"
        );
        assert_eq!(duration(&Some("5m".into()), "--timeout").unwrap(), 300_000);
        assert!(duration(&Some("0s".into()), "--timeout").is_err());
        assert_eq!(duration(&None, "--timeout").unwrap(), 0);
    }
}
