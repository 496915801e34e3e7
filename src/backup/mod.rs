//! Snapshots and backups (issue 13): the snapshot file format (`snapshot`), taking and
//! restoring one, and where snapshot files go when they leave the host (`s3`).

pub mod local;
pub mod s3;
pub mod snapshot;
pub mod take;

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::{Error, Result};

/// `ClusterService/Restore`: a restore replaces the store and the streams under the server,
/// so it runs offline (`svc-cluster-backup restore`), never inside a running server. Admin
/// only; the refusal is audited as `cluster.restore`.
pub async fn restore_online(domain: &Domain, principal: &Principal) -> Result<()> {
    let result = principal.require(Role::Admin).and_then(|()| {
        Err(Error::FailedPrecondition(
            "restore offline with svc-cluster-backup restore (it stops the server, restores \
             the data dir and starts the server again)"
                .into(),
        ))
    });
    domain
        .auditor
        .record(
            principal,
            Action::new("cluster.restore", "cluster", "online"),
            &result,
        )
        .await;
    result
}
