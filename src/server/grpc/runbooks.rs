//! RunbookService: runbooks and their executions (docs/runbooks.md). Thin: unpack, call the
//! runbooks domain with the caller's principal, answer its JSON view.

use std::sync::Arc;

use serde::Serialize;
use tonic::{Request, Response, Status};

use super::principal;
use crate::proto::{self, RunbookDocument};
use crate::runbooks;
use crate::server::Context;
use crate::Error;

pub struct Runbooks {
    pub context: Arc<Context>,
}

fn document<T: Serialize>(value: &T) -> Result<Response<RunbookDocument>, Status> {
    let json = serde_json::to_string(value).map_err(Error::internal)?;
    Ok(Response::new(RunbookDocument { json }))
}

#[tonic::async_trait]
impl proto::runbook_service_server::RunbookService for Runbooks {
    async fn list(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        document(&runbooks::list(&self.context.domain, &principal)?)
    }

    async fn get(
        &self,
        request: Request<proto::RunbookName>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        document(&runbooks::get(
            &self.context.domain,
            &principal,
            &request.get_ref().name,
        )?)
    }

    async fn execute(
        &self,
        request: Request<proto::ExecuteRunbookRequest>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        let r = request.into_inner();
        let started = runbooks::execute(
            &self.context.domain,
            &principal,
            &r.name,
            r.parameters.into_iter().collect(),
            r.dry_run,
        )
        .await?;
        document(&started)
    }

    async fn list_executions(
        &self,
        request: Request<proto::ListExecutionsRequest>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        let r = request.into_inner();
        let list = runbooks::list_executions(
            &self.context.domain,
            &principal,
            &r.runbook,
            &r.status,
            r.limit as usize,
        )
        .await?;
        document(&list)
    }

    async fn status(
        &self,
        request: Request<proto::ExecutionId>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        let view =
            runbooks::status(&self.context.domain, &principal, &request.get_ref().id).await?;
        document(&view)
    }

    async fn audit(
        &self,
        request: Request<proto::ExecutionId>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        let rows = runbooks::audit(&self.context.domain, &principal, &request.get_ref().id).await?;
        document(&rows)
    }

    async fn cancel(
        &self,
        request: Request<proto::ExecutionId>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        let view =
            runbooks::cancel(&self.context.domain, &principal, &request.get_ref().id).await?;
        document(&view)
    }

    async fn approve(
        &self,
        request: Request<proto::ApproveStepRequest>,
    ) -> Result<Response<RunbookDocument>, Status> {
        let principal = principal(&request)?;
        let r = request.into_inner();
        let view = runbooks::approve(&self.context.domain, &principal, &r.id, &r.step).await?;
        document(&view)
    }
}
