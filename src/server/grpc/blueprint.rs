//! BlueprintService: the blueprint catalogue and applying blueprints (docs/blueprints.md).
//! Thin: unpack, call `blueprint::catalogue` with the caller's principal, pack. Apply and
//! rollback run in a task of their own that feeds the response stream, as state jobs do.

use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::fleet::{state_result, stream_of, timeout};
use super::principal;
use crate::blueprint::catalogue::{self, ApplyRequest, Installed, RollbackRequest, Run};
use crate::proto;
use crate::server::Context;

pub struct Blueprints {
    pub context: Arc<Context>,
}

impl From<Installed> for proto::BlueprintInfo {
    fn from(installed: Installed) -> Self {
        proto::BlueprintInfo {
            name: installed.name,
            version: installed.version,
            description: installed.description,
            sha256: installed.sha256,
            manifest_json: serde_json::to_string(&installed.manifest).unwrap_or_default(),
            installed_by: installed.installed_by,
            installed_at: installed.installed_at,
            versions: installed.versions,
        }
    }
}

impl Blueprints {
    fn stream(
        &self,
        run: Run,
        connection: Option<crate::server::tls::Connection>,
        method: &'static str,
    ) -> Response<BoxStream<proto::StateResult>> {
        let job_id = run.job_id.clone();
        let (sender, receiver) = mpsc::channel(64);
        let context = self.context.clone();
        tokio::spawn(async move { run.run(&context.domain, sender).await });
        let relayed = super::relay(&self.context, connection, method, receiver);
        Response::new(stream_of(relayed, move |result| {
            state_result(&job_id, result)
        }))
    }
}

#[tonic::async_trait]
impl proto::blueprint_service_server::BlueprintService for Blueprints {
    async fn install(
        &self,
        request: Request<proto::InstallBlueprintRequest>,
    ) -> Result<Response<proto::BlueprintInfo>, Status> {
        let caller = principal(&request)?;
        let installed = catalogue::install(
            &self.context.domain,
            &caller,
            &request.get_ref().bundle,
            false,
        )
        .await?;
        Ok(Response::new(installed.into()))
    }

    async fn update(
        &self,
        request: Request<proto::InstallBlueprintRequest>,
    ) -> Result<Response<proto::BlueprintInfo>, Status> {
        let caller = principal(&request)?;
        let installed = catalogue::install(
            &self.context.domain,
            &caller,
            &request.get_ref().bundle,
            true,
        )
        .await?;
        Ok(Response::new(installed.into()))
    }

    async fn remove(
        &self,
        request: Request<proto::RemoveBlueprintRequest>,
    ) -> Result<Response<proto::RemoveBlueprintResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let removed =
            catalogue::remove(&self.context.domain, &caller, &request.name, request.force).await?;
        Ok(Response::new(proto::RemoveBlueprintResponse {
            versions_removed: removed,
        }))
    }

    async fn list(
        &self,
        request: Request<proto::ListBlueprintsRequest>,
    ) -> Result<Response<proto::ListBlueprintsResponse>, Status> {
        let caller = principal(&request)?;
        let listed = catalogue::list(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::ListBlueprintsResponse {
            blueprints: listed.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::GetBlueprintRequest>,
    ) -> Result<Response<proto::BlueprintInfo>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let installed = catalogue::get(
            &self.context.domain,
            &caller,
            &request.name,
            &request.version,
        )
        .await?;
        Ok(Response::new(installed.into()))
    }

    async fn apply(
        &self,
        request: Request<proto::ApplyBlueprintRequest>,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let request = request.into_inner();
        let run = catalogue::prepare_apply(
            &self.context.domain,
            &caller,
            ApplyRequest {
                name: request.name,
                version: request.version,
                target: request.target,
                parameters: request.parameters.into_iter().collect(),
                is_dry_run: request.dry_run,
                timeout: timeout(request.timeout_ms),
            },
        )
        .await?;
        Ok(self.stream(run, connection, "Apply"))
    }

    async fn applied(
        &self,
        request: Request<proto::AppliedRequest>,
    ) -> Result<Response<proto::AppliedResponse>, Status> {
        let caller = principal(&request)?;
        let rows =
            catalogue::applied(&self.context.domain, &caller, &request.get_ref().target).await?;
        Ok(Response::new(proto::AppliedResponse {
            applied: rows
                .into_iter()
                .map(|row| proto::AppliedBlueprint {
                    name: row.name,
                    agent_id: row.agent_id,
                    version: row.version,
                    apply_id: row.apply_id,
                    status: row.status,
                    applied_at: row.applied_at,
                })
                .collect(),
        }))
    }

    async fn rollback(
        &self,
        request: Request<proto::RollbackBlueprintRequest>,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let request = request.into_inner();
        let run = catalogue::prepare_rollback(
            &self.context.domain,
            &caller,
            RollbackRequest {
                name: request.name,
                target: request.target,
                to_version: request.to_version,
                timeout: timeout(request.timeout_ms),
            },
        )
        .await?;
        Ok(self.stream(run, connection, "Rollback"))
    }
}
