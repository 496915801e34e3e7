//! `svc-cluster status|members|leader|add|remove|rebalance|transfer-leader`: the cluster's
//! members and leader through ClusterService (docs/cluster.md).

use argh::FromArgs;
use serde::Serialize;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::{CliError, Common, Output};
use crate::proto;
use crate::proto::cluster_service_client::ClusterServiceClient;

/// The membership commands, in svc-cluster's help order (its first table, `cli::tables`).
pub const COMMANDS: &[super::Command] = &[
    command!("status", StatusArgs, status),
    command!("members", MembersArgs, members),
    command!("leader", LeaderArgs, leader),
    command!("add", AddArgs, add),
    command!("remove", RemoveArgs, remove),
    command!("rebalance", RebalanceArgs, rebalance),
    command!("transfer-leader", TransferArgs, transfer),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// Show the members, the leader and its term, each member's health and agents, and quorum:
/// whether PostgreSQL and the NATS cluster (JetStream) answer. Exit 1 when the cluster is
/// unavailable (no quorum or no leader).
#[argh(help_triggers("-h", "--help"))]
struct StatusArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// List the members, or show the one named ID (exit 5 when unknown).
#[argh(help_triggers("-h", "--help"))]
struct MembersArgs {
    /// a member id
    #[argh(positional)]
    id: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show the member holding the leader lease (exit 3 while none does).
#[argh(help_triggers("-h", "--help"))]
struct LeaderArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Passthrough kept from the seed: members join by themselves (start svc-server with
/// cluster.enabled), so the server answers Unimplemented.
#[argh(help_triggers("-h", "--help"))]
struct AddArgs {
    /// a member id
    #[argh(positional)]
    id: Option<String>,
    /// the member's address
    #[argh(option)]
    address: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Evict the member ID (admin, audited): its row goes and, if it is running, it stops serving
/// within a heartbeat interval; its agents go to the other members at once.
#[argh(help_triggers("-h", "--help"))]
struct RemoveArgs {
    /// the member id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Make every member read the member list now and recompute which agents it owns (admin,
/// audited); it also happens by itself when a member joins or dies. Prints agents per member.
#[argh(help_triggers("-h", "--help"))]
struct RebalanceArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Move the leader lease to TARGET, or to another live member when omitted (admin, audited),
/// and wait until it holds it.
#[argh(help_triggers("-h", "--help"))]
struct TransferArgs {
    /// the member to lead (also --to)
    #[argh(positional)]
    target: Option<String>,
    /// the member to lead
    #[argh(option)]
    to: Option<String>,
}

async fn client(
    common: &Common,
) -> Result<ClusterServiceClient<tonic::transport::Channel>, CliError> {
    Ok(ClusterServiceClient::new(grpc_channel(common).await?))
}

#[derive(Serialize)]
struct MemberJson<'a> {
    id: &'a str,
    address: &'a str,
    role: &'a str,
    health: &'a str,
    version: &'a str,
    started_at: &'a str,
    heartbeat_age_ms: i64,
    agents: u64,
}

fn member_json(m: &proto::Member) -> MemberJson<'_> {
    MemberJson {
        id: &m.id,
        address: &m.address,
        role: &m.role,
        health: &m.health,
        version: &m.version,
        started_at: &m.started_at,
        heartbeat_age_ms: m.heartbeat_age_ms,
        agents: m.agents,
    }
}

fn print_members(members: &[proto::Member]) {
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                m.address.clone(),
                m.role.clone(),
                m.health.clone(),
                m.agents.to_string(),
                format!("{:.1}s", m.heartbeat_age_ms as f64 / 1000.0),
                m.version.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "ADDRESS",
            "ROLE",
            "HEALTH",
            "AGENTS",
            "HEARTBEAT_AGE",
            "VERSION",
        ],
        &rows,
    );
}

async fn status(common: Common, _: StatusArgs) -> Result<(), CliError> {
    let status = client(&common)
        .await?
        .status(authorized(&common, proto::Empty {})?)
        .await?
        .into_inner();
    if common.output == Output::Json {
        let members: Vec<MemberJson> = status.members.iter().map(member_json).collect();
        print_json(&serde_json::json!({
            "clustered": status.clustered,
            "leader": status.leader,
            "term": status.term,
            "quorum": status.quorum,
            "postgres": status.postgres,
            "nats": status.nats,
            "health": status.health,
            "members": members,
        }))?;
    } else {
        let yes_no = |b: bool| if b { "reachable" } else { "UNREACHABLE" };
        println!("health:   {}", status.health);
        if status.clustered {
            println!(
                "leader:   {} (term {})",
                if status.leader.is_empty() {
                    "none"
                } else {
                    &status.leader
                },
                status.term
            );
            println!(
                "quorum:   {} (PostgreSQL {}, NATS/JetStream {})",
                if status.quorum { "yes" } else { "NO" },
                yes_no(status.postgres),
                yes_no(status.nats)
            );
        } else {
            println!("mode:     single server (cluster.enabled: false)");
            println!("store:    {}", yes_no(status.postgres));
        }
        println!();
        print_members(&status.members);
    }
    if status.health == "unavailable" {
        return Err(CliError::failed(
            "the cluster is unavailable (no quorum or no leader)".to_string(),
        ));
    }
    Ok(())
}

async fn members(common: Common, args: MembersArgs) -> Result<(), CliError> {
    let request = proto::MemberRequest {
        id: args.id.unwrap_or_default(),
        address: String::new(),
    };
    let members = client(&common)
        .await?
        .members(authorized(&common, request)?)
        .await?
        .into_inner()
        .members;
    if common.output == Output::Json {
        let members: Vec<MemberJson> = members.iter().map(member_json).collect();
        return print_json(&members);
    }
    print_members(&members);
    Ok(())
}

fn print_member(common: &Common, member: &proto::Member) -> Result<(), CliError> {
    if common.output == Output::Json {
        return print_json(&member_json(member));
    }
    print_members(std::slice::from_ref(member));
    Ok(())
}

async fn leader(common: Common, _: LeaderArgs) -> Result<(), CliError> {
    let member = client(&common)
        .await?
        .leader(authorized(&common, proto::Empty {})?)
        .await?
        .into_inner();
    print_member(&common, &member)
}

async fn add(common: Common, args: AddArgs) -> Result<(), CliError> {
    let request = proto::MemberRequest {
        id: args.id.unwrap_or_default(),
        address: args.address.unwrap_or_default(),
    };
    let member = client(&common)
        .await?
        .add(authorized(&common, request)?)
        .await?
        .into_inner();
    print_member(&common, &member)
}

async fn remove(common: Common, args: RemoveArgs) -> Result<(), CliError> {
    let request = proto::MemberRequest {
        id: args.id.clone(),
        address: String::new(),
    };
    client(&common)
        .await?
        .remove(authorized(&common, request)?)
        .await?;
    if common.output == Output::Json {
        return print_json(&serde_json::json!({ "removed": args.id }));
    }
    println!(
        "removed {}: it stops serving at its next heartbeat",
        args.id
    );
    Ok(())
}

async fn rebalance(common: Common, _: RebalanceArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    client
        .rebalance(authorized(&common, proto::Empty {})?)
        .await?;
    let members = client
        .members(authorized(&common, proto::MemberRequest::default())?)
        .await?
        .into_inner()
        .members;
    if common.output == Output::Json {
        let members: Vec<MemberJson> = members.iter().map(member_json).collect();
        return print_json(&serde_json::json!({ "rebalanced": true, "members": members }));
    }
    println!("rebalanced: agents per live member");
    print_members(&members);
    Ok(())
}

async fn transfer(common: Common, args: TransferArgs) -> Result<(), CliError> {
    let to = match (args.target, args.to) {
        (Some(_), Some(_)) => {
            return Err(CliError::usage(
                "give the target once: TARGET or --to TARGET".to_string(),
            ))
        }
        (Some(to), None) | (None, Some(to)) => to,
        (None, None) => String::new(),
    };
    let request = proto::MemberRequest {
        id: to,
        address: String::new(),
    };
    let member = client(&common)
        .await?
        .transfer_leader(authorized(&common, request)?)
        .await?
        .into_inner();
    if common.output == Output::Json {
        return print_json(&member_json(&member));
    }
    println!("{} is the leader", member.id);
    Ok(())
}
