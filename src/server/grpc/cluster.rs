//! ClusterService: membership and leadership (`cluster::ops`), and snapshots. Backup streams a
//! snapshot as it is written (`backup::take`); Restore is offline only (`svc-cluster-backup
//! restore`), so the RPC refuses with what to run. Add is refused too, by design (members
//! join by themselves), and that refusal is audited (`cluster::ops::add`).

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::principal;
use crate::backup::take;
use crate::cluster::ops;
use crate::proto;
use crate::server::Context;

pub struct Cluster {
    pub context: Arc<Context>,
}

fn member(view: ops::MemberView) -> proto::Member {
    proto::Member {
        id: view.id,
        address: view.address,
        role: view.role,
        health: view.health,
        version: view.version,
        started_at: view.started_at,
        heartbeat_age_ms: view.heartbeat_age_ms,
        agents: view.agents,
    }
}

#[tonic::async_trait]
impl proto::cluster_service_server::ClusterService for Cluster {
    async fn status(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::ClusterStatus>, Status> {
        let caller = principal(&request)?;
        let status = ops::status(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::ClusterStatus {
            members: status.members.into_iter().map(member).collect(),
            leader: status.leader,
            quorum: status.quorum,
            health: status.health,
            term: status.term,
            postgres: status.postgres,
            nats: status.nats,
            clustered: status.clustered,
        }))
    }

    async fn members(
        &self,
        request: Request<proto::MemberRequest>,
    ) -> Result<Response<proto::MembersResponse>, Status> {
        let caller = principal(&request)?;
        let members = ops::members(&self.context.domain, &caller, &request.get_ref().id)?;
        Ok(Response::new(proto::MembersResponse {
            members: members.into_iter().map(member).collect(),
        }))
    }

    async fn leader(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::Member>, Status> {
        let caller = principal(&request)?;
        Ok(Response::new(member(ops::leader(
            &self.context.domain,
            &caller,
        )?)))
    }

    async fn add(
        &self,
        request: Request<proto::MemberRequest>,
    ) -> Result<Response<proto::Member>, Status> {
        let caller = principal(&request)?;
        ops::add(&self.context.domain, &caller, &request.get_ref().id).await?;
        Err(Status::internal("unreachable"))
    }

    async fn remove(
        &self,
        request: Request<proto::MemberRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = principal(&request)?;
        ops::remove(&self.context.domain, &caller, &request.get_ref().id).await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn rebalance(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = principal(&request)?;
        ops::rebalance(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn transfer_leader(
        &self,
        request: Request<proto::MemberRequest>,
    ) -> Result<Response<proto::Member>, Status> {
        let caller = principal(&request)?;
        let to = request.get_ref().id.clone();
        let view = ops::transfer_leader(&self.context.domain, &caller, &to).await?;
        Ok(Response::new(member(view)))
    }

    async fn backup(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<tonic::codegen::BoxStream<proto::SnapshotChunk>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let context = &self.context;
        let source = take::Source {
            store: context.domain.store.clone(),
            data_dir: context.data_dir.clone(),
            streams: context.streams.clone(),
            policy_dir: context.config.policy_dir.clone(),
            server_id: take::server_id(&context.config.bus.server_name),
        };
        let receiver = take::open_backup(&context.domain, &caller, source).await?;
        use tokio_stream::StreamExt;
        let relayed = super::relay(context, connection, "Backup", receiver);
        let stream = relayed.map(|item| {
            item.map(|data| proto::SnapshotChunk { data, force: false })
                .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn restore(
        &self,
        request: Request<Streaming<proto::SnapshotChunk>>,
    ) -> Result<Response<proto::Empty>, Status> {
        let caller = principal(&request)?;
        crate::backup::restore_online(&self.context.domain, &caller).await?;
        Ok(Response::new(proto::Empty {}))
    }
}
