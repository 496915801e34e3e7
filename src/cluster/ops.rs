//! The cluster's operations (ClusterService, `svc-cluster`): status, members, leader, remove,
//! rebalance, transfer-leader, and add (refused: members join by themselves); and what a
//! member does when another announces a change. Readonly may look; changing the membership
//! is admin and audited, the refused add included.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{owner_of, Cluster};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::{Error, Result};

/// One member as `status` and `members` show it.
#[derive(Clone, Debug, Serialize)]
pub struct MemberView {
    pub id: String,
    pub address: String,
    /// "leader" or "follower".
    pub role: String,
    /// "healthy" (heartbeat within member_timeout) or "unreachable".
    pub health: String,
    pub version: String,
    pub started_at: String,
    pub heartbeat_age_ms: i64,
    /// Agents whose heartbeats this member acts on.
    pub agents: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub clustered: bool,
    pub members: Vec<MemberView>,
    /// The member holding the lease ("" when none does).
    pub leader: String,
    /// The lease's fencing token: one more at every change of leader.
    pub term: i64,
    /// PostgreSQL and the NATS cluster (JetStream) both answer.
    pub quorum: bool,
    pub postgres: bool,
    pub nats: bool,
    /// "healthy", "degraded" (a member is down) or "unavailable" (no quorum or no leader).
    pub health: String,
}

fn members_of(domain: &Domain) -> Vec<MemberView> {
    let cluster = &domain.cluster;
    let view = cluster.view();
    let mut agents: BTreeMap<&str, u64> = BTreeMap::new();
    for entry in domain.fleet.registry.all() {
        if let Some(owner) = owner_of(&view.live, &entry.row.id) {
            *agents.entry(owner).or_default() += 1;
        }
    }
    let leader = view.leader().unwrap_or_default();
    if !cluster.is_clustered() {
        return vec![MemberView {
            id: cluster.id.clone(),
            address: cluster.advertise.clone(),
            role: "leader".into(),
            health: "healthy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            started_at: String::new(),
            heartbeat_age_ms: 0,
            agents: agents.values().sum(),
        }];
    }
    let timeout_ms = i64::try_from(cluster.timing.member_timeout.as_millis()).unwrap_or(i64::MAX);
    view.members
        .iter()
        .map(|m| MemberView {
            id: m.id.clone(),
            address: m.advertise.clone(),
            role: if m.id == leader { "leader" } else { "follower" }.into(),
            health: if m.heartbeat_age_ms < timeout_ms {
                "healthy"
            } else {
                "unreachable"
            }
            .into(),
            version: m.version.clone(),
            started_at: m.started_at.clone(),
            heartbeat_age_ms: m.heartbeat_age_ms,
            agents: agents.get(m.id.as_str()).copied().unwrap_or(0),
        })
        .collect()
}

pub async fn status(domain: &Domain, principal: &Principal) -> Result<Status> {
    principal.require(Role::Readonly)?;
    let cluster = &domain.cluster;
    let (postgres, nats) = if cluster.is_clustered() {
        tokio::join!(cluster.database_ok(), cluster.nats_ok())
    } else {
        let ping = tokio::time::timeout(Duration::from_secs(2), domain.store.ping()).await;
        (ping.is_ok_and(|r| r.is_ok()), true)
    };
    let members = members_of(domain);
    let view = cluster.view();
    let leader = view.leader().unwrap_or_default().to_string();
    let quorum = postgres && nats;
    let health = if !quorum || leader.is_empty() {
        "unavailable"
    } else if members.iter().any(|m| m.health != "healthy") {
        "degraded"
    } else {
        "healthy"
    };
    Ok(Status {
        clustered: cluster.is_clustered(),
        members,
        leader,
        term: view.lease.token,
        quorum,
        postgres,
        nats,
        health: health.into(),
    })
}

/// Every member, or the one named `id` (NotFound when unknown).
pub fn members(domain: &Domain, principal: &Principal, id: &str) -> Result<Vec<MemberView>> {
    principal.require(Role::Readonly)?;
    let all = members_of(domain);
    if id.is_empty() {
        return Ok(all);
    }
    let one: Vec<MemberView> = all.into_iter().filter(|m| m.id == id).collect();
    if one.is_empty() {
        return Err(Error::NotFound(format!("no cluster member '{id}'")));
    }
    Ok(one)
}

pub fn leader(domain: &Domain, principal: &Principal) -> Result<MemberView> {
    principal.require(Role::Readonly)?;
    let view = domain.cluster.view();
    let leader = view.leader().unwrap_or_default().to_string();
    members_of(domain)
        .into_iter()
        .find(|m| m.id == leader)
        .ok_or_else(|| {
            Error::Unavailable(
                "no member holds the leader lease right now (an election takes up to \
                 cluster.lease_ttl)"
                    .into(),
            )
        })
}

/// `add`: members join by themselves (seed: a passthrough the server does not implement), so
/// the request is refused by that rule (`Unimplemented`); audited as `cluster.add`, as every
/// refused change is.
pub async fn add(domain: &Domain, principal: &Principal, id: &str) -> Result<()> {
    let result = principal.require(Role::Admin).and_then(|()| {
        Err(Error::Unimplemented(
            "members join by themselves: start svc-server with cluster.enabled on the shared \
             PostgreSQL and NATS cluster"
                .into(),
        ))
    });
    domain
        .auditor
        .record(
            principal,
            Action::new("cluster.add", "cluster_member", id),
            &result,
        )
        .await;
    result
}

/// Evicts a member: its row goes, and the member (if alive) stops serving at its next
/// heartbeat. Its agents go to the others at once.
pub async fn remove(domain: &Domain, principal: &Principal, id: &str) -> Result<()> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("cluster.remove", "cluster_member", id),
            async {
                principal.require(Role::Admin)?;
                let cluster = &domain.cluster;
                if id.is_empty() {
                    return Err(Error::Invalid("remove needs a member id".into()));
                }
                if !cluster.db().await?.remove(id).await? {
                    return Err(Error::NotFound(format!("no cluster member '{id}'")));
                }
                cluster.notify("cluster:refresh").await;
                // This member's own view is current when the answer goes back.
                cluster.tick().await;
                Ok(())
            },
        )
        .await;
    domain
        .auditor
        .record(
            principal,
            Action::new("cluster.remove", "cluster_member", id),
            &result,
        )
        .await;
    result
}

/// Every member reads the member list now and recomputes which agents it owns (it also
/// happens by itself whenever a member joins or dies). Returns agents per member.
pub async fn rebalance(domain: &Domain, principal: &Principal) -> Result<BTreeMap<String, u64>> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("cluster.rebalance", "cluster", "*"),
            async {
                principal.require(Role::Admin)?;
                let cluster = &domain.cluster;
                if cluster.is_clustered() {
                    cluster.notify("cluster:refresh").await;
                    cluster.tick().await;
                }
                Ok(members_of(domain)
                    .into_iter()
                    .filter(|m| m.health == "healthy")
                    .map(|m| (m.id, m.agents))
                    .collect::<BTreeMap<_, _>>())
            },
        )
        .await;
    let detail = match &result {
        Ok(spread) => serde_json::json!({ "agents": spread }),
        Err(_) => serde_json::json!({}),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("cluster.rebalance", "cluster", "*").detail(detail),
            &result,
        )
        .await;
    result
}

/// Moves the lease to `to` (or to another live member when empty) and waits until it holds
/// it (the leader gives it up at its next renewal).
pub async fn transfer_leader(
    domain: &Domain,
    principal: &Principal,
    to: &str,
) -> Result<MemberView> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("cluster.transfer_leader", "cluster_member", to),
            transfer(domain, principal, to),
        )
        .await;
    let target = match &result {
        Ok(member) => member.id.clone(),
        Err(_) => to.to_string(),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("cluster.transfer_leader", "cluster_member", &target),
            &result,
        )
        .await;
    result
}

async fn transfer(domain: &Domain, principal: &Principal, to: &str) -> Result<MemberView> {
    principal.require(Role::Admin)?;
    let cluster: &Cluster = &domain.cluster;
    if !cluster.is_clustered() {
        return Err(super::not_clustered());
    }
    cluster.tick().await;
    let view = cluster.view();
    let current = view.leader().unwrap_or_default().to_string();
    let to = if to.is_empty() {
        view.live
            .iter()
            .find(|id| **id != current)
            .cloned()
            .ok_or_else(|| {
                Error::FailedPrecondition("no other live member to hand the lead to".into())
            })?
    } else {
        to.to_string()
    };
    if !view.live.contains(&to) {
        return Err(Error::FailedPrecondition(format!(
            "member '{to}' is not live (svc-cluster members lists who is)"
        )));
    }
    if to != current {
        let ttl = cluster.timing.lease_ttl;
        cluster.db().await?.prefer(&to, ttl * 3).await?;
        cluster.notify("cluster:refresh").await;
        let deadline = tokio::time::Instant::now() + ttl * 3;
        loop {
            tokio::time::sleep(cluster.timing.heartbeat_interval / 4).await;
            let lease = cluster.db().await?.lease().await?;
            if lease.holder.as_deref() == Some(to.as_str()) && lease.remaining_ms > 0 {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "'{to}' did not take the lead within {}",
                    crate::clock::format_duration(ttl * 3)
                )));
            }
        }
        cluster.tick().await;
    }
    members_of(domain)
        .into_iter()
        .find(|m| m.id == to)
        .ok_or_else(|| Error::NotFound(format!("no cluster member '{to}'")))
}

/// Another member announced a change on `svc_changes`.
pub(super) async fn changed(domain: &Domain, payload: &str) {
    if let Some(agent) = payload.strip_prefix("agent:") {
        if let Err(error) = crate::fleet::refresh(domain, agent).await {
            tracing::warn!(%error, agent, "cannot read a changed agent");
        }
    } else if let Some(name) = payload.strip_prefix("transit:") {
        crate::secrets::forget_transit_keys(domain, Some(name));
    } else if payload.starts_with("cluster:") {
        domain.cluster.wake();
    }
}

/// After the listener reconnects: announcements were missed, so read everything again.
pub(super) async fn reload_cached(domain: &Domain) {
    if let Err(error) = crate::fleet::load(domain).await {
        tracing::warn!(%error, "cannot reload the agents after a reconnect");
    }
    crate::secrets::forget_transit_keys(domain, None);
}
