//! PolicyService: the audit log and the policies (contract §9). Thin: unpack, call the audit
//! domain with the caller's principal, pack. CreatePolicy, UpdatePolicy and DeletePolicy are
//! refused by design (policies are files in `policy_dir`): UNIMPLEMENTED, audited as `denied`
//! (`audit::policy::refuse_change`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::principal;
use crate::audit::{self, Entry};
use crate::proto;
use crate::server::Context;

fn counts(pairs: Vec<(String, u64)>) -> Vec<proto::AuditCount> {
    pairs
        .into_iter()
        .map(|(key, count)| proto::AuditCount { key, count })
        .collect()
}

fn report_message(report: audit::Report) -> proto::AuditReportResponse {
    proto::AuditReportResponse {
        compliance_rate: report.compliance_rate,
        top_violations: counts(report.top_violations),
        trend: report
            .trend
            .into_iter()
            .map(|(day, total, violations)| proto::TrendDay {
                day,
                total,
                violations,
            })
            .collect(),
        total: report.total,
        violations: report.violations,
        refused: report.refused,
        since: report.since,
        until: report.until.unwrap_or_default(),
    }
}

fn optional(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

pub struct Policy {
    pub context: Arc<Context>,
}

impl Policy {
    /// Policies are files in policy_dir: a change over the API is refused, and audited.
    async fn refuse(
        &self,
        request: Request<proto::Policy>,
        change: audit::policy::Change,
    ) -> Status {
        let caller = match principal(&request) {
            Ok(caller) => caller,
            Err(status) => return status,
        };
        let id = request.into_inner().id;
        audit::policy::refuse_change(&self.context.domain, &caller, change, &id)
            .await
            .into()
    }
}

impl From<Entry> for proto::AuditEntry {
    fn from(entry: Entry) -> Self {
        proto::AuditEntry {
            id: entry.id,
            timestamp: entry.timestamp,
            user: entry.user,
            action: entry.action,
            resource_type: entry.resource_type,
            resource_id: entry.resource_id,
            outcome: entry.outcome,
            policy_id: entry.policy_id.unwrap_or_default(),
            severity: entry.severity,
            detail_json: entry.detail.to_string(),
            prev_hash: entry.prev_hash,
            hash: entry.hash,
        }
    }
}

fn query_from(request: proto::AuditLogRequest) -> audit::Query {
    let page = request.page.unwrap_or_default();
    audit::Query {
        since: Some(request.since),
        until: Some(request.until),
        user: Some(request.user),
        action: Some(request.action),
        resource_type: Some(request.resource_type),
        policy_id: Some(request.policy_id),
        min_severity: Some(request.min_severity),
        outcome: Some(request.outcome),
        limit: Some(page.limit),
        cursor: Some(page.cursor),
        attempts: request.attempts,
    }
}

fn page_response(page: audit::Page) -> proto::AuditLogResponse {
    proto::AuditLogResponse {
        items: page.items.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor.unwrap_or_default(),
    }
}

fn policy_message(view: audit::policy::PolicyView) -> proto::Policy {
    proto::Policy {
        id: view.id,
        severity: view.severity,
        source_yaml: view.source_yaml,
        policy_set: view.policy_set,
    }
}

#[tonic::async_trait]
impl proto::policy_service_server::PolicyService for Policy {
    async fn audit_stats(
        &self,
        request: Request<proto::AuditWindow>,
    ) -> Result<Response<proto::AuditStatsResponse>, Status> {
        let caller = principal(&request)?;
        let window = request.into_inner();
        let stats = audit::stats(
            self.context.domain.store.as_ref(),
            &caller,
            &optional(window.since),
            &optional(window.until),
        )
        .await?;
        Ok(Response::new(proto::AuditStatsResponse {
            total: stats.total,
            by_outcome: counts(stats.by_outcome),
            by_severity: counts(stats.by_severity),
            by_action: counts(stats.by_action),
            by_user: counts(stats.by_user),
        }))
    }

    async fn audit_report(
        &self,
        request: Request<proto::AuditWindow>,
    ) -> Result<Response<proto::AuditReportResponse>, Status> {
        let caller = principal(&request)?;
        let window = request.into_inner();
        let report = audit::report(
            self.context.domain.store.as_ref(),
            &caller,
            &optional(window.since),
            &optional(window.until),
        )
        .await?;
        Ok(Response::new(report_message(report)))
    }

    async fn compliance(
        &self,
        request: Request<proto::AuditWindow>,
    ) -> Result<Response<proto::AuditReportResponse>, Status> {
        self.audit_report(request).await
    }

    async fn audit_export(
        &self,
        request: Request<proto::AuditExportRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<proto::AuditExportChunk>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let wanted = request.into_inner();
        let format: audit::ExportFormat = wanted.format.parse()?;
        let receiver = audit::open_export(
            &self.context.domain,
            &caller,
            format,
            optional(wanted.since),
            optional(wanted.until),
        )?;
        use tokio_stream::StreamExt;
        let relayed = super::relay(&self.context, connection, "AuditExport", receiver);
        let stream = relayed.map(|item| {
            item.map(|data| proto::AuditExportChunk { data })
                .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }
    async fn audit_log(
        &self,
        request: Request<proto::AuditLogRequest>,
    ) -> Result<Response<proto::AuditLogResponse>, Status> {
        let caller = principal(&request)?;
        let query = query_from(request.into_inner());
        let page = audit::log(self.context.domain.store.as_ref(), &caller, &query).await?;
        Ok(Response::new(page_response(page)))
    }

    async fn violations(
        &self,
        request: Request<proto::AuditLogRequest>,
    ) -> Result<Response<proto::AuditLogResponse>, Status> {
        let caller = principal(&request)?;
        let mut query = query_from(request.into_inner());
        query.outcome = None;
        let page = audit::violations(self.context.domain.store.as_ref(), &caller, &query).await?;
        Ok(Response::new(page_response(page)))
    }

    async fn audit_verify(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::AuditVerifyResponse>, Status> {
        let caller = principal(&request)?;
        let result = audit::verify(self.context.domain.store.as_ref(), &caller).await?;
        Ok(Response::new(proto::AuditVerifyResponse {
            ok: result.ok,
            rows: result.rows,
            first_bad_id: result.first_bad.unwrap_or_default(),
            detail: result.detail.unwrap_or_default(),
        }))
    }

    async fn list_policies(
        &self,
        request: Request<proto::ListPoliciesRequest>,
    ) -> Result<Response<proto::ListPoliciesResponse>, Status> {
        let caller = principal(&request)?;
        let sets = request.into_inner().policy_sets;
        let listed = audit::policy::list(&self.context.domain, &caller, sets)?;
        Ok(Response::new(proto::ListPoliciesResponse {
            policies: listed.into_iter().map(policy_message).collect(),
        }))
    }

    async fn get_policy(
        &self,
        request: Request<proto::GetPolicyRequest>,
    ) -> Result<Response<proto::Policy>, Status> {
        let caller = principal(&request)?;
        let wanted = request.into_inner();
        let policy =
            audit::policy::get(&self.context.domain, &caller, &wanted.id, wanted.policy_set)?;
        Ok(Response::new(policy_message(policy)))
    }

    async fn create_policy(
        &self,
        request: Request<proto::Policy>,
    ) -> Result<Response<proto::Policy>, Status> {
        Err(self.refuse(request, audit::policy::Change::Create).await)
    }

    async fn update_policy(
        &self,
        request: Request<proto::Policy>,
    ) -> Result<Response<proto::Policy>, Status> {
        Err(self.refuse(request, audit::policy::Change::Update).await)
    }

    async fn delete_policy(
        &self,
        request: Request<proto::GetPolicyRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = principal(&request)?;
        let id = request.into_inner().id;
        let change = audit::policy::Change::Delete;
        Err(
            audit::policy::refuse_change(&self.context.domain, &caller, change, &id)
                .await
                .into(),
        )
    }
}
