//! ClusterService: snapshots. Backup streams a snapshot as it is written (`backup::take`);
//! Restore is offline only (`svc-cluster-backup restore`), so the RPC refuses with what to run.
//! Membership RPCs are not built yet (the generated defaults answer Unimplemented).

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::principal;
use crate::backup::take;
use crate::proto;
use crate::server::Context;

pub struct Cluster {
    pub context: Arc<Context>,
}

#[tonic::async_trait]
impl proto::cluster_service_server::ClusterService for Cluster {
    async fn backup(
        &self,
        request: Request<proto::Empty>,
    ) -> Result<Response<tonic::codegen::BoxStream<proto::SnapshotChunk>>, Status> {
        let caller = principal(&request)?;
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
        let stream = tokio_stream::wrappers::ReceiverStream::new(receiver).map(|item| {
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
