//! The server's blueprint catalogue: install, update, remove, list, show; apply, applied and
//! rollback through the fleet's state path (`fleet::state`, the same as `svcctl state
//! apply`: streamed per-agent results, state_apply_* events, the `state.apply` audit row).
//!
//! Every change is audited here as well (`blueprint.install|update|remove|apply|rollback`),
//! with secret parameter values redacted. Every apply and rollback is recorded with the
//! rendered plan and each agent's outcome; `blueprint_agents` says what is applied where.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;
use tokio::sync::mpsc;

use super::bundle;
use super::{Blueprint, Manifest};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::fleet::state::{self as fleet_state, AgentStateResult, Operation, StateRequest};
use crate::fleet::JobStatus;
use crate::secrets::at_rest;
use crate::secrets::crypto::AeadKey;
use crate::state::{DirectoryResource, FileResource, Plan, Presence, Resource, SymlinkResource};
use crate::store::{BlueprintAgentRow, BlueprintApplyRow, BlueprintRow, PlanTable};
use crate::version::{self, Range, Version};
use crate::{clock, Error, Result};

/// An installed blueprint version as operators see it.
#[derive(Clone, Debug, Serialize)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub description: String,
    pub sha256: String,
    pub manifest: Manifest,
    pub installed_by: String,
    pub installed_at: String,
    /// Every installed version of this name, oldest first.
    pub versions: Vec<String>,
}

fn installed(row: &BlueprintRow, versions: Vec<String>) -> Result<Installed> {
    let manifest: Manifest = serde_json::from_str(&row.manifest)
        .map_err(|e| Error::Internal(format!("stored manifest of {}: {e}", row.name)))?;
    Ok(Installed {
        name: row.name.clone(),
        version: row.version.clone(),
        description: row.description.clone(),
        sha256: row.sha256.clone(),
        manifest,
        installed_by: row.installed_by.clone(),
        installed_at: row.installed_at.clone(),
        versions,
    })
}

/// Versions of `name`, oldest first (by version number).
async fn versions_of(domain: &Domain, name: &str) -> Result<Vec<BlueprintRow>> {
    let mut rows = domain
        .store
        .blueprints()
        .list_blueprints(Some(name))
        .await?;
    crate::sort::sort_by(&mut rows, |a, b| version::compare(&a.version, &b.version));
    Ok(rows)
}

/// `install` (the name must be new) or `update` (the name must be installed and the version
/// newer than every installed one). Older versions stay, for `rollback --to`.
pub async fn install(
    domain: &Domain,
    principal: &Principal,
    bundle_bytes: &[u8],
    is_update: bool,
) -> Result<Installed> {
    let action = if is_update {
        "blueprint.update"
    } else {
        "blueprint.install"
    };
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new(action, "blueprint", ""),
            install_checked(domain, principal, bundle_bytes, is_update),
        )
        .await;
    let (id, detail) = match &result {
        Ok(done) => (
            format!("{}@{}", done.name, done.version),
            serde_json::json!({"sha256": done.sha256}),
        ),
        Err(_) => (
            String::new(),
            serde_json::json!({"sha256": bundle::sha256_hex(bundle_bytes)}),
        ),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new(action, "blueprint", id).detail(detail),
            &result,
        )
        .await;
    result
}

async fn install_checked(
    domain: &Domain,
    principal: &Principal,
    bundle_bytes: &[u8],
    is_update: bool,
) -> Result<Installed> {
    principal.require(Role::Operator)?;
    let blueprint = bundle::read(bundle_bytes)?;
    // Every template must parse; rendering and compiling wait for the values of apply.
    blueprint.check_templates()?;
    let manifest = &blueprint.manifest;
    let existing = versions_of(domain, &manifest.name).await?;
    for requirement in &manifest.requires {
        let range = Range::parse(&requirement.version).map_err(Error::Invalid)?;
        let available = versions_of(domain, &requirement.name).await?;
        let met = available.iter().any(|row| {
            Version::parse(&row.version)
                .map(|v| range.matches(&v))
                .unwrap_or(false)
        });
        if !met {
            return Err(Error::Conflict(format!(
                "requires {} {}: not installed (install it first)",
                requirement.name, requirement.version
            )));
        }
    }
    let row = BlueprintRow {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        description: manifest.description.clone(),
        sha256: bundle::sha256_hex(bundle_bytes),
        manifest: serde_json::to_string(manifest)
            .map_err(|e| Error::Internal(format!("manifest: {e}")))?,
        bundle: base64::engine::general_purpose::STANDARD.encode(bundle_bytes),
        installed_by: principal.name.clone(),
        installed_at: clock::now_rfc3339(),
    };
    // The store checks install-vs-update and the version order in its write transaction.
    domain
        .store
        .blueprints()
        .insert_blueprint(&row, is_update)
        .await?;
    let mut versions: Vec<String> = existing.into_iter().map(|r| r.version).collect();
    versions.push(row.version.clone());
    installed(&row, versions)
}

/// Deletes every version of `name`; refused while it is applied somewhere unless `force`.
pub async fn remove(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    force: bool,
) -> Result<u64> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("blueprint.remove", "blueprint", name),
            remove_checked(domain, principal, name, force),
        )
        .await;
    domain
        .auditor
        .record(
            principal,
            Action::new("blueprint.remove", "blueprint", name)
                .detail(serde_json::json!({"force": force})),
            &result,
        )
        .await;
    result
}

async fn remove_checked(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    force: bool,
) -> Result<u64> {
    principal.require(Role::Operator)?;
    if versions_of(domain, name).await?.is_empty() {
        return Err(Error::NotFound(format!(
            "blueprint '{name}' is not installed"
        )));
    }
    let applied: Vec<String> = domain
        .store
        .blueprints()
        .list_blueprint_agents()
        .await?
        .into_iter()
        .filter(|row| row.name == name)
        .map(|row| row.agent_id)
        .collect();
    if !applied.is_empty() && !force {
        return Err(Error::FailedPrecondition(format!(
            "blueprint '{name}' is applied on {}; remove it with --force to forget that",
            applied.join(", ")
        )));
    }
    domain.store.blueprints().delete_blueprint(name).await
}

/// The latest version of every installed blueprint.
pub async fn list(domain: &Domain, principal: &Principal) -> Result<Vec<Installed>> {
    principal.require(Role::Readonly)?;
    let rows = domain.store.blueprints().list_blueprints(None).await?;
    let mut by_name: BTreeMap<String, Vec<BlueprintRow>> = BTreeMap::new();
    for row in rows {
        by_name.entry(row.name.clone()).or_default().push(row);
    }
    let mut out = Vec::with_capacity(by_name.len());
    for (_, mut rows) in by_name {
        crate::sort::sort_by(&mut rows, |a, b| version::compare(&a.version, &b.version));
        let versions = rows.iter().map(|r| r.version.clone()).collect();
        if let Some(latest) = rows.last() {
            out.push(installed(latest, versions)?);
        }
    }
    Ok(out)
}

/// One installed version (the latest when `version` is empty).
pub async fn get(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    version: &str,
) -> Result<Installed> {
    principal.require(Role::Readonly)?;
    let (row, versions) = find(domain, name, version).await?;
    installed(&row, versions)
}

async fn find(domain: &Domain, name: &str, version: &str) -> Result<(BlueprintRow, Vec<String>)> {
    let rows = versions_of(domain, name).await?;
    let versions: Vec<String> = rows.iter().map(|r| r.version.clone()).collect();
    let row = if version.is_empty() {
        rows.last().cloned()
    } else {
        rows.iter().find(|r| r.version == version).cloned()
    };
    match row {
        Some(row) => Ok((row, versions)),
        None if rows.is_empty() => Err(Error::NotFound(format!(
            "blueprint '{name}' is not installed"
        ))),
        None => Err(Error::NotFound(format!(
            "blueprint '{name}' has no version {version} (installed: {})",
            versions.join(", ")
        ))),
    }
}

fn load(row: &BlueprintRow) -> Result<Blueprint> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&row.bundle)
        .map_err(|e| Error::Internal(format!("stored bundle of {}: {e}", row.name)))?;
    bundle::read(&bytes)
}

#[derive(Clone, Debug, Default)]
pub struct ApplyRequest {
    pub name: String,
    /// Empty: the latest installed version.
    pub version: String,
    /// Empty: the blueprint's `targets`, else every agent.
    pub target: String,
    /// `--set k=v`, as given.
    pub parameters: BTreeMap<String, String>,
    pub is_dry_run: bool,
    pub timeout: Option<std::time::Duration>,
}

#[derive(Clone, Debug, Default)]
pub struct RollbackRequest {
    pub name: String,
    pub target: String,
    /// Empty: the version recorded before the current one.
    pub to_version: String,
    pub timeout: Option<std::time::Duration>,
}

/// A prepared apply or rollback: the state job and what to record once it has run.
pub struct Run {
    pub job_id: String,
    job: fleet_state::Job,
    /// None for a dry run (nothing is recorded).
    record: Option<BlueprintApplyRow>,
}

/// Renders `name@version` with the parameters and prepares the state job (apply, or check
/// for a dry run).
pub async fn prepare_apply(
    domain: &Domain,
    principal: &Principal,
    request: ApplyRequest,
) -> Result<Run> {
    // Not gated here: the apply goes through `fleet::state::prepare`, whose audit gate refuses
    // an apply (and lets a dry run, a check, through) while the audit log cannot be written.
    let prepared = prepare_apply_checked(domain, principal, &request).await;
    if !request.is_dry_run {
        let detail = match &prepared {
            Ok(run) => {
                let record = run.record.as_ref().expect("an apply has a record");
                serde_json::json!({
                    "version": record.version, "target": record.target,
                    "parameters": serde_json::from_str::<serde_json::Value>(&record.parameters)
                        .unwrap_or_default(),
                    "job_id": run.job_id,
                })
            }
            Err(_) => serde_json::json!({"version": request.version, "target": request.target}),
        };
        domain
            .auditor
            .record(
                principal,
                Action::new("blueprint.apply", "blueprint", &request.name).detail(detail),
                &prepared,
            )
            .await;
    }
    prepared
}

async fn prepare_apply_checked(
    domain: &Domain,
    principal: &Principal,
    request: &ApplyRequest,
) -> Result<Run> {
    principal.require(Role::Operator)?;
    let (row, _) = find(domain, &request.name, &request.version).await?;
    let blueprint = load(&row)?;
    let values = blueprint.manifest.resolve(&request.parameters)?;
    let (plan, _) = blueprint.render(&values)?;
    let target = if request.target.is_empty() {
        blueprint.manifest.targets.clone().unwrap_or_default()
    } else {
        request.target.clone()
    };
    let plan_text =
        serde_json::to_string(&plan).map_err(|e| Error::Internal(format!("plan: {e}")))?;
    let at_rest = at_rest::key(domain).await?;
    let operation = if request.is_dry_run {
        Operation::Check
    } else {
        Operation::Apply
    };
    let job = fleet_state::prepare(
        domain,
        principal,
        operation,
        StateRequest {
            target: target.clone(),
            plan: plan_text.clone(),
            timeout: request.timeout,
            concurrency: 0,
            diff: false,
        },
    )
    .await?;
    let record = (!request.is_dry_run).then(|| BlueprintApplyRow {
        id: job.job_id.clone(),
        name: row.name.clone(),
        version: row.version.clone(),
        kind: "apply".into(),
        target,
        parameters: serde_json::to_string(&blueprint.manifest.redact(&values)).unwrap_or_default(),
        plan: sealed_plan(at_rest, &job.job_id, &plan_text),
        results: String::new(),
        applied_by: principal.name.clone(),
        applied_at: clock::now_rfc3339(),
    });
    Ok(Run {
        job_id: job.job_id.clone(),
        job,
        record,
    })
}

/// Re-applies the plan of an earlier recorded version of `name` on the targets, with the
/// files, symlinks and directories the current version added (and the old one does not
/// have) made absent.
pub async fn prepare_rollback(
    domain: &Domain,
    principal: &Principal,
    request: RollbackRequest,
) -> Result<Run> {
    let prepared = domain
        .auditor
        .gate(
            principal,
            Action::new("blueprint.rollback", "blueprint", &request.name),
            prepare_rollback_checked(domain, principal, &request),
        )
        .await;
    let detail = match &prepared {
        Ok(run) => {
            let record = run.record.as_ref().expect("a rollback has a record");
            serde_json::json!({"to": record.version, "target": record.target, "job_id": run.job_id})
        }
        Err(_) => serde_json::json!({"to": request.to_version, "target": request.target}),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("blueprint.rollback", "blueprint", &request.name).detail(detail),
            &prepared,
        )
        .await;
    prepared
}

async fn prepare_rollback_checked(
    domain: &Domain,
    principal: &Principal,
    request: &RollbackRequest,
) -> Result<Run> {
    principal.require(Role::Operator)?;
    if request.name.is_empty() {
        return Err(Error::Invalid("a blueprint name is needed".into()));
    }
    let records = domain
        .store
        .blueprints()
        .list_blueprint_applies(&request.name)
        .await?;
    let Some(current) = records.first() else {
        return Err(Error::NotFound(format!(
            "blueprint '{}' has never been applied",
            request.name
        )));
    };
    let previous = if request.to_version.is_empty() {
        records.iter().find(|r| r.version != current.version)
    } else {
        records.iter().find(|r| r.version == request.to_version)
    };
    let Some(previous) = previous else {
        return Err(Error::NotFound(if request.to_version.is_empty() {
            format!(
                "blueprint '{}' has no recorded apply of a version other than {}",
                request.name, current.version
            )
        } else {
            format!(
                "blueprint '{}' {} was never applied",
                request.name, request.to_version
            )
        }));
    };
    let at_rest = at_rest::key(domain).await?;
    let plan = rollback_plan(
        &recorded_plan(at_rest, previous)?,
        &recorded_plan(at_rest, current)?,
    );
    let plan_text =
        serde_json::to_string(&plan).map_err(|e| Error::Internal(format!("plan: {e}")))?;
    let target = if request.target.is_empty() {
        current.target.clone()
    } else {
        request.target.clone()
    };
    let job = fleet_state::prepare(
        domain,
        principal,
        Operation::Apply,
        StateRequest {
            target: target.clone(),
            plan: plan_text.clone(),
            timeout: request.timeout,
            concurrency: 0,
            diff: false,
        },
    )
    .await?;
    Ok(Run {
        job_id: job.job_id.clone(),
        record: Some(BlueprintApplyRow {
            id: job.job_id.clone(),
            name: request.name.clone(),
            version: previous.version.clone(),
            kind: "rollback".into(),
            target,
            parameters: previous.parameters.clone(),
            plan: sealed_plan(at_rest, &job.job_id, &plan_text),
            results: String::new(),
            applied_by: principal.name.clone(),
            applied_at: clock::now_rfc3339(),
        }),
        job,
    })
}

/// An apply record's plan as stored: sealed, since it holds what secret parameters rendered
/// into (`secrets::at_rest`).
fn sealed_plan(at_rest: &AeadKey, apply_id: &str, plan_text: &str) -> String {
    let context = at_rest::plan_context(PlanTable::BlueprintApplies, apply_id);
    at_rest::seal(at_rest, &context, plan_text)
}

/// The plan an apply record holds.
fn recorded_plan(at_rest: &AeadKey, record: &BlueprintApplyRow) -> Result<Plan> {
    let context = at_rest::plan_context(PlanTable::BlueprintApplies, &record.id);
    serde_json::from_str(&at_rest::open(at_rest, &context, &record.plan)?)
        .map_err(|e| Error::Internal(format!("recorded plan of {}: {e}", record.id)))
}

/// `previous`, then `state: absent` for every file and symlink, and then (deepest first)
/// every directory, that `current` manages and `previous` does not.
fn rollback_plan(previous: &Plan, current: &Plan) -> Plan {
    let managed: std::collections::HashSet<&str> =
        previous.resources.iter().filter_map(path_of).collect();
    let mut plan = previous.clone();
    let mut directories = Vec::new();
    for resource in &current.resources {
        let Some(path) = path_of(resource) else {
            continue;
        };
        if managed.contains(path) || is_absent(resource) {
            continue;
        }
        match resource {
            Resource::File(_) => plan.push(Resource::File(FileResource {
                path: path.to_string(),
                state: Some(Presence::Absent),
                ..FileResource::default()
            })),
            Resource::Symlink(s) => plan.push(Resource::Symlink(SymlinkResource {
                path: path.to_string(),
                target: s.target.clone(),
                state: Some(Presence::Absent),
            })),
            Resource::Directory(_) => directories.push(path.to_string()),
            _ => {}
        }
    }
    crate::sort::sort_by_key(&mut directories, |p| {
        std::cmp::Reverse(p.matches('/').count())
    });
    for path in directories {
        plan.push(Resource::Directory(DirectoryResource {
            path,
            state: Some(Presence::Absent),
            ..DirectoryResource::default()
        }));
    }
    plan
}

fn path_of(resource: &Resource) -> Option<&str> {
    match resource {
        Resource::File(f) => Some(&f.path),
        Resource::Directory(d) => Some(&d.path),
        Resource::Symlink(s) => Some(&s.path),
        _ => None,
    }
}

fn is_absent(resource: &Resource) -> bool {
    matches!(
        resource,
        Resource::File(FileResource {
            state: Some(Presence::Absent),
            ..
        }) | Resource::Directory(DirectoryResource {
            state: Some(Presence::Absent),
            ..
        }) | Resource::Symlink(SymlinkResource {
            state: Some(Presence::Absent),
            ..
        })
    )
}

impl Run {
    /// Runs the state job, forwarding each agent's result to `out` (a client that goes away
    /// does not stop the job or its record), then records the apply.
    pub async fn run(self, domain: &Domain, out: mpsc::Sender<AgentStateResult>) {
        let (sender, mut receiver) = mpsc::channel(64);
        let job = self.job.run(domain, sender);
        let collect = async {
            let mut results = Vec::new();
            let mut is_client_gone = false;
            while let Some(result) = receiver.recv().await {
                results.push(result.clone());
                if !is_client_gone && out.send(result).await.is_err() {
                    is_client_gone = true;
                }
            }
            results
        };
        let ((), results) = tokio::join!(job, collect);
        let Some(mut record) = self.record else {
            return;
        };
        let summary: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "agent_id": r.agent_id, "status": r.status,
                    "changed": r.outcomes.iter().filter(|o| o.changed).count(),
                    "error": r.error,
                })
            })
            .collect();
        record.results = serde_json::Value::Array(summary).to_string();
        let at = clock::now_rfc3339();
        let agents: Vec<BlueprintAgentRow> = results
            .iter()
            .filter(|r| {
                matches!(
                    r.status,
                    JobStatus::Ok | JobStatus::Changed | JobStatus::Failed | JobStatus::TimedOut
                )
            })
            .map(|r| BlueprintAgentRow {
                name: record.name.clone(),
                agent_id: r.agent_id.clone(),
                version: record.version.clone(),
                apply_id: record.id.clone(),
                status: r.status.to_string(),
                applied_at: at.clone(),
            })
            .collect();
        if let Err(e) = domain
            .store
            .blueprints()
            .record_blueprint_apply(&record, &agents)
            .await
        {
            tracing::error!(apply_id = %record.id, error = %e, "blueprint apply not recorded");
        }
    }
}

/// What is applied where: one row per blueprint and agent, for the agents `target` selects
/// (every agent when empty).
pub async fn applied(
    domain: &Domain,
    principal: &Principal,
    target: &str,
) -> Result<Vec<BlueprintAgentRow>> {
    principal.require(Role::Readonly)?;
    let rows = domain.store.blueprints().list_blueprint_agents().await?;
    if target.trim().is_empty() {
        return Ok(rows);
    }
    let ids: std::collections::HashSet<String> = crate::fleet::matching_ids(domain, target)
        .await?
        .into_iter()
        .collect();
    Ok(rows
        .into_iter()
        .filter(|r| ids.contains(&r.agent_id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> Resource {
        Resource::File(FileResource {
            path: path.into(),
            content: Some("x".into()),
            ..FileResource::default()
        })
    }

    #[test]
    fn rollback_removes_what_the_newer_version_added() {
        let old = Plan {
            resources: vec![file("/a")],
            ..Plan::default()
        };
        let new = Plan {
            resources: vec![
                Resource::Directory(DirectoryResource {
                    path: "/d".into(),
                    ..DirectoryResource::default()
                }),
                file("/a"),
                file("/d/b"),
            ],
            ..Plan::default()
        };
        let plan = rollback_plan(&old, &new);
        let labels: Vec<String> = plan
            .resources
            .iter()
            .map(|r| format!("{} {}", r.label(), is_absent(r)))
            .collect();
        assert_eq!(
            labels,
            ["file:/a false", "file:/d/b true", "directory:/d true"]
        );
    }
}
