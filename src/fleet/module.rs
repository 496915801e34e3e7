//! `svc-module run MODULE FUNCTION --target SEL`: a module sent to the targeted agents, run
//! there against each host's facts, and the resources it returns checked or applied like a
//! state (`state.rs` runs the job: events, results, the last applied state for drift).
//!
//! The server opens the module only to refuse early what every agent would refuse (a ZIP
//! that is not a module, a function it does not export, arguments its manifest does not
//! take); the author's signature is checked by each agent against its own trusted keys
//! (`crate::modules::bundle`), since that is whose trust the run needs.

use std::time::Duration;

use super::protocol::Work;
use super::state::{Job, Operation, DEFAULT_TIMEOUT};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::config::TrustPolicy;
use crate::domain::Domain;
use crate::modules::bundle::{self, Opened, Packed};
use crate::modules::sha256_hex;
use crate::{ids, Error, Result};

/// Room left in a bus message for the command's other fields and headers, at most (half a
/// smaller `max_payload`, as the file service leaves: `files::body_capacity`).
const COMMAND_OVERHEAD: usize = crate::config::FILES_HEADER_ROOM as usize;

pub struct ModuleRequest {
    pub target: String,
    pub zip: Vec<u8>,
    pub signature: Option<String>,
    /// ZIP and signature of each dependency.
    pub dependencies: Vec<(Vec<u8>, Option<String>)>,
    pub function: String,
    pub args: Vec<String>,
    /// A dry run: report what the resources would change (else apply them).
    pub check: bool,
    pub timeout: Option<Duration>,
    pub concurrency: u32,
    /// 0: the sandbox's defaults.
    pub max_steps: u64,
    pub max_memory: u64,
}

impl ModuleRequest {
    fn packed(&self) -> (Packed<'_>, Vec<Packed<'_>>) {
        (
            Packed::new(&self.zip, self.signature.as_deref()),
            self.dependencies
                .iter()
                .map(|(zip, signature)| Packed::new(zip, signature.as_deref()))
                .collect(),
        )
    }
}

/// Checks the request and picks the agents; an apply is audited (`module.run`).
pub async fn prepare(
    domain: &Domain,
    principal: &Principal,
    request: ModuleRequest,
) -> Result<Job> {
    let job_id = ids::ulid();
    let operation = if request.check {
        Operation::Check
    } else {
        Operation::Apply
    };
    let (root, dependencies) = request.packed();
    // What every agent would refuse, found once here (after the role check, below). No
    // signature policy: that is the agents' (an empty policy checks nothing).
    let opened = bundle::open_packed(root, &dependencies, &TrustPolicy::default());
    let module_id = opened.as_ref().ok().map(|o| o.module.id());
    let prepared = prepare_checked(domain, principal, &request, operation, opened, &job_id);
    let result = match operation {
        Operation::Apply => {
            domain
                .auditor
                .gate(
                    principal,
                    Action::new("module.run", "job", &job_id),
                    prepared,
                )
                .await
        }
        _ => prepared.await,
    };
    if operation == Operation::Apply {
        let mut detail = serde_json::json!({
            "target": request.target, "sha256": sha256_hex(&request.zip),
            "function": request.function,
            "signed": request.signature.as_deref().is_some_and(|s| !s.trim().is_empty()),
        });
        if let Some(module_id) = module_id {
            detail["module"] = serde_json::json!(module_id);
        }
        if let Ok(job) = &result {
            detail["agents"] = serde_json::json!(job.agents());
        }
        domain
            .auditor
            .record(
                principal,
                Action::new("module.run", "job", &job_id).detail(detail),
                &result,
            )
            .await;
    }
    result
}

async fn prepare_checked(
    domain: &Domain,
    principal: &Principal,
    request: &ModuleRequest,
    operation: Operation,
    opened: Result<Opened>,
    job_id: &str,
) -> Result<Job> {
    principal.require(Role::Operator)?;
    let opened = opened?;
    bundle::arguments(&opened.module, &request.function, &request.args)?;
    let timeout = match request.timeout {
        None => DEFAULT_TIMEOUT,
        some => super::exec::check_timeout(some)?,
    };
    let (root, dependencies) = request.packed();
    let work = Work::Module {
        mode: operation.mode(),
        module: bundle::pack(root, &dependencies),
        function: request.function.clone(),
        args: request.args.clone(),
        max_steps: request.max_steps,
        max_memory: request.max_memory,
    };
    if let Some(max) = domain.fleet.max_payload() {
        let size = serde_json::to_vec(&work).map_err(Error::internal)?.len()
            + COMMAND_OVERHEAD.min(max / 2);
        if size > max {
            return Err(Error::TooLarge(format!(
                "the module and its dependencies make a {size}-byte command; the bus carries at most {max} bytes per message"
            )));
        }
    }
    let targets = super::targets(domain, &request.target).await?;
    let (mut job, reachable) = Job::new(
        job_id,
        operation,
        timeout,
        targets,
        request.concurrency,
        principal,
    );
    for agent_id in reachable {
        job.add(agent_id, work.clone());
    }
    let kind = match operation {
        Operation::Check => "module.check",
        _ => "module.apply",
    };
    let description = format!("{} {}", opened.module.id(), request.function);
    job.record(domain, kind, &request.target, description)
        .await?;
    Ok(job)
}
