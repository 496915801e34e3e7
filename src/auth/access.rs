//! What each role may do on every surface: the gRPC methods, the REST routes and the bus.
//!
//! One file answers "who may do X?" for the whole server. The transports check the gRPC and
//! REST rows first, before they read or parse anything a request carries, so a caller
//! without the role gets 403/PERMISSION_DENIED and a `denied` audit row (`AUDITED`) whatever
//! its body (the gRPC auth layer; REST's `principal`). The domain functions check them again
//! with `Principal::require`, so a new transport cannot skip them. The broker enforces the
//! bus rows through [`bus_permissions`]. `tests/access.rs` calls every
//! method, route and subject with each role and with no key, and compares the answers with
//! these tables; it also fails when a method or route exists that has no row here.
//! docs/ARCHITECTURE.md's role table is generated from them (`role_table_markdown`).

use super::Role;
use crate::bus::{subjects, AllowDeny, Permissions, SubjectRule};

/// Who may call one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No key needed (health, metrics, public documents).
    Public,
    /// A key whose role is at least this one.
    Least(Role),
    /// Any key gets past the role check; the operation answers UNIMPLEMENTED: PolicyService's
    /// Create/Update/DeletePolicy, refused by design (policies are files under policy_dir)
    /// and audited as `denied`.
    RefusedByDesign,
}

impl Access {
    /// Whether a caller with `role` (None: no key) gets past authorization.
    pub fn allows(self, role: Option<Role>) -> bool {
        match (self, role) {
            (Access::Public, _) => true,
            (_, None) => false,
            (Access::Least(needed), Some(role)) => role >= needed,
            (Access::RefusedByDesign, Some(_)) => true,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Access::Public => "no key",
            Access::Least(Role::Readonly) => "readonly",
            Access::Least(Role::Operator) => "operator",
            Access::Least(Role::Admin) => "admin",
            Access::RefusedByDesign => "any key (UNIMPLEMENTED: policies are files)",
        }
    }
}

use Access::{Least, Public, RefusedByDesign};
use Role::{Admin, Operator, Readonly};

/// Every gRPC method (`package.Service/Method`). Health and reflection are public.
pub const GRPC: &[(&str, Access)] = &[
    ("svc.v1.EventService/List", Least(Readonly)),
    ("svc.v1.EventService/Get", Least(Readonly)),
    ("svc.v1.EventService/Emit", Least(Operator)),
    ("svc.v1.EventService/Subscribe", Least(Readonly)),
    ("svc.v1.EventService/Replay", Least(Readonly)),
    ("svc.v1.EventService/Stats", Least(Readonly)),
    ("svc.v1.EventService/Types", Least(Readonly)),
    ("svc.v1.PolicyService/AuditLog", Least(Readonly)),
    ("svc.v1.PolicyService/AuditExport", Least(Admin)),
    ("svc.v1.PolicyService/AuditReport", Least(Readonly)),
    ("svc.v1.PolicyService/AuditStats", Least(Readonly)),
    ("svc.v1.PolicyService/AuditVerify", Least(Readonly)),
    ("svc.v1.PolicyService/ListPolicies", Least(Readonly)),
    ("svc.v1.PolicyService/GetPolicy", Least(Readonly)),
    ("svc.v1.PolicyService/Compliance", Least(Readonly)),
    ("svc.v1.PolicyService/Violations", Least(Readonly)),
    ("svc.v1.PolicyService/CreatePolicy", RefusedByDesign),
    ("svc.v1.PolicyService/UpdatePolicy", RefusedByDesign),
    ("svc.v1.PolicyService/DeletePolicy", RefusedByDesign),
    ("svc.v1.IdentityService/CaInfo", Least(Readonly)),
    ("svc.v1.IdentityService/RotateSigning", Least(Admin)),
    ("svc.v1.IdentityService/ExportCa", Least(Admin)),
    ("svc.v1.IdentityService/CommandKeyInfo", Least(Readonly)),
    ("svc.v1.IdentityService/RotateCommandKey", Least(Admin)),
    ("svc.v1.IdentityService/RetireCommandKey", Least(Admin)),
    ("svc.v1.IdentityService/EncryptCa", Least(Admin)),
    ("svc.v1.IdentityService/Status", Least(Readonly)),
    ("svc.v1.IdentityService/Psk", Least(Admin)),
    ("svc.v1.IdentityService/CreateToken", Least(Operator)),
    ("svc.v1.IdentityService/ListTokens", Least(Readonly)),
    ("svc.v1.IdentityService/RevokeToken", Least(Admin)),
    ("svc.v1.IdentityService/CleanupTokens", Least(Admin)),
    ("svc.v1.IdentityService/IssueJwt", Least(Admin)),
    ("svc.v1.IdentityService/ListJwts", Least(Admin)),
    ("svc.v1.IdentityService/RevokeJwt", Least(Admin)),
    ("svc.v1.IdentityService/VerifyJwt", Least(Readonly)),
    ("svc.v1.SecretsService/Put", Least(Operator)),
    ("svc.v1.SecretsService/Get", Least(Operator)),
    ("svc.v1.SecretsService/Delete", Least(Operator)),
    ("svc.v1.SecretsService/List", Least(Readonly)),
    ("svc.v1.SecretsService/RotateMaster", Least(Admin)),
    ("svc.v1.SecretsService/TransitCreateKey", Least(Operator)),
    ("svc.v1.SecretsService/TransitListKeys", Least(Operator)),
    ("svc.v1.SecretsService/TransitEncrypt", Least(Operator)),
    ("svc.v1.SecretsService/TransitDecrypt", Least(Operator)),
    ("svc.v1.SecretsService/TransitSign", Least(Operator)),
    ("svc.v1.SecretsService/TransitVerify", Least(Operator)),
    ("svc.v1.SecretsService/TransitRotate", Least(Operator)),
    ("svc.v1.SecretsService/TransitConfigKey", Least(Operator)),
    ("svc.v1.SecretsService/TransitRewrap", Least(Operator)),
    ("svc.v1.SecretsService/CreateCredentials", Least(Operator)),
    ("svc.v1.SecretsService/ListLeases", Least(Operator)),
    ("svc.v1.SecretsService/GetLease", Least(Operator)),
    ("svc.v1.SecretsService/RenewLease", Least(Operator)),
    ("svc.v1.SecretsService/RevokeLease", Least(Operator)),
    ("svc.v1.ClusterService/Status", Least(Readonly)),
    ("svc.v1.ClusterService/Members", Least(Readonly)),
    ("svc.v1.ClusterService/Leader", Least(Readonly)),
    ("svc.v1.ClusterService/Add", Least(Admin)),
    ("svc.v1.ClusterService/Remove", Least(Admin)),
    ("svc.v1.ClusterService/Rebalance", Least(Admin)),
    ("svc.v1.ClusterService/TransferLeader", Least(Admin)),
    ("svc.v1.ClusterService/Backup", Least(Admin)),
    ("svc.v1.ClusterService/Restore", Least(Admin)),
    ("svc.v1.FleetService/ListAgents", Least(Readonly)),
    ("svc.v1.FleetService/GetAgent", Least(Readonly)),
    ("svc.v1.FleetService/Quarantine", Least(Operator)),
    ("svc.v1.FleetService/Unquarantine", Least(Operator)),
    ("svc.v1.FleetService/SetLabels", Least(Operator)),
    ("svc.v1.FleetService/Exec", Least(Operator)),
    ("svc.v1.FleetService/StateCheck", Least(Operator)),
    ("svc.v1.FleetService/StateApply", Least(Operator)),
    ("svc.v1.FleetService/StateDrift", Least(Operator)),
    ("svc.v1.FleetService/ModuleRun", Least(Operator)),
    ("svc.v1.FleetService/ExecAsync", Least(Operator)),
    ("svc.v1.FleetService/StateApplyAsync", Least(Operator)),
    ("svc.v1.FleetService/ListJobs", Least(Readonly)),
    // A job's results carry the programs' output: the role that may run one.
    ("svc.v1.FleetService/GetJob", Least(Operator)),
    ("svc.v1.WebhookService/Create", Least(Operator)),
    ("svc.v1.WebhookService/List", Least(Readonly)),
    ("svc.v1.WebhookService/Get", Least(Readonly)),
    ("svc.v1.WebhookService/Update", Least(Operator)),
    ("svc.v1.WebhookService/Delete", Least(Operator)),
    ("svc.v1.WebhookService/Test", Least(Operator)),
    ("svc.v1.WebhookService/Deliveries", Least(Readonly)),
    ("svc.v1.WebhookService/Redeliver", Least(Operator)),
    ("svc.v1.RunbookService/List", Least(Readonly)),
    ("svc.v1.RunbookService/Get", Least(Readonly)),
    ("svc.v1.RunbookService/Execute", Least(Operator)),
    ("svc.v1.RunbookService/ListExecutions", Least(Readonly)),
    ("svc.v1.RunbookService/Status", Least(Readonly)),
    ("svc.v1.RunbookService/Audit", Least(Readonly)),
    ("svc.v1.RunbookService/Cancel", Least(Operator)),
    ("svc.v1.RunbookService/Approve", Least(Operator)),
    ("svc.v1.BlueprintService/Install", Least(Operator)),
    ("svc.v1.BlueprintService/Update", Least(Operator)),
    ("svc.v1.BlueprintService/Remove", Least(Operator)),
    ("svc.v1.BlueprintService/List", Least(Readonly)),
    ("svc.v1.BlueprintService/Get", Least(Readonly)),
    ("svc.v1.BlueprintService/Apply", Least(Operator)),
    ("svc.v1.BlueprintService/Applied", Least(Readonly)),
    ("svc.v1.BlueprintService/Rollback", Least(Operator)),
];

/// Every REST route, as `METHOD /path` with `{id}` for a path parameter.
pub const REST: &[(&str, Access)] = &[
    ("GET /health/live", Public),
    ("GET /health/ready", Public),
    ("GET /metrics", Public),
    ("GET /api/v1/openapi.json", Public),
    ("GET /.well-known/jwks.json", Public),
    ("GET /.well-known/jwt-revocations.json", Public),
    ("GET /api/v1/apikeys", Least(Admin)),
    ("POST /api/v1/apikeys", Least(Admin)),
    ("GET /api/v1/apikeys/{id}", Least(Admin)),
    ("PATCH /api/v1/apikeys/{id}", Least(Admin)),
    ("DELETE /api/v1/apikeys/{id}", Least(Admin)),
    ("GET /ui/", Public),
    ("GET /api/v1/whoami", Least(Readonly)),
    ("GET /api/v1/events", Least(Readonly)),
    ("GET /api/v1/events/stream", Least(Readonly)),
    ("GET /api/v1/events/timeline", Least(Readonly)),
    ("GET /api/v1/events/{id}", Least(Readonly)),
    ("GET /api/v1/audit", Least(Readonly)),
    ("GET /api/v1/audit/verify", Least(Readonly)),
    ("GET /api/v1/audit/export", Least(Admin)),
    ("GET /api/v1/agents", Least(Readonly)),
    ("GET /api/v1/agents/{id}", Least(Readonly)),
    ("POST /api/v1/agents/{id}/quarantine", Least(Operator)),
    ("POST /api/v1/agents/{id}/unquarantine", Least(Operator)),
    ("GET /api/v1/secrets", Least(Readonly)),
    ("GET /api/v1/jobs", Least(Readonly)),
    ("GET /api/v1/jobs/{id}", Least(Operator)),
];

/// The access rule for a gRPC method path (`/svc.v1.X/Y` or `svc.v1.X/Y`).
pub fn grpc_access(method: &str) -> Option<Access> {
    let method = method.trim_start_matches('/');
    GRPC.iter()
        .find(|(name, _)| *name == method)
        .map(|(_, access)| *access)
}

/// The row of `REST` a request is for: its route (`METHOD /path` with `{id}`), its access
/// rule and the `{id}` segment, if any. A literal segment wins over `{id}`
/// (`/api/v1/events/stream` is not event `stream`).
pub fn rest_access(method: &str, path: &str) -> Option<(&'static str, Access, Option<String>)> {
    // Every request passes here: no allocation but the id's.
    let segments = |text: &'static str| text.trim_end_matches('/').split('/').skip(1);
    let path = path.trim_end_matches('/');
    let mut best: Option<(&'static str, Access, Option<&str>)> = None;
    for (route, access) in REST {
        let Some((route_method, template)) = route.split_once(' ') else {
            continue;
        };
        if route_method != method || segments(template).count() != path.split('/').count() - 1 {
            continue;
        }
        let mut id = None;
        let fits = segments(template)
            .zip(path.split('/').skip(1))
            .all(|(want, got)| match want {
                "{id}" if !got.is_empty() => {
                    id = Some(got);
                    true
                }
                _ => want == got,
            });
        if fits && (best.is_none() || id.is_none()) {
            best = Some((route, *access, id));
        }
    }
    best.map(|(route, access, id)| (route, access, id.map(str::to_string)))
}

/// What a refusal by role writes to the audit log when the transport refuses a request
/// before reading its input (contract §9: refused operations are audited as `denied`): the
/// action and resource type the domain function writes for the same operation, and where
/// the resource id comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Audited {
    pub action: &'static str,
    pub resource_type: &'static str,
    pub id: ResourceId,
}

/// Where the resource id of a refusal's audit row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceId {
    /// None: the domain makes the id (a job, a new webhook) or there is none.
    Empty,
    /// Always this one (`master_key`, `*`).
    Fixed(&'static str),
    /// gRPC: this string field of the request message, when the message can be read; empty
    /// when it cannot (a refusal never depends on the body).
    Field(&'static str),
    /// REST: the route's `{id}` segment.
    Path,
}

use ResourceId::{Empty, Field, Fixed, Path};

const fn row(action: &'static str, resource_type: &'static str, id: ResourceId) -> Audited {
    Audited {
        action,
        resource_type,
        id,
    }
}

/// The audit row of each method and route (names as in `GRPC` and `REST`) whose refusal is
/// audited: every operation that changes something, and the reads the domain audits
/// (secrets, transit, leases, CA export, backups). One action per method: where the domain
/// picks between two by the request (`secret.delete` or `secret.destroy`, `lease.revoke` or
/// `lease.revoke_prefix`), the refusal, made before the request is read, names the first.
#[rustfmt::skip]
pub const AUDITED: &[(&str, Audited)] = &[
    ("svc.v1.EventService/Emit", row("event.emit", "event", Empty)),
    ("svc.v1.IdentityService/RotateSigning", row("ca.rotate_signing", "ca", Fixed("signing"))),
    ("svc.v1.IdentityService/ExportCa", row("ca.export", "ca", Fixed("chain"))),
    ("svc.v1.IdentityService/RotateCommandKey", row("command_key.rotate", "command_key", Fixed("command"))),
    ("svc.v1.IdentityService/RetireCommandKey", row("command_key.retire", "command_key", Fixed("command"))),
    ("svc.v1.IdentityService/EncryptCa", row("ca.encrypt", "ca", Fixed("keys"))),
    ("svc.v1.IdentityService/Psk", row("agent.psk", "agent", Field("agent_id"))),
    ("svc.v1.IdentityService/CreateToken", row("token.create", "join_token", Empty)),
    ("svc.v1.IdentityService/RevokeToken", row("token.revoke", "join_token", Field("id"))),
    ("svc.v1.IdentityService/CleanupTokens", row("token.cleanup", "join_token", Fixed("*"))),
    ("svc.v1.IdentityService/IssueJwt", row("jwt.issue", "jwt_svid", Empty)),
    ("svc.v1.IdentityService/RevokeJwt", row("jwt.revoke", "jwt_svid", Field("id"))),
    ("svc.v1.SecretsService/Put", row("secret.write", "secret", Field("path"))),
    ("svc.v1.SecretsService/Get", row("secret.read", "secret", Field("path"))),
    ("svc.v1.SecretsService/Delete", row("secret.delete", "secret", Field("path"))),
    ("svc.v1.SecretsService/RotateMaster", row("secret.rotate_master", "secret", Fixed("master_key"))),
    ("svc.v1.SecretsService/TransitCreateKey", row("transit.create_key", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitListKeys", row("transit.list_keys", "transit_key", Fixed("*"))),
    ("svc.v1.SecretsService/TransitEncrypt", row("transit.encrypt", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitDecrypt", row("transit.decrypt", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitSign", row("transit.sign", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitVerify", row("transit.verify", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitRotate", row("transit.rotate", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitConfigKey", row("transit.config", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/TransitRewrap", row("transit.rewrap", "transit_key", Field("name"))),
    ("svc.v1.SecretsService/CreateCredentials", row("lease.create", "lease", Empty)),
    ("svc.v1.SecretsService/ListLeases", row("lease.list", "lease", Field("prefix"))),
    ("svc.v1.SecretsService/GetLease", row("lease.read", "lease", Field("id"))),
    ("svc.v1.SecretsService/RenewLease", row("lease.renew", "lease", Field("id"))),
    ("svc.v1.SecretsService/RevokeLease", row("lease.revoke", "lease", Field("id"))),
    ("svc.v1.ClusterService/Add", row("cluster.add", "cluster_member", Field("id"))),
    ("svc.v1.ClusterService/Remove", row("cluster.remove", "cluster_member", Field("id"))),
    ("svc.v1.ClusterService/Rebalance", row("cluster.rebalance", "cluster", Fixed("*"))),
    ("svc.v1.ClusterService/TransferLeader", row("cluster.transfer_leader", "cluster_member", Field("id"))),
    ("svc.v1.ClusterService/Backup", row("cluster.backup", "cluster", Empty)),
    ("svc.v1.ClusterService/Restore", row("cluster.restore", "cluster", Fixed("online"))),
    ("svc.v1.FleetService/Quarantine", row("agent.quarantine", "agent", Field("id"))),
    ("svc.v1.FleetService/Unquarantine", row("agent.unquarantine", "agent", Field("id"))),
    ("svc.v1.FleetService/SetLabels", row("agent.label", "agent", Field("id"))),
    ("svc.v1.FleetService/Exec", row("exec.run", "job", Empty)),
    ("svc.v1.FleetService/StateApply", row("state.apply", "job", Empty)),
    ("svc.v1.FleetService/ModuleRun", row("module.run", "job", Empty)),
    ("svc.v1.FleetService/ExecAsync", row("exec.run", "job", Empty)),
    ("svc.v1.FleetService/StateApplyAsync", row("state.apply", "job", Empty)),
    ("svc.v1.WebhookService/Create", row("webhook.create", "webhook", Empty)),
    ("svc.v1.WebhookService/Update", row("webhook.update", "webhook", Field("id"))),
    ("svc.v1.WebhookService/Delete", row("webhook.delete", "webhook", Field("id"))),
    ("svc.v1.WebhookService/Test", row("webhook.test", "webhook", Field("id"))),
    ("svc.v1.WebhookService/Redeliver", row("webhook.redeliver", "webhook_delivery", Field("delivery_id"))),
    ("svc.v1.RunbookService/Execute", row("runbook.execute", "runbook_execution", Empty)),
    ("svc.v1.RunbookService/Cancel", row("runbook.cancel", "runbook_execution", Field("id"))),
    ("svc.v1.RunbookService/Approve", row("runbook.approve", "runbook_execution", Field("id"))),
    ("svc.v1.BlueprintService/Install", row("blueprint.install", "blueprint", Empty)),
    ("svc.v1.BlueprintService/Update", row("blueprint.update", "blueprint", Empty)),
    ("svc.v1.BlueprintService/Remove", row("blueprint.remove", "blueprint", Field("name"))),
    ("svc.v1.BlueprintService/Apply", row("blueprint.apply", "blueprint", Field("name"))),
    ("svc.v1.BlueprintService/Rollback", row("blueprint.rollback", "blueprint", Field("name"))),
    ("POST /api/v1/apikeys", row("apikey.create", "apikey", Empty)),
    ("PATCH /api/v1/apikeys/{id}", row("apikey.update", "apikey", Path)),
    ("DELETE /api/v1/apikeys/{id}", row("apikey.delete", "apikey", Path)),
    ("POST /api/v1/agents/{id}/quarantine", row("agent.quarantine", "agent", Path)),
    ("POST /api/v1/agents/{id}/unquarantine", row("agent.unquarantine", "agent", Path)),
];

/// The methods and routes a role can be refused whose refusal is not audited: reads the
/// domain does not audit either (listings, the audit export, state check and drift).
pub const NOT_AUDITED: &[&str] = &[
    "svc.v1.PolicyService/AuditExport",
    "svc.v1.IdentityService/ListJwts",
    "svc.v1.FleetService/StateCheck",
    "svc.v1.FleetService/StateDrift",
    "svc.v1.FleetService/GetJob",
    "GET /api/v1/jobs/{id}",
    "GET /api/v1/apikeys",
    "GET /api/v1/apikeys/{id}",
    "GET /api/v1/audit/export",
];

/// The audit row of a refusal of `operation` (a `GRPC` or `REST` name), if it has one.
pub fn audited(operation: &str) -> Option<Audited> {
    let operation = operation.trim_start_matches('/');
    AUDITED
        .iter()
        .find(|(name, _)| *name == operation)
        .map(|(_, audited)| *audited)
}

/// What an API key of `role` may do on the bus (contract §7):
/// - no key may publish or subscribe on `svc.enroll` or `svc.agent.>`: commands reach agents
///   only through the server (audited, quarantine honoured) and nobody may forge a result;
/// - publishing on `svc.events.>` is the server's alone: an event on the live feed must also
///   be stored and audited, so emitting goes through EventService;
/// - admin and operator: every other subject; on `svc.files.>` publish only (requests): only
///   the server subscribes there, so no key overhears another's uploads (of any cluster) or
///   answers in the server's place;
/// - readonly: subscribe to `svc.events.>` and to an inbox it names literally
///   (`_INBOX.<16+ chars>.`, never `_INBOX.>`, so it cannot overhear other clients' replies:
///   another cluster's file contents among them); publish the file service's read
///   requests (`svc.files.*.get` and the other read operations), nothing else.
///
/// Connections without a key get `Permissions::enrolment()`; agents get their own subjects
/// (`server::bus::agent_bus_permissions`); the server's own client is unrestricted.
pub fn bus_permissions(role: Role, user: String) -> Permissions {
    let agents_and_enrolment = [subjects::ENROLL, subjects::AGENTS_ALL];
    match role {
        Admin | Operator => Permissions {
            user,
            publish: AllowDeny::all()
                .deny(agents_and_enrolment)
                .deny([subjects::EVENTS_ALL]),
            subscribe: AllowDeny::all()
                .deny(agents_and_enrolment)
                .deny([subjects::FILES_ALL]),
            internal: false,
            quota: true,
        },
        Readonly => Permissions {
            user,
            publish: AllowDeny::only(
                subjects::FILES_READ_OPERATIONS
                    .iter()
                    .map(|operation| subjects::files("*", operation)),
            ),
            subscribe: AllowDeny {
                allow: vec![
                    SubjectRule::pattern(subjects::EVENTS_ALL),
                    SubjectRule::private_inbox("_INBOX", 16),
                ],
                deny: Vec::new(),
            },
            internal: false,
            quota: true,
        },
    }
}

/// Representative bus subjects for the role table and the access test.
pub const BUS_SUBJECTS: &[&str] = &[
    "svc.enroll",
    "svc.agent.web-1.cmd",
    "svc.agent.web-1.result",
    "svc.agent.web-1.heartbeat",
    "svc.agent.web-1.jwt",
    "svc.events.agent_connected",
    "svc.files.main.get",
    "svc.files.main.put",
    "app.anything",
];

/// The role × surface table as Markdown, for docs/ARCHITECTURE.md (a test keeps the two
/// equal).
pub fn role_table_markdown() -> String {
    let mut out = String::from("| surface | operation | who may |\n| --- | --- | --- |\n");
    for (route, access) in REST {
        out.push_str(&format!("| REST | `{route}` | {} |\n", access.describe()));
    }
    for (method, access) in GRPC {
        out.push_str(&format!("| gRPC | `{method}` | {} |\n", access.describe()));
    }
    for subject in BUS_SUBJECTS {
        let mut publish = Vec::new();
        let mut subscribe = Vec::new();
        for role in [Readonly, Operator, Admin] {
            let permissions = bus_permissions(role, String::new());
            if permissions.publish.allows(subject) {
                publish.push(role.as_str());
            }
            if permissions.subscribe.allows(subject) {
                subscribe.push(role.as_str());
            }
        }
        let anonymous = Permissions::enrolment();
        if anonymous.publish.allows(subject) {
            publish.push("no key (enrolment)");
        }
        let none = |list: Vec<&str>| {
            if list.is_empty() {
                "no API key".to_string()
            } else {
                list.join(", ")
            }
        };
        out.push_str(&format!(
            "| bus | `{subject}` | publish: {}; subscribe: {} |\n",
            none(publish),
            none(subscribe)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_api_key_reaches_agents_or_enrolment_and_only_the_server_publishes_events() {
        for role in [Readonly, Operator, Admin] {
            let p = bus_permissions(role, "k".into());
            for subject in ["svc.enroll", "svc.agent.a.cmd", "svc.agent.a.result"] {
                assert!(!p.publish.allows(subject), "{role} publishes {subject}");
                assert!(!p.subscribe.allows(subject), "{role} subscribes {subject}");
            }
            assert!(!p.subscribe.allows("svc.agent.>"), "{role}");
            assert!(!p.publish.allows("svc.events.x"), "{role} publishes events");
            assert!(p.subscribe.allows("svc.events.>"), "{role} reads events");
        }
        let operator = bus_permissions(Operator, "k".into());
        assert!(operator.publish.allows("svc.files.main.get"));
        assert!(
            operator.subscribe.allows(">"),
            "a wide SUB is allowed; denied parts withheld"
        );
        let readonly = bus_permissions(Readonly, "k".into());
        assert!(!readonly.publish.allows("app.x") && !readonly.subscribe.allows("app.x"));
        // Files: readonly may ask to read; nobody but the server hears the requests, and
        // readonly hears no inbox but its own.
        assert!(readonly.publish.allows("svc.files.main.get"));
        assert!(!readonly.publish.allows("svc.files.main.put"));
        for role in [Readonly, Operator, Admin] {
            let p = bus_permissions(role, "k".into());
            assert!(!p.subscribe.allows("svc.files.>"), "{role}");
            assert!(!p.subscribe.allows("svc.files.main.get"), "{role}");
        }
        assert!(!readonly.subscribe.allows("_INBOX.>"));
        assert!(readonly.subscribe.allows("_INBOX.abcdefghijklmnopqrstuv.*"));
    }

    /// Every method or route a key's role can be refused is in `AUDITED` or `NOT_AUDITED`,
    /// once; nothing else is.
    #[test]
    fn every_refusable_operation_says_whether_its_refusal_is_audited() {
        let refusable: Vec<&str> = GRPC
            .iter()
            .chain(REST)
            .filter(|(_, access)| matches!(access, Least(Operator | Admin)))
            .map(|(name, _)| *name)
            .collect();
        let mut said: Vec<&str> = AUDITED.iter().map(|(name, _)| *name).collect();
        said.extend(NOT_AUDITED);
        for name in &refusable {
            let times = said.iter().filter(|s| *s == name).count();
            assert_eq!(
                times, 1,
                "{name} is in AUDITED or NOT_AUDITED {times} times, not once"
            );
        }
        for name in &said {
            assert!(
                refusable.contains(name),
                "{name} is not a method or route a role can be refused"
            );
        }
        for (name, audited) in AUDITED {
            let is_rest = !name.starts_with("svc.v1.");
            let id_fits = match audited.id {
                Path => is_rest && name.contains("{id}"),
                Field(_) => !is_rest,
                Empty | Fixed(_) => true,
            };
            assert!(id_fits, "{name}: {:?} does not fit the surface", audited.id);
        }
    }

    #[test]
    fn rest_requests_find_their_route() {
        assert_eq!(
            rest_access("GET", "/api/v1/events/stream").map(|(r, _, id)| (r, id)),
            Some(("GET /api/v1/events/stream", None))
        );
        assert_eq!(
            rest_access("GET", "/api/v1/events/01J").map(|(r, _, id)| (r, id)),
            Some(("GET /api/v1/events/{id}", Some("01J".to_string())))
        );
        assert_eq!(
            rest_access("POST", "/api/v1/agents/web-1/quarantine/"),
            Some((
                "POST /api/v1/agents/{id}/quarantine",
                Least(Operator),
                Some("web-1".to_string())
            ))
        );
        assert_eq!(rest_access("PUT", "/api/v1/apikeys"), None);
        assert_eq!(rest_access("GET", "/api/v1/agents/a/b/c"), None);
        for (route, access) in REST {
            let (method, path) = route.split_once(' ').unwrap();
            let path = path.replace("{id}", "x1");
            let found = rest_access(method, &path).map(|(r, a, _)| (r, a));
            assert_eq!(found, Some((*route, *access)), "{route}");
        }
    }

    #[test]
    fn table_names_are_unique_and_checks_follow_rank() {
        let mut names: Vec<&str> = GRPC.iter().map(|(n, _)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), GRPC.len());
        assert!(Least(Operator).allows(Some(Admin)));
        assert!(!Least(Operator).allows(Some(Readonly)));
        assert!(!RefusedByDesign.allows(None) && Public.allows(None));
        assert_eq!(
            grpc_access("/svc.v1.EventService/Emit"),
            Some(Least(Operator))
        );
    }
}
