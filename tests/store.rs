//! The store conformance suite: every case runs against SQLite (a temp dir) and against
//! PostgreSQL (a fresh database on the test process's cluster, `common::postgres`), opened
//! through `svc::store::open` as the server opens its store. The cases are the contract of
//! the `Store` traits: whatever one driver does, the other must do too.
//!
//! `cargo test --test store sqlite::` or `postgres::` runs one driver's half.

mod common;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use svc::config::{Secret, StoreConfig, StoreDriver};
use svc::store::{
    AgentRow, AgentStateRow, ApiKeyChange, ApiKeyRow, AuditFilter, AuditGroup, AuditRow, CaRow,
    JoinTokenRow, JwtSvidRow, KeyWrite, LeaseRow, PlanTable, SecretRow, SecretVersionRow, Store,
    TransitKeyRow, TransitVersionRow, Wrapped, MIGRATIONS,
};
use svc::Error;

// ---- The harness ----

/// A case's database: where it lives, so a case can open more stores on it (several
/// connections, as several servers would) or reach it without the store.
struct Db {
    driver: StoreDriver,
    /// The data dir: SQLite's `svc.db` lives here.
    dir: tempfile::TempDir,
    /// PostgreSQL: the admin URL of this case's own database.
    url: String,
}

impl Db {
    fn config(&self) -> StoreConfig {
        StoreConfig {
            driver: self.driver,
            url: Secret(self.url.clone()),
            ..StoreConfig::default()
        }
    }

    /// Another store on the same database.
    async fn open(&self) -> Arc<dyn Store> {
        svc::store::open(&self.config(), self.dir.path())
            .await
            .unwrap_or_else(|e| panic!("open the {:?} store: {e}", self.driver))
    }

    /// Runs one statement through a plain connection of the database's own client library,
    /// outside the store; Err is the database's refusal.
    async fn raw(&self, sql: &str) -> Result<u64, String> {
        match self.driver {
            StoreDriver::Sqlite => {
                let db = rusqlite::Connection::open(self.dir.path().join("svc.db")).unwrap();
                db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
                db.execute(sql, [])
                    .map(|n| n as u64)
                    .map_err(|e| e.to_string())
            }
            StoreDriver::Postgres => {
                let (client, connection) =
                    tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                tokio::spawn(connection);
                client.execute(sql, &[]).await.map_err(|e| e.to_string())
            }
        }
    }
}

/// Runs `case` on a new database of `driver` (skipped, with a "skipped" line, when
/// PostgreSQL is not installed and CI is not set).
fn run<F, Fut>(driver: StoreDriver, case: F)
where
    F: FnOnce(Arc<dyn Store>, Db) -> Fut,
    Fut: Future<Output = ()>,
{
    let url = match driver {
        StoreDriver::Sqlite => String::new(),
        StoreDriver::Postgres => match common::postgres::shared() {
            Some(postgres) => postgres.fresh_database(),
            None => return,
        },
    };
    let db = Db {
        driver,
        dir: tempfile::tempdir().unwrap(),
        url,
    };
    // Two workers: the races below run their contenders on both at once.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = db.open().await;
        case(store, db).await
    });
}

/// One `#[test]` per case and driver: `sqlite::NAME` and `postgres::NAME`.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $case() {
                super::run(svc::config::StoreDriver::Sqlite, super::$case)
            })*
        }
        mod postgres {
            $(#[test]
            fn $case() {
                super::run(svc::config::StoreDriver::Postgres, super::$case)
            })*
        }
    };
}

conformance!(
    schema_and_reopen,
    api_keys_round_trip,
    the_last_active_admin_key_is_kept,
    concurrent_admin_changes_keep_one_admin,
    audit_appends_link_one_chain,
    audit_query_filters,
    audit_query_pages_with_before_seq,
    audit_counts_by_group,
    audit_rows_are_append_only_in_the_database,
    concurrent_appends_from_several_stores_keep_one_chain,
    ca_insert_retires_the_active_one,
    first_ca_is_inserted_once_under_races,
    join_tokens,
    a_join_token_is_used_once_under_races,
    agents_and_fleet,
    concurrent_heartbeats_do_not_fail,
    jwt_svids,
    master_check,
    secret_versions,
    concurrent_secret_writes_conflict,
    rotate_master_is_all_or_nothing,
    transit_keys,
    leases,
    unique_violations_are_conflicts,
    blueprint_tables,
    sealed_at_rest,
);

// ---- Rows ----

/// Minute `n` of 2026-01-01 (then the next days), as `clock::format_rfc3339` writes times:
/// fixed width, so text order is time order.
fn at(n: u32) -> String {
    format!(
        "2026-01-{:02}T{:02}:{:02}:00.000Z",
        1 + n / (24 * 60),
        (n / 60) % 24,
        n % 60
    )
}

const NOW: u32 = 10 * 24 * 60;
const LATER: u32 = 20 * 24 * 60;

fn key(id: &str, role: &str, expires_at: Option<u32>) -> ApiKeyRow {
    ApiKeyRow {
        id: id.into(),
        name: format!("key {id}"),
        role: role.into(),
        key_hash: format!("hash-{id}"),
        created_at: at(1),
        last_used_at: None,
        expires_at: expires_at.map(at),
        signing_sealed: Some(format!("sealed-{id}")),
    }
}

fn audit(id: &str) -> AuditRow {
    AuditRow {
        id: id.into(),
        timestamp: at(1),
        user: "alice".into(),
        action: "apikey.create".into(),
        resource_type: "apikey".into(),
        resource_id: id.into(),
        outcome: "success".into(),
        severity: "low".into(),
        detail: r#"{"name":"ci"}"#.into(),
        ..AuditRow::default()
    }
}

/// The production seal and genesis, so `svc::audit::verify` can check what the store built.
fn seal(row: &AuditRow) -> String {
    svc::audit::chain::seal(row)
}

const GENESIS: &str = svc::audit::chain::GENESIS;

async fn whole_chain(store: &dyn Store) -> Vec<AuditRow> {
    let mut rows = Vec::new();
    loop {
        let after = rows.last().map_or(0, |r: &AuditRow| r.seq);
        let page = store.audit_chain(after, 1000).await.unwrap();
        if page.is_empty() {
            return rows;
        }
        rows.extend(page);
    }
}

/// Asserts `rows` (chain order) are seq 1..=n, each linked to the one before and sealed.
fn assert_one_chain(rows: &[AuditRow]) {
    let mut prev = GENESIS.to_string();
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.seq, i as i64 + 1, "seq gap at {row:?}");
        assert_eq!(row.prev_hash, prev, "broken link at seq {}", row.seq);
        assert_eq!(row.hash, seal(row), "hash of seq {}", row.seq);
        prev.clone_from(&row.hash);
    }
}

fn ids(rows: &[AuditRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

fn is_conflict<T: std::fmt::Debug>(result: &svc::Result<T>) -> bool {
    matches!(result, Err(Error::Conflict(_)))
}

// ---- Store: schema, API keys ----

async fn schema_and_reopen(store: Arc<dyn Store>, db: Db) {
    let name = match db.driver {
        StoreDriver::Sqlite => "sqlite",
        StoreDriver::Postgres => "postgres",
    };
    assert_eq!(store.driver(), name);
    store.ping().await.unwrap();
    let latest = MIGRATIONS.last().unwrap().0;
    assert_eq!(store.schema_version().await.unwrap(), latest);
    store
        .insert_api_key(&key("a", "admin", None))
        .await
        .unwrap();
    drop(store);
    // Opening again applies nothing twice and keeps the data.
    let reopened = db.open().await;
    assert_eq!(reopened.schema_version().await.unwrap(), latest);
    assert_eq!(
        reopened.list_api_keys().await.unwrap(),
        [key("a", "admin", None)]
    );
}

async fn api_keys_round_trip(store: Arc<dyn Store>, _db: Db) {
    // Inserted out of order, listed by id (byte order: "B" before "a").
    for id in ["b", "a", "B"] {
        store
            .insert_api_key(&key(id, "readonly", None))
            .await
            .unwrap();
    }
    let listed: Vec<String> = store
        .list_api_keys()
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(listed, ["B", "a", "b"]);
    assert_eq!(
        store.get_api_key("a").await.unwrap(),
        Some(key("a", "readonly", None))
    );
    assert_eq!(store.get_api_key("zz").await.unwrap(), None);
    assert_eq!(
        store
            .find_api_key_by_hash("hash-b")
            .await
            .unwrap()
            .map(|k| k.id),
        Some("b".into())
    );
    assert_eq!(store.find_api_key_by_hash("nope").await.unwrap(), None);

    store.touch_api_key("a", &at(5)).await.unwrap();
    store.touch_api_key("zz", &at(5)).await.unwrap();
    assert_eq!(
        store.get_api_key("a").await.unwrap().unwrap().last_used_at,
        Some(at(5))
    );

    // None leaves a field as it is.
    let rename = ApiKeyChange {
        name: Some("renamed".into()),
        ..ApiKeyChange::default()
    };
    let KeyWrite::Done(renamed) = store.update_api_key("a", &rename, &at(NOW)).await.unwrap()
    else {
        panic!("rename refused");
    };
    assert_eq!(
        renamed,
        ApiKeyRow {
            name: "renamed".into(),
            last_used_at: Some(at(5)),
            ..key("a", "readonly", None)
        }
    );
    let change = ApiKeyChange {
        role: Some("operator".into()),
        expires_at: Some(at(LATER)),
        ..ApiKeyChange::default()
    };
    let KeyWrite::Done(changed) = store.update_api_key("a", &change, &at(NOW)).await.unwrap()
    else {
        panic!("change refused");
    };
    assert_eq!(
        (
            changed.name.as_str(),
            changed.role.as_str(),
            changed.expires_at.clone()
        ),
        ("renamed", "operator", Some(at(LATER)))
    );
    assert_eq!(store.get_api_key("a").await.unwrap(), Some(changed));
    assert_eq!(
        store.update_api_key("zz", &change, &at(NOW)).await.unwrap(),
        KeyWrite::NotFound
    );

    assert_eq!(
        store.delete_api_key("a", &at(NOW)).await.unwrap(),
        KeyWrite::Done(())
    );
    assert_eq!(
        store.delete_api_key("a", &at(NOW)).await.unwrap(),
        KeyWrite::NotFound
    );
    assert_eq!(store.get_api_key("a").await.unwrap(), None);
    assert_eq!(store.find_api_key_by_hash("hash-a").await.unwrap(), None);
}

async fn the_last_active_admin_key_is_kept(store: Arc<dyn Store>, _db: Db) {
    let now = at(NOW);
    store
        .insert_api_key(&key("live", "admin", None))
        .await
        .unwrap();
    // Expired admins do not count, and an expiry at `now` is already past.
    store
        .insert_api_key(&key("old", "admin", Some(NOW - 1)))
        .await
        .unwrap();
    store
        .insert_api_key(&key("ending", "admin", Some(NOW)))
        .await
        .unwrap();
    store
        .insert_api_key(&key("viewer", "readonly", None))
        .await
        .unwrap();
    let demote = ApiKeyChange {
        role: Some("operator".into()),
        ..ApiKeyChange::default()
    };
    let expire = ApiKeyChange {
        expires_at: Some(at(LATER)),
        ..ApiKeyChange::default()
    };
    let rename = ApiKeyChange {
        name: Some("root".into()),
        ..ApiKeyChange::default()
    };
    let keep_admin = ApiKeyChange {
        role: Some("admin".into()),
        ..ApiKeyChange::default()
    };
    for change in [&demote, &expire] {
        assert_eq!(
            store.update_api_key("live", change, &now).await.unwrap(),
            KeyWrite::LastAdmin
        );
    }
    assert_eq!(
        store.delete_api_key("live", &now).await.unwrap(),
        KeyWrite::LastAdmin
    );
    // Changes that leave it an active admin are fine.
    for change in [&rename, &keep_admin] {
        assert!(matches!(
            store.update_api_key("live", change, &now).await.unwrap(),
            KeyWrite::Done(_)
        ));
    }
    let kept = store.get_api_key("live").await.unwrap().unwrap();
    assert_eq!(
        (kept.name.as_str(), kept.role.as_str(), kept.expires_at),
        ("root", "admin", None)
    );
    // Other keys, expired admins included, change freely.
    for (id, change) in [("old", &demote), ("viewer", &expire), ("ending", &expire)] {
        assert!(matches!(
            store.update_api_key(id, change, &now).await.unwrap(),
            KeyWrite::Done(_)
        ));
    }
    // "ending" now expires LATER: an active admin again, so "live" may go.
    assert!(matches!(
        store.update_api_key("live", &demote, &now).await.unwrap(),
        KeyWrite::Done(_)
    ));
    assert_eq!(
        store.delete_api_key("ending", &now).await.unwrap(),
        KeyWrite::LastAdmin
    );
    // Seen from a later `now`, "ending" has expired: no active admin is left to protect.
    assert_eq!(
        store.delete_api_key("ending", &at(LATER)).await.unwrap(),
        KeyWrite::Done(())
    );
}

async fn concurrent_admin_changes_keep_one_admin(store: Arc<dyn Store>, db: Db) {
    // Two stores: the contenders meet in the database, not in one process's locks.
    let other = db.open().await;
    let now = at(NOW);
    let demote = ApiKeyChange {
        role: Some("readonly".into()),
        ..ApiKeyChange::default()
    };
    let mut survivor: Option<String> = None;
    for round in 0..10 {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        store.insert_api_key(&key(&a, "admin", None)).await.unwrap();
        store.insert_api_key(&key(&b, "admin", None)).await.unwrap();
        if let Some(previous) = survivor.take() {
            assert_eq!(
                store.delete_api_key(&previous, &now).await.unwrap(),
                KeyWrite::Done(())
            );
        }
        // Each takes admin away from one of the last two, at once: one must be refused.
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let demoting = {
            let (store, barrier, a, demote, now) = (
                store.clone(),
                barrier.clone(),
                a.clone(),
                demote.clone(),
                now.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                matches!(
                    store.update_api_key(&a, &demote, &now).await.unwrap(),
                    KeyWrite::Done(_)
                )
            })
        };
        let deleting = {
            let (store, barrier, b, now) = (other.clone(), barrier.clone(), b.clone(), now.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.delete_api_key(&b, &now).await.unwrap() == KeyWrite::Done(())
            })
        };
        let (demoted, deleted) = (demoting.await.unwrap(), deleting.await.unwrap());
        assert!(
            demoted != deleted,
            "round {round}: exactly one may win (demoted {demoted}, deleted {deleted})"
        );
        let admins: Vec<String> = store
            .list_api_keys()
            .await
            .unwrap()
            .into_iter()
            .filter(|k| k.role == "admin")
            .map(|k| k.id)
            .collect();
        assert_eq!(admins.len(), 1, "round {round}: {admins:?}");
        survivor = admins.into_iter().next();
    }
}

// ---- Store: audit ----

async fn audit_appends_link_one_chain(store: Arc<dyn Store>, _db: Db) {
    let first = store
        .append_audit(audit("a"), GENESIS, &seal)
        .await
        .unwrap();
    assert_eq!((first.seq, first.prev_hash.as_str()), (1, GENESIS));
    assert_eq!(first.hash, seal(&first));
    let second = store
        .append_audit(audit("b"), GENESIS, &seal)
        .await
        .unwrap();
    assert_eq!((second.seq, &second.prev_hash), (2, &first.hash));
    assert!(store
        .append_audit_batch(Vec::new(), GENESIS, &seal)
        .await
        .unwrap()
        .is_empty());

    // In a batch, a row the database refuses (its id is taken, by an earlier row or by one
    // of the same batch) stays out of the chain; the next row links to the one before it.
    let results = store
        .append_audit_batch(
            vec![audit("c"), audit("a"), audit("d"), audit("d"), audit("e")],
            GENESIS,
            &seal,
        )
        .await
        .unwrap();
    let outcomes: Vec<Option<i64>> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|r| r.seq))
        .collect();
    assert_eq!(outcomes, [Some(3), None, Some(4), None, Some(5)]);
    let stored: Vec<AuditRow> = results.into_iter().flatten().collect();
    assert_eq!(stored[0].prev_hash, second.hash);
    assert_eq!(stored[1].prev_hash, stored[0].hash);
    assert_eq!(stored[2].prev_hash, stored[1].hash);

    // What append returned is what is stored.
    let chain = whole_chain(store.as_ref()).await;
    assert_eq!(ids(&chain), ["a", "b", "c", "d", "e"]);
    assert_eq!(chain[0], first);
    assert_eq!(chain[2..], stored[..]);
    assert_one_chain(&chain);

    // audit_chain pages strictly after a seq, in chain order.
    assert_eq!(ids(&store.audit_chain(0, 2).await.unwrap()), ["a", "b"]);
    assert_eq!(
        ids(&store.audit_chain(2, 100).await.unwrap()),
        ["c", "d", "e"]
    );
    assert!(store.audit_chain(5, 10).await.unwrap().is_empty());

    let verification = svc::audit::verify(store.as_ref(), &svc::auth::Principal::server())
        .await
        .unwrap();
    assert!(verification.ok, "{verification:?}");
    assert_eq!(verification.rows, 5);
}

/// Seven rows that differ in every filtered column (q6 and q7 share a timestamp).
async fn audit_dataset(store: &dyn Store) {
    #[rustfmt::skip]
    let rows = [
        ("q1", "2026-01-01T00:00:00.000Z", "alice", "apikey.create", "apikey", "success", None, None, "low"),
        ("q2", "2026-01-01T12:00:00.000Z", "bob", "secret.read", "secret", "success", Some("p1"), Some("allow"), "low"),
        ("q3", "2026-01-02T00:00:00.000Z", "alice", "secret.write", "secret", "denied", Some("p1"), Some("deny"), "high"),
        ("q4", "2026-01-02T06:00:00.000Z", "carol", "secretxread", "secret", "success", None, None, "medium"),
        ("q5", "2026-01-02T12:00:00.000Z", "bob", "secret_read", "secret", "failure", Some("p2"), Some("deny"), "critical"),
        ("q6", "2026-01-03T00:00:00.000Z", "alice", "quota.100%", "quota", "success", Some("p2"), Some("allow"), "medium"),
        ("q7", "2026-01-03T00:00:00.000Z", "carol", "apikey.delete", "apikey", "success", None, None, "low"),
    ];
    for (id, timestamp, user, action, resource_type, outcome, policy, decision, severity) in rows {
        let row = AuditRow {
            timestamp: timestamp.into(),
            user: user.into(),
            action: action.into(),
            resource_type: resource_type.into(),
            outcome: outcome.into(),
            policy_id: policy.map(Into::into),
            decision: decision.map(Into::into),
            severity: severity.into(),
            ..audit(id)
        };
        store.append_audit(row, GENESIS, &seal).await.unwrap();
    }
}

async fn audit_query_filters(store: Arc<dyn Store>, _db: Db) {
    audit_dataset(store.as_ref()).await;
    let query = |filter: AuditFilter, limit: usize| {
        let store = store.clone();
        async move {
            let rows = store.query_audit(&filter, limit).await.unwrap();
            rows.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    let all = AuditFilter::default;
    let day = |d: u32| format!("2026-01-{d:02}T00:00:00.000Z");
    let glob = |pattern: &str| AuditFilter {
        action: Some(pattern.into()),
        ..all()
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, AuditFilter, usize, Vec<&str>)> = vec![
        ("none: newest first", all(), 100, vec!["q7", "q6", "q5", "q4", "q3", "q2", "q1"]),
        ("limit", all(), 2, vec!["q7", "q6"]),
        ("since is inclusive", AuditFilter { since: Some(day(2)), ..all() }, 100, vec!["q7", "q6", "q5", "q4", "q3"]),
        ("until is exclusive", AuditFilter { until: Some(day(2)), ..all() }, 100, vec!["q2", "q1"]),
        ("since and until", AuditFilter { since: Some(day(2)), until: Some(day(3)), ..all() }, 100, vec!["q5", "q4", "q3"]),
        ("user", AuditFilter { user: Some("alice".into()), ..all() }, 100, vec!["q6", "q3", "q1"]),
        ("glob prefix", glob("secret.*"), 100, vec!["q3", "q2"]),
        ("glob suffix", glob("*read"), 100, vec!["q5", "q4", "q2"]),
        ("glob inside", glob("api*e"), 100, vec!["q7", "q1"]),
        ("glob exact", glob("apikey.create"), 100, vec!["q1"]),
        ("glob star", glob("*"), 100, vec!["q7", "q6", "q5", "q4", "q3", "q2", "q1"]),
        ("glob: _ is literal", glob("secret_read"), 100, vec!["q5"]),
        ("glob: % is literal", glob("quota.100%"), 100, vec!["q6"]),
        ("glob: % matches nothing else", glob("quota.1%"), 100, vec![]),
        ("resource type", AuditFilter { resource_type: Some("secret".into()), ..all() }, 100, vec!["q5", "q4", "q3", "q2"]),
        ("policy", AuditFilter { policy_id: Some("p1".into()), ..all() }, 100, vec!["q3", "q2"]),
        ("outcome", AuditFilter { outcome: Some("success".into()), ..all() }, 100, vec!["q7", "q6", "q4", "q2", "q1"]),
        ("decision", AuditFilter { decision: Some("deny".into()), ..all() }, 100, vec!["q5", "q3"]),
        ("one severity", AuditFilter { severities: vec!["low".into()], ..all() }, 100, vec!["q7", "q2", "q1"]),
        ("severities", AuditFilter { severities: vec!["high".into(), "critical".into()], ..all() }, 100, vec!["q5", "q3"]),
        ("before_seq", AuditFilter { before_seq: Some(4), ..all() }, 100, vec!["q3", "q2", "q1"]),
        ("user and decision", AuditFilter { user: Some("bob".into()), decision: Some("deny".into()), ..all() }, 100, vec!["q5"]),
        ("type, cursor and limit", AuditFilter { resource_type: Some("secret".into()), before_seq: Some(5), ..all() }, 2, vec!["q4", "q3"]),
        ("no match", AuditFilter { user: Some("nobody".into()), ..all() }, 100, vec![]),
    ];
    for (what, filter, limit, expected) in cases {
        assert_eq!(query(filter, limit).await, expected, "{what}");
    }
}

async fn audit_query_pages_with_before_seq(store: Arc<dyn Store>, _db: Db) {
    let rows: Vec<AuditRow> = (0..25)
        .map(|i| AuditRow {
            user: if i % 2 == 0 { "even" } else { "odd" }.into(),
            ..audit(&format!("r{i:02}"))
        })
        .collect();
    store
        .append_audit_batch(rows, GENESIS, &seal)
        .await
        .unwrap();
    // Walks pages as `svc-audit log` does: the next cursor is the last row's seq.
    let walk = |filter: AuditFilter, page: usize| {
        let store = store.clone();
        async move {
            let mut seen = Vec::new();
            let mut filter = filter;
            loop {
                let rows = store.query_audit(&filter, page).await.unwrap();
                assert!(rows.len() <= page);
                let Some(last) = rows.last() else { break };
                filter.before_seq = Some(last.seq);
                seen.extend(rows.into_iter().map(|r| r.seq));
            }
            seen
        }
    };
    let all: Vec<i64> = (1..=25).rev().collect();
    assert_eq!(walk(AuditFilter::default(), 7).await, all);
    let odd = AuditFilter {
        user: Some("odd".into()),
        ..AuditFilter::default()
    };
    // The odd rows are r01, r03, ...: seq 2, 4, ... 24.
    let evens: Vec<i64> = (1..=12).rev().map(|i| i * 2).collect();
    assert_eq!(walk(odd, 3).await, evens);
}

async fn audit_counts_by_group(store: Arc<dyn Store>, _db: Db) {
    audit_dataset(store.as_ref()).await;
    let count = |filter: AuditFilter, group: AuditGroup| {
        let store = store.clone();
        async move { store.count_audit(&filter, group).await.unwrap() }
    };
    let pairs = |expected: &[(&str, u64)]| -> Vec<(String, u64)> {
        expected.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    };
    let all = AuditFilter::default;
    // Largest first, then by key (byte order: '.' < '_' < 'x').
    #[rustfmt::skip]
    let cases: Vec<(AuditGroup, Vec<(String, u64)>)> = vec![
        (AuditGroup::Action, pairs(&[("apikey.create", 1), ("apikey.delete", 1), ("quota.100%", 1), ("secret.read", 1), ("secret.write", 1), ("secret_read", 1), ("secretxread", 1)])),
        (AuditGroup::Outcome, pairs(&[("success", 5), ("denied", 1), ("failure", 1)])),
        (AuditGroup::Severity, pairs(&[("low", 3), ("medium", 2), ("critical", 1), ("high", 1)])),
        // Rows without a policy count under "".
        (AuditGroup::PolicyId, pairs(&[("", 3), ("p1", 2), ("p2", 2)])),
        (AuditGroup::User, pairs(&[("alice", 3), ("bob", 2), ("carol", 2)])),
        (AuditGroup::Day, pairs(&[("2026-01-02", 3), ("2026-01-01", 2), ("2026-01-03", 2)])),
    ];
    for (group, expected) in cases {
        assert_eq!(count(all(), group).await, expected, "{group:?}");
    }
    let alice = AuditFilter {
        user: Some("alice".into()),
        ..all()
    };
    assert_eq!(
        count(alice, AuditGroup::Severity).await,
        pairs(&[("high", 1), ("low", 1), ("medium", 1)])
    );
    let since = AuditFilter {
        since: Some("2026-01-02T06:00:00.000Z".into()),
        severities: vec!["low".into(), "medium".into()],
        ..all()
    };
    assert_eq!(
        count(since, AuditGroup::Day).await,
        pairs(&[("2026-01-03", 2), ("2026-01-02", 1)])
    );
    // The paging cursor does not narrow counts.
    let cursor = AuditFilter {
        before_seq: Some(2),
        ..all()
    };
    assert_eq!(
        count(cursor, AuditGroup::User).await,
        pairs(&[("alice", 3), ("bob", 2), ("carol", 2)])
    );
    assert!(count(
        AuditFilter {
            user: Some("nobody".into()),
            ..all()
        },
        AuditGroup::Action
    )
    .await
    .is_empty());
}

async fn audit_rows_are_append_only_in_the_database(store: Arc<dyn Store>, db: Db) {
    for id in ["a", "b", "c"] {
        store.append_audit(audit(id), GENESIS, &seal).await.unwrap();
    }
    let before = whole_chain(store.as_ref()).await;
    // Through a plain connection, not the store: the database itself refuses.
    let mut refused = vec![
        "UPDATE audit_events SET outcome = 'denied' WHERE seq = 2",
        "UPDATE audit_events SET prev_hash = hash",
        "DELETE FROM audit_events WHERE seq = 3",
        "DELETE FROM audit_events",
    ];
    if db.driver == StoreDriver::Postgres {
        // Row triggers do not see TRUNCATE; it needs refusing of its own.
        refused.push("TRUNCATE audit_events");
    }
    for sql in refused {
        let result = db.raw(sql).await;
        assert!(result.is_err(), "{sql}: {result:?}");
    }
    assert_eq!(whole_chain(store.as_ref()).await, before);
    // Appending still works, at the end of the same chain.
    store
        .append_audit(audit("d"), GENESIS, &seal)
        .await
        .unwrap();
    assert_one_chain(&whole_chain(store.as_ref()).await);
}

async fn concurrent_appends_from_several_stores_keep_one_chain(store: Arc<dyn Store>, db: Db) {
    const STORES: usize = 4;
    const TASKS: usize = 8;
    const APPENDS: usize = 50;
    let mut stores = vec![store.clone()];
    for _ in 1..STORES {
        stores.push(db.open().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(STORES * TASKS));
    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for t in 0..TASKS {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let id = |i: usize| format!("s{s}-t{t}-{i:02}");
                if t % 2 == 0 {
                    for i in 0..APPENDS {
                        store
                            .append_audit(audit(&id(i)), GENESIS, &seal)
                            .await
                            .unwrap();
                    }
                } else {
                    // Half the tasks append in batches, as the audit committer does.
                    for chunk in (0..APPENDS).collect::<Vec<_>>().chunks(5) {
                        let rows = chunk.iter().map(|&i| audit(&id(i))).collect();
                        for result in store
                            .append_audit_batch(rows, GENESIS, &seal)
                            .await
                            .unwrap()
                        {
                            result.unwrap();
                        }
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let chain = whole_chain(store.as_ref()).await;
    assert_eq!(chain.len(), STORES * TASKS * APPENDS);
    assert_one_chain(&chain);
    let unique: BTreeSet<&str> = ids(&chain).into_iter().collect();
    assert_eq!(unique.len(), chain.len(), "every row once");
    // Each task's own rows are in the order it appended them.
    for s in 0..STORES {
        for t in 0..TASKS {
            let prefix = format!("s{s}-t{t}-");
            let mine: Vec<&str> = ids(&chain)
                .into_iter()
                .filter(|id| id.starts_with(&prefix))
                .collect();
            let mut sorted = mine.clone();
            sorted.sort();
            assert_eq!(mine, sorted, "{prefix}");
        }
    }
    let verification = svc::audit::verify(stores[3].as_ref(), &svc::auth::Principal::server())
        .await
        .unwrap();
    assert!(verification.ok, "{verification:?}");
    assert_eq!(verification.rows, chain.len() as u64);
}

// ---- Store: identity ----

fn ca(id: &str, kind: &str, created: u32) -> CaRow {
    CaRow {
        id: id.into(),
        kind: kind.into(),
        cert_pem: format!("-----BEGIN CERTIFICATE-----\n{id}\n-----END CERTIFICATE-----\n"),
        key_encrypted: format!("sealed-{id}"),
        fingerprint: format!("fp-{id}"),
        not_before: at(created),
        not_after: at(LATER),
        created_at: at(created),
        retired_at: None,
    }
}

async fn ca_insert_retires_the_active_one(store: Arc<dyn Store>, _db: Db) {
    assert!(store.active_ca().await.unwrap().is_empty());
    store.insert_ca(&ca("root", "root", 1)).await.unwrap();
    store.insert_ca(&ca("s1", "signing", 2)).await.unwrap();
    assert_eq!(
        store.active_ca().await.unwrap(),
        [ca("root", "root", 1), ca("s1", "signing", 2)]
    );
    // A new signing CA retires the active one (and only that one) in the same write.
    store.insert_ca(&ca("s2", "signing", 3)).await.unwrap();
    assert_eq!(
        store.active_ca().await.unwrap(),
        [ca("root", "root", 1), ca("s2", "signing", 3)]
    );
    store.update_ca_key("s2", "resealed").await.unwrap();
    store.update_ca_key("gone", "resealed").await.unwrap();
    let s2 = CaRow {
        key_encrypted: "resealed".into(),
        ..ca("s2", "signing", 3)
    };
    assert_eq!(
        store.active_ca().await.unwrap(),
        [ca("root", "root", 1), s2.clone()]
    );
    // A refused insert retires nothing: still exactly one signing CA.
    assert!(store.insert_ca(&ca("s1", "signing", 4)).await.is_err());
    assert_eq!(
        store.active_ca().await.unwrap(),
        [ca("root", "root", 1), s2]
    );
}

/// First starts of several servers on one database: each offers its own root, exactly one
/// is inserted and every other gets that one back.
async fn first_ca_is_inserted_once_under_races(_store: Arc<dyn Store>, db: Db) {
    let mut contenders = Vec::new();
    for i in 0..6 {
        let store = db.open().await;
        contenders.push(tokio::spawn(async move {
            let mine = ca(&format!("root-{i}"), "root", 1);
            (mine.clone(), store.insert_first_ca(&mine).await.unwrap())
        }));
    }
    let mut inserted = Vec::new();
    let mut found = BTreeSet::new();
    for contender in contenders {
        match contender.await.unwrap() {
            (mine, None) => inserted.push(mine),
            (_, Some(theirs)) => {
                found.insert(theirs.id);
            }
        }
    }
    assert_eq!(inserted.len(), 1, "exactly one root is inserted");
    let active = db.open().await.active_ca().await.unwrap();
    assert_eq!(active, inserted);
    assert!(found.iter().all(|id| *id == inserted[0].id), "{found:?}");
    // Only a missing kind is inserted: a signing CA still goes in beside the root.
    let store = db.open().await;
    assert_eq!(
        store.insert_first_ca(&ca("s", "signing", 2)).await.unwrap(),
        None
    );
    assert_eq!(store.active_ca().await.unwrap().len(), 2);
}

fn token(id: &str, created: u32, expires: u32) -> JoinTokenRow {
    JoinTokenRow {
        id: id.into(),
        token_hash: format!("hash-{id}"),
        agent_id: None,
        created_by: "admin".into(),
        created_at: at(created),
        expires_at: at(expires),
        ..JoinTokenRow::default()
    }
}

async fn join_tokens(store: Arc<dyn Store>, _db: Db) {
    let bound = JoinTokenRow {
        agent_id: Some("web-01".into()),
        ..token("t2", 1, LATER)
    };
    store.insert_join_token(&token("t3", 2, NOW)).await.unwrap();
    store.insert_join_token(&bound).await.unwrap();
    store
        .insert_join_token(&token("t1", 1, LATER))
        .await
        .unwrap();
    let listed = store.list_join_tokens().await.unwrap();
    assert_eq!(
        listed,
        [token("t1", 1, LATER), bound.clone(), token("t3", 2, NOW)],
        "by created_at, then id"
    );
    assert_eq!(
        store.find_join_token_by_hash("hash-t2").await.unwrap(),
        Some(bound.clone())
    );
    assert_eq!(store.find_join_token_by_hash("nope").await.unwrap(), None);

    assert!(store.use_join_token("t1", &at(5), "web-02").await.unwrap());
    assert!(!store.use_join_token("t1", &at(6), "web-03").await.unwrap());
    assert!(!store.use_join_token("zz", &at(6), "web-03").await.unwrap());
    let used = store
        .find_join_token_by_hash("hash-t1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (used.used_at, used.used_by),
        (Some(at(5)), Some("web-02".into()))
    );

    let revoked = store.revoke_join_token("t2", &at(7)).await.unwrap();
    let expected = JoinTokenRow {
        revoked_at: Some(at(7)),
        ..bound
    };
    assert_eq!(revoked, Some(expected.clone()));
    // A second revoke keeps the first time; an unknown id is None.
    assert_eq!(
        store.revoke_join_token("t2", &at(8)).await.unwrap(),
        Some(expected)
    );
    assert_eq!(store.revoke_join_token("zz", &at(8)).await.unwrap(), None);
    assert!(
        !store.use_join_token("t2", &at(9), "web-01").await.unwrap(),
        "a revoked token is not used"
    );

    // Revoked and expired (expires_at <= now) go; the used but unexpired one stays.
    assert_eq!(
        store.delete_finished_join_tokens(&at(NOW)).await.unwrap(),
        2
    );
    let left: Vec<String> = store
        .list_join_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(left, ["t1"]);
    assert_eq!(
        store.delete_finished_join_tokens(&at(NOW)).await.unwrap(),
        0
    );
}

async fn a_join_token_is_used_once_under_races(store: Arc<dyn Store>, db: Db) {
    const CONTENDERS: usize = 8;
    let other = db.open().await;
    for round in 0..10 {
        let id = format!("t{round}");
        store
            .insert_join_token(&token(&id, 1, LATER))
            .await
            .unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
        let mut tasks = Vec::new();
        for c in 0..CONTENDERS {
            let store = if c % 2 == 0 {
                store.clone()
            } else {
                other.clone()
            };
            let (barrier, id) = (barrier.clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let who = format!("agent-{c}");
                store
                    .use_join_token(&id, &at(5), &who)
                    .await
                    .unwrap()
                    .then_some(who)
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            winners.extend(task.await.unwrap());
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let stored = store
            .find_join_token_by_hash(&format!("hash-{id}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.used_by.as_ref(), winners.first());
    }
}

fn agent(id: &str, labels: &str) -> AgentRow {
    AgentRow {
        id: id.into(),
        labels: labels.into(),
        fingerprint: format!("fp-{id}"),
        enrolled_at: at(1),
        ..AgentRow::default()
    }
}

async fn agents_and_fleet(store: Arc<dyn Store>, _db: Db) {
    let fleet = store.fleet();
    store.upsert_agent(&agent("web-02", "{}")).await.unwrap();
    store
        .upsert_agent(&agent("web-01", r#"{"role":"web"}"#))
        .await
        .unwrap();
    assert_eq!(
        store.get_agent("web-01").await.unwrap(),
        Some(agent("web-01", r#"{"role":"web"}"#))
    );
    assert_eq!(store.get_agent("zz").await.unwrap(), None);
    let listed: Vec<String> = fleet
        .list_agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(listed, ["web-01", "web-02"]);

    let quarantined = fleet
        .set_quarantine("web-01", true, Some("investigating"), &at(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            quarantined.is_quarantined,
            quarantined.quarantine_reason.as_deref(),
            quarantined.quarantined_at.clone()
        ),
        (true, Some("investigating"), Some(at(5)))
    );
    assert_eq!(
        fleet
            .set_quarantine("zz", true, None, &at(5))
            .await
            .unwrap(),
        None
    );
    fleet
        .record_heartbeats(&[
            ("web-01".into(), at(6)),
            ("web-02".into(), at(7)),
            ("ghost".into(), at(7)),
        ])
        .await
        .unwrap();
    fleet.record_heartbeats(&[]).await.unwrap();

    // Re-enrolment replaces labels, fingerprint and time and keeps everything else.
    let again = AgentRow {
        fingerprint: "fp-new".into(),
        enrolled_at: at(8),
        ..agent("web-01", r#"{"role":"db"}"#)
    };
    store.upsert_agent(&again).await.unwrap();
    let expected = AgentRow {
        is_quarantined: true,
        quarantine_reason: Some("investigating".into()),
        quarantined_at: Some(at(5)),
        last_heartbeat_at: Some(at(6)),
        ..again
    };
    assert_eq!(
        store.get_agent("web-01").await.unwrap(),
        Some(expected.clone())
    );
    assert_eq!(store.get_agent("ghost").await.unwrap(), None);

    // Release clears reason and time whatever the caller passes.
    let released = fleet
        .set_quarantine("web-01", false, Some("ignored"), &at(9))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        released,
        AgentRow {
            is_quarantined: false,
            quarantine_reason: None,
            quarantined_at: None,
            ..expected
        }
    );
    let relabelled = fleet
        .set_labels("web-02", r#"{"role":"cache"}"#)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        relabelled,
        AgentRow {
            last_heartbeat_at: Some(at(7)),
            ..agent("web-02", r#"{"role":"cache"}"#)
        }
    );
    assert_eq!(fleet.set_labels("zz", "{}").await.unwrap(), None);

    // Facts: none until reported; each batch replaces its agents' facts, unknown ids are skipped, and
    // re-enrolment keeps them (the agent reports again when they change).
    assert_eq!(
        store.get_agent("web-02").await.unwrap().unwrap().facts,
        None
    );
    let facts = r#"{"os":"debian","ip_addresses":["10.0.0.5"]}"#;
    fleet
        .record_facts(&[
            ("web-02".into(), r#"{"os":"alpine"}"#.into()),
            ("ghost".into(), "{}".into()),
        ])
        .await
        .unwrap();
    fleet
        .record_facts(&[("web-02".into(), facts.into())])
        .await
        .unwrap();
    fleet.record_facts(&[]).await.unwrap();
    store
        .upsert_agent(&agent("web-02", r#"{"role":"cache"}"#))
        .await
        .unwrap();
    assert_eq!(
        store
            .get_agent("web-02")
            .await
            .unwrap()
            .unwrap()
            .facts
            .as_deref(),
        Some(facts)
    );
    assert_eq!(store.get_agent("ghost").await.unwrap(), None);
    // A new agent enrolled as quarantined is stored so.
    let held = AgentRow {
        is_quarantined: true,
        ..agent("web-03", "{}")
    };
    store.upsert_agent(&held).await.unwrap();
    assert!(
        store
            .get_agent("web-03")
            .await
            .unwrap()
            .unwrap()
            .is_quarantined
    );

    // Applied states: one per agent, replaced by the next.
    let state = AgentStateRow {
        agent_id: "web-01".into(),
        plan: r#"[{"file":"/etc/motd"}]"#.into(),
        job_id: "j1".into(),
        applied_by: "admin".into(),
        applied_at: at(10),
    };
    fleet.put_agent_state(&state).await.unwrap();
    assert_eq!(
        fleet.get_agent_state("web-01").await.unwrap(),
        Some(state.clone())
    );
    let next = AgentStateRow {
        plan: "[]".into(),
        job_id: "j2".into(),
        applied_at: at(11),
        ..state
    };
    fleet.put_agent_state(&next).await.unwrap();
    assert_eq!(fleet.get_agent_state("web-01").await.unwrap(), Some(next));
    assert_eq!(fleet.get_agent_state("web-02").await.unwrap(), None);
}

async fn concurrent_heartbeats_do_not_fail(store: Arc<dyn Store>, db: Db) {
    // Two servers' heartbeat batches over the same agents, in opposite orders: row locks
    // taken in two orders must not deadlock (or fail one batch).
    let other = db.open().await;
    let ids: Vec<String> = (0..50).map(|i| format!("agent-{i:02}")).collect();
    for id in &ids {
        store.upsert_agent(&agent(id, "{}")).await.unwrap();
    }
    for round in 0..20 {
        let forward: Vec<(String, String)> =
            ids.iter().map(|id| (id.clone(), at(round * 2))).collect();
        let backward: Vec<(String, String)> = ids
            .iter()
            .rev()
            .map(|id| (id.clone(), at(round * 2 + 1)))
            .collect();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let one = {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.fleet().record_heartbeats(&forward).await
            })
        };
        let two = {
            let (store, barrier) = (other.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.fleet().record_heartbeats(&backward).await
            })
        };
        one.await.unwrap().unwrap();
        two.await.unwrap().unwrap();
    }
    for row in store.fleet().list_agents().await.unwrap() {
        let seen = row.last_heartbeat_at.unwrap();
        assert!(seen == at(38) || seen == at(39), "{}: {seen}", row.id);
    }
}

fn jwt(id: &str, issued: u32, expires: u32) -> JwtSvidRow {
    JwtSvidRow {
        id: id.into(),
        subject: format!("spiffe://svc/agent/{id}"),
        audience: r#"["db"]"#.into(),
        kid: "fp-s1".into(),
        issued_by: "admin".into(),
        issued_at: at(issued),
        expires_at: at(expires),
        revoked_at: None,
        revoked_by: None,
    }
}

async fn jwt_svids(store: Arc<dyn Store>, _db: Db) {
    let jwts = store.jwts();
    jwts.insert_jwt_svid(&jwt("j3", 3, LATER)).await.unwrap();
    jwts.insert_jwt_svid(&jwt("j1", 1, LATER)).await.unwrap();
    jwts.insert_jwt_svid(&jwt("j2", 2, NOW)).await.unwrap();
    jwts.insert_jwt_svid(&jwt("j0", 3, LATER)).await.unwrap();
    assert_eq!(
        jwts.get_jwt_svid("j1").await.unwrap(),
        Some(jwt("j1", 1, LATER))
    );
    assert_eq!(jwts.get_jwt_svid("zz").await.unwrap(), None);
    // Unexpired: expires_at after now (j2 expires at now), by issued_at then id.
    let unexpired: Vec<String> = jwts
        .list_unexpired_jwt_svids(&at(NOW))
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(unexpired, ["j1", "j0", "j3"]);

    let revoked = jwts.revoke_jwt_svid("j3", &at(6), "admin").await.unwrap();
    let expected = JwtSvidRow {
        revoked_at: Some(at(6)),
        revoked_by: Some("admin".into()),
        ..jwt("j3", 3, LATER)
    };
    assert_eq!(revoked, Some(expected.clone()));
    assert_eq!(
        jwts.revoke_jwt_svid("j3", &at(7), "someone").await.unwrap(),
        Some(expected),
        "the first revocation stays"
    );
    assert_eq!(
        jwts.revoke_jwt_svid("zz", &at(7), "admin").await.unwrap(),
        None
    );
    jwts.revoke_jwt_svid("j1", &at(5), "admin").await.unwrap();
    jwts.revoke_jwt_svid("j2", &at(5), "admin").await.unwrap();
    // Revoked and not yet expired, by revocation time then id.
    let listed: Vec<String> = jwts
        .list_revoked_jwt_svids(&at(NOW))
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(listed, ["j1", "j3"]);
    assert!(jwts
        .list_revoked_jwt_svids(&at(LATER))
        .await
        .unwrap()
        .is_empty());
}

// ---- SecretStore ----

async fn master_check(store: Arc<dyn Store>, db: Db) {
    let secrets = store.secrets();
    assert_eq!(secrets.master_check().await.unwrap(), None);
    // Two first starts at once: both end up with the one value stored.
    let other = db.open().await;
    let (a, b) = tokio::join!(
        tokio::spawn({
            let store = store.clone();
            async move { store.secrets().init_master_check("check-a", &at(1)).await }
        }),
        tokio::spawn(async move { other.secrets().init_master_check("check-b", &at(1)).await }),
    );
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_eq!(a, b);
    assert!(a == "check-a" || a == "check-b", "{a}");
    assert_eq!(secrets.master_check().await.unwrap(), Some(a.clone()));
    assert_eq!(
        secrets.init_master_check("check-c", &at(2)).await.unwrap(),
        a
    );
}

fn secret(path: &str, version: i64, at_: u32) -> (SecretRow, SecretVersionRow) {
    (
        SecretRow {
            path: path.into(),
            wrapped_key: format!("wrapped-{path}"),
            current_version: version,
            created_at: at(1),
            updated_at: at(at_),
        },
        SecretVersionRow {
            path: path.into(),
            version,
            ciphertext: format!("ct-{path}-{version}"),
            created_at: at(at_),
            deleted_at: None,
            is_destroyed: false,
        },
    )
}

async fn write(store: &dyn Store, path: &str, version: i64, at_: u32) -> svc::Result<()> {
    let (row, version) = secret(path, version, at_);
    store.secrets().write_secret_version(&row, &version).await
}

async fn secret_versions(store: Arc<dyn Store>, _db: Db) {
    let secrets = store.secrets();
    assert_eq!(secrets.get_secret("app/db").await.unwrap(), None);
    // Version 1 creates; anything but current + 1 is a conflict.
    write(store.as_ref(), "app/db", 1, 2).await.unwrap();
    assert!(is_conflict(&write(store.as_ref(), "app/db", 1, 3).await));
    assert!(is_conflict(&write(store.as_ref(), "app/db", 3, 3).await));
    assert!(is_conflict(&write(store.as_ref(), "new/one", 2, 3).await));
    assert_eq!(secrets.get_secret("new/one").await.unwrap(), None);
    write(store.as_ref(), "app/db", 2, 4).await.unwrap();
    write(store.as_ref(), "app/db", 3, 5).await.unwrap();
    assert_eq!(
        secrets.get_secret("app/db").await.unwrap(),
        Some(SecretRow {
            current_version: 3,
            updated_at: at(5),
            ..secret("app/db", 1, 2).0
        })
    );
    assert_eq!(
        secrets.get_secret_version("app/db", 2).await.unwrap(),
        Some(secret("app/db", 2, 4).1)
    );
    assert_eq!(secrets.get_secret_version("app/db", 9).await.unwrap(), None);
    let versions: Vec<i64> = secrets
        .secret_versions("app/db")
        .await
        .unwrap()
        .iter()
        .map(|v| v.version)
        .collect();
    assert_eq!(versions, [1, 2, 3]);
    assert!(secrets.secret_versions("zz").await.unwrap().is_empty());

    // Soft delete counts only what changed; updated_at follows.
    assert_eq!(
        secrets
            .delete_secret_versions("app/db", &[1, 3, 9], &at(6))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        secrets
            .delete_secret_versions("app/db", &[1], &at(7))
            .await
            .unwrap(),
        0
    );
    let v1 = secrets
        .get_secret_version("app/db", 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (v1.deleted_at, v1.ciphertext),
        (Some(at(6)), "ct-app/db-1".into())
    );
    assert_eq!(
        secrets
            .get_secret("app/db")
            .await
            .unwrap()
            .unwrap()
            .updated_at,
        at(7)
    );
    // Destroy erases the ciphertext, keeps a deletion time already set, and counts each once.
    assert_eq!(
        secrets
            .destroy_secret_versions("app/db", &[1, 2], &at(8))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        secrets
            .destroy_secret_versions("app/db", &[2], &at(9))
            .await
            .unwrap(),
        0
    );
    let destroyed = secrets.secret_versions("app/db").await.unwrap();
    let summary: Vec<(i64, &str, Option<String>, bool)> = destroyed
        .iter()
        .map(|v| {
            (
                v.version,
                v.ciphertext.as_str(),
                v.deleted_at.clone(),
                v.is_destroyed,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "", Some(at(6)), true),
            (2, "", Some(at(8)), true),
            (3, "ct-app/db-3", Some(at(6)), false),
        ]
    );
    assert_eq!(
        secrets
            .delete_secret_versions("app/db", &[2], &at(10))
            .await
            .unwrap(),
        0,
        "a destroyed version is not deleted again"
    );

    // Listing: by path in byte order, prefixes literal, with the current version's deletion.
    for path in ["app/web", "App/x", "a_b/x", "axb/y", "a%c/z"] {
        write(store.as_ref(), path, 1, 11).await.unwrap();
    }
    let list = |prefix: &'static str| {
        let store = store.clone();
        async move {
            store
                .secrets()
                .list_secrets(prefix)
                .await
                .unwrap()
                .into_iter()
                .map(|(s, deleted)| (s.path, deleted))
                .collect::<Vec<_>>()
        }
    };
    let live = |path: &str| (path.to_string(), None);
    assert_eq!(
        list("").await,
        [
            live("App/x"),
            live("a%c/z"),
            live("a_b/x"),
            ("app/db".into(), Some(at(6))),
            live("app/web"),
            live("axb/y"),
        ]
    );
    assert_eq!(
        list("app/").await,
        [("app/db".into(), Some(at(6))), live("app/web")]
    );
    assert_eq!(list("a_b").await, [live("a_b/x")]);
    assert_eq!(list("a%").await, [live("a%c/z")]);
    assert!(list("zz").await.is_empty());

    assert!(secrets.destroy_secret("app/db").await.unwrap());
    assert!(!secrets.destroy_secret("app/db").await.unwrap());
    assert_eq!(secrets.get_secret("app/db").await.unwrap(), None);
    assert!(secrets.secret_versions("app/db").await.unwrap().is_empty());
    // The path starts over at version 1.
    write(store.as_ref(), "app/db", 1, 12).await.unwrap();
}

async fn concurrent_secret_writes_conflict(store: Arc<dyn Store>, db: Db) {
    const WRITERS: usize = 6;
    let other = db.open().await;
    for (round, version) in [(0, 1), (1, 2), (2, 3)] {
        // Every writer read version - 1 and writes `version`: exactly one may succeed.
        let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let store = if w % 2 == 0 {
                store.clone()
            } else {
                other.clone()
            };
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let (row, mut version_row) = secret("race/x", version, 5);
                version_row.ciphertext = format!("writer-{w}");
                store
                    .secrets()
                    .write_secret_version(&row, &version_row)
                    .await
            }));
        }
        let mut won = Vec::new();
        for (w, task) in tasks.into_iter().enumerate() {
            match task.await.unwrap() {
                Ok(()) => won.push(w),
                Err(Error::Conflict(_)) => {}
                Err(e) => panic!("round {round}, writer {w}: {e:?}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        let stored = store
            .secrets()
            .get_secret_version("race/x", version)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.ciphertext, format!("writer-{}", won[0]));
        assert_eq!(
            store
                .secrets()
                .get_secret("race/x")
                .await
                .unwrap()
                .unwrap()
                .current_version,
            version
        );
    }
}

async fn rotate_master_is_all_or_nothing(store: Arc<dyn Store>, _db: Db) {
    let secrets = store.secrets();
    secrets.init_master_check("check", &at(1)).await.unwrap();
    write(store.as_ref(), "a/one", 1, 2).await.unwrap();
    write(store.as_ref(), "a/one", 2, 3).await.unwrap();
    write(store.as_ref(), "b/two", 1, 2).await.unwrap();
    let (key, first) = transit("k", 1);
    secrets.insert_transit_key(&key, &first).await.unwrap();
    secrets
        .add_transit_version(&transit("k", 2).1, &at(3))
        .await
        .unwrap();
    store.insert_ca(&ca("s1", "signing", 1)).await.unwrap();
    secrets
        .init_data_key("at-rest", "dk", &at(3))
        .await
        .unwrap();

    let snapshot = || {
        let store = store.clone();
        async move {
            let s = store.secrets();
            (
                s.master_check().await.unwrap(),
                s.get_secret("a/one").await.unwrap().unwrap().wrapped_key,
                s.get_secret("b/two").await.unwrap().unwrap().wrapped_key,
                s.transit_key_versions("k")
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|v| v.material)
                    .collect::<Vec<_>>(),
                s.data_key("at-rest").await.unwrap(),
            )
        }
    };
    let before = snapshot().await;

    // A failure part way (the third value) changes nothing, and its error comes back as is.
    let calls = Mutex::new(0);
    let failing = |_: Wrapped<'_>, old: &str| {
        let mut calls = calls.lock().unwrap();
        *calls += 1;
        if *calls == 3 {
            return Err(Error::Invalid("cannot unwrap".into()));
        }
        Ok(format!("new:{old}"))
    };
    let result = secrets.rotate_master(&failing, &at(4)).await;
    assert!(
        matches!(&result, Err(Error::Invalid(m)) if m == "cannot unwrap"),
        "{result:?}"
    );
    assert_eq!(snapshot().await, before);

    // Success re-wraps every wrapped value once: the check, each data key, each transit
    // version (not the values themselves, and not the CA keys: those are `update_ca_key`).
    let seen = Mutex::new(BTreeSet::new());
    let rewrap = |what: Wrapped<'_>, old: &str| {
        let name = match what {
            Wrapped::MasterCheck => "check".to_string(),
            Wrapped::SecretKey { path } => format!("secret {path}"),
            Wrapped::TransitKey { name, version } => format!("transit {name} v{version}"),
            Wrapped::DataKey { name } => format!("data {name}"),
        };
        assert!(seen.lock().unwrap().insert(name), "re-wrapped twice");
        Ok(format!("new:{old}"))
    };
    assert_eq!(secrets.rotate_master(&rewrap, &at(5)).await.unwrap(), 6);
    assert_eq!(
        seen.into_inner().unwrap().into_iter().collect::<Vec<_>>(),
        [
            "check",
            "data at-rest",
            "secret a/one",
            "secret b/two",
            "transit k v1",
            "transit k v2"
        ]
    );
    let (check, one, two, material, data_key) = before;
    assert_eq!(
        snapshot().await,
        (
            check.map(|c| format!("new:{c}")),
            format!("new:{one}"),
            format!("new:{two}"),
            material.iter().map(|m| format!("new:{m}")).collect(),
            data_key.map(|k| format!("new:{k}")),
        )
    );
    assert_eq!(
        secrets.get_secret_version("a/one", 2).await.unwrap(),
        Some(secret("a/one", 2, 3).1)
    );
    assert_eq!(store.active_ca().await.unwrap(), [ca("s1", "signing", 1)]);
}

fn transit(name: &str, version: i64) -> (TransitKeyRow, TransitVersionRow) {
    (
        TransitKeyRow {
            name: name.into(),
            key_type: "aes256-gcm96".into(),
            latest_version: version,
            min_decryption_version: 1,
            created_at: at(1),
            updated_at: at(1),
        },
        TransitVersionRow {
            name: name.into(),
            version,
            material: format!("material-{name}-{version}"),
            public_key: String::new(),
            created_at: at(version as u32),
        },
    )
}

async fn transit_keys(store: Arc<dyn Store>, db: Db) {
    let secrets = store.secrets();
    let (key, first) = transit("orders", 1);
    secrets.insert_transit_key(&key, &first).await.unwrap();
    // A second create is a conflict and adds no version.
    let (again, other_first) = transit("orders", 1);
    let refused = secrets
        .insert_transit_key(
            &again,
            &TransitVersionRow {
                material: "other".into(),
                ..other_first
            },
        )
        .await;
    assert!(is_conflict(&refused), "{refused:?}");
    assert_eq!(
        secrets.transit_key_versions("orders").await.unwrap(),
        std::slice::from_ref(&first)
    );
    let (signing, signing_first) = transit("Release", 1);
    let signing = TransitKeyRow {
        key_type: "ed25519".into(),
        ..signing
    };
    let signing_first = TransitVersionRow {
        public_key: "pub".into(),
        ..signing_first
    };
    secrets
        .insert_transit_key(&signing, &signing_first)
        .await
        .unwrap();
    assert_eq!(
        secrets.list_transit_keys().await.unwrap(),
        [signing.clone(), key.clone()],
        "by name, byte order"
    );
    assert_eq!(secrets.get_transit_key("zz").await.unwrap(), None);

    secrets
        .add_transit_version(&transit("orders", 2).1, &at(9))
        .await
        .unwrap();
    for version in [2, 4] {
        let result = secrets
            .add_transit_version(&transit("orders", version).1, &at(9))
            .await;
        assert!(is_conflict(&result), "v{version}: {result:?}");
    }
    let result = secrets
        .add_transit_version(&transit("zz", 2).1, &at(9))
        .await;
    assert!(is_conflict(&result), "unknown key: {result:?}");
    assert_eq!(
        secrets.get_transit_key("orders").await.unwrap(),
        Some(TransitKeyRow {
            latest_version: 2,
            updated_at: at(9),
            ..key.clone()
        })
    );
    assert_eq!(
        secrets.transit_key_versions("orders").await.unwrap(),
        [first, transit("orders", 2).1]
    );
    assert!(secrets
        .set_transit_min_decryption("orders", 2, &at(10))
        .await
        .unwrap());
    assert!(!secrets
        .set_transit_min_decryption("zz", 2, &at(10))
        .await
        .unwrap());
    let stored = secrets.get_transit_key("orders").await.unwrap().unwrap();
    assert_eq!(
        (stored.min_decryption_version, stored.updated_at),
        (2, at(10))
    );

    // Two rotations at once from two stores: one version 3, one conflict.
    let other = db.open().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let rotate = |store: Arc<dyn Store>, material: &'static str| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            barrier.wait().await;
            let version = TransitVersionRow {
                material: material.into(),
                ..transit("orders", 3).1
            };
            store.secrets().add_transit_version(&version, &at(11)).await
        })
    };
    let (a, b) = (rotate(store.clone(), "a"), rotate(other, "b"));
    let results = [a.await.unwrap(), b.await.unwrap()];
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(results.iter().any(is_conflict), "{results:?}");
    assert_eq!(
        secrets.transit_key_versions("orders").await.unwrap().len(),
        3
    );
}

fn lease(id: &str, expires: u32) -> LeaseRow {
    LeaseRow {
        id: id.into(),
        path: "postgres/creds".into(),
        backend: "postgres".into(),
        backend_data: format!(r#"{{"role":"{id}"}}"#),
        created_at: at(1),
        expires_at: at(expires),
        max_expires_at: at(LATER),
        is_renewable: true,
        revoked_at: None,
        last_error: None,
    }
}

async fn leases(store: Arc<dyn Store>, _db: Db) {
    let secrets = store.secrets();
    let fixed = LeaseRow {
        is_renewable: false,
        ..lease("other/x", 40)
    };
    secrets
        .insert_lease(&lease("postgres/creds/b", 30))
        .await
        .unwrap();
    secrets
        .insert_lease(&lease("postgres/creds/a", 50))
        .await
        .unwrap();
    secrets.insert_lease(&fixed).await.unwrap();
    secrets
        .insert_lease(&lease("postgres_creds", 60))
        .await
        .unwrap();
    assert_eq!(
        secrets.get_lease("other/x").await.unwrap(),
        Some(fixed.clone())
    );
    assert_eq!(secrets.get_lease("zz").await.unwrap(), None);
    let list = |prefix: &'static str| {
        let store = store.clone();
        async move {
            store
                .secrets()
                .list_leases(prefix)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        list("postgres/").await,
        ["postgres/creds/a", "postgres/creds/b"]
    );
    assert_eq!(
        list("postgres_").await,
        ["postgres_creds"],
        "prefix is literal"
    );
    assert_eq!(list("").await.len(), 4);

    assert!(secrets
        .set_lease_expiry("postgres/creds/a", &at(20))
        .await
        .unwrap());
    assert!(!secrets.set_lease_expiry("zz", &at(20)).await.unwrap());
    secrets
        .set_lease_error("postgres/creds/b", "connection refused")
        .await
        .unwrap();
    assert_eq!(
        secrets
            .get_lease("postgres/creds/b")
            .await
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("connection refused")
    );
    // Expired: unrevoked with expires_at <= now, soonest first, at most `limit`.
    let expired = |now: u32, limit: usize| {
        let store = store.clone();
        async move {
            store
                .secrets()
                .expired_leases(&at(now), limit)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        expired(40, 10).await,
        ["postgres/creds/a", "postgres/creds/b", "other/x"]
    );
    assert_eq!(expired(40, 1).await, ["postgres/creds/a"]);
    assert!(expired(10, 10).await.is_empty());

    // Revocation clears the error, happens once, and takes the lease out of lists.
    assert!(secrets
        .mark_lease_revoked("postgres/creds/b", &at(41))
        .await
        .unwrap());
    assert!(!secrets
        .mark_lease_revoked("postgres/creds/b", &at(42))
        .await
        .unwrap());
    assert!(!secrets.mark_lease_revoked("zz", &at(42)).await.unwrap());
    let revoked = secrets
        .get_lease("postgres/creds/b")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        revoked,
        LeaseRow {
            revoked_at: Some(at(41)),
            last_error: None,
            ..lease("postgres/creds/b", 30)
        }
    );
    assert!(!secrets
        .set_lease_expiry("postgres/creds/b", &at(90))
        .await
        .unwrap());
    assert_eq!(list("postgres/").await, ["postgres/creds/a"]);
    assert_eq!(expired(40, 10).await, ["postgres/creds/a", "other/x"]);
}

// ---- Errors ----

async fn unique_violations_are_conflicts(store: Arc<dyn Store>, _db: Db) {
    // Every duplicate primary key or unique column is `Conflict`, on either driver, and
    // leaves the store usable (no connection stuck in a failed transaction).
    store
        .insert_api_key(&key("a", "admin", None))
        .await
        .unwrap();
    let same_id = ApiKeyRow {
        key_hash: "other".into(),
        ..key("a", "admin", None)
    };
    let same_hash = ApiKeyRow {
        id: "b".into(),
        ..key("a", "admin", None)
    };
    for row in [&same_id, &same_hash] {
        let result = store.insert_api_key(row).await;
        assert!(is_conflict(&result), "api key {row:?}: {result:?}");
    }

    store
        .insert_join_token(&token("t1", 1, LATER))
        .await
        .unwrap();
    let same_hash = JoinTokenRow {
        id: "t2".into(),
        ..token("t1", 1, LATER)
    };
    for row in [&token("t1", 2, LATER), &same_hash] {
        let result = store.insert_join_token(row).await;
        assert!(is_conflict(&result), "join token {row:?}: {result:?}");
    }

    store.insert_ca(&ca("c1", "root", 1)).await.unwrap();
    let result = store.insert_ca(&ca("c1", "root", 2)).await;
    assert!(is_conflict(&result), "ca: {result:?}");

    store
        .jwts()
        .insert_jwt_svid(&jwt("j1", 1, LATER))
        .await
        .unwrap();
    let result = store.jwts().insert_jwt_svid(&jwt("j1", 2, LATER)).await;
    assert!(is_conflict(&result), "jwt: {result:?}");

    store.secrets().insert_lease(&lease("l1", 5)).await.unwrap();
    let result = store.secrets().insert_lease(&lease("l1", 6)).await;
    assert!(is_conflict(&result), "lease: {result:?}");

    let (key_row, first) = transit("k", 1);
    store
        .secrets()
        .insert_transit_key(&key_row, &first)
        .await
        .unwrap();
    let result = store.secrets().insert_transit_key(&key_row, &first).await;
    assert!(is_conflict(&result), "transit: {result:?}");

    store
        .append_audit(audit("e1"), GENESIS, &seal)
        .await
        .unwrap();
    let results = store
        .append_audit_batch(vec![audit("e1"), audit("e2")], GENESIS, &seal)
        .await
        .unwrap();
    assert!(is_conflict(&results[0]), "audit: {:?}", results[0]);
    assert!(results[1].is_ok(), "{:?}", results[1]);

    // Still usable, many times over (more than any pool holds connections).
    for i in 0..40 {
        store
            .insert_api_key(&key(&format!("after-{i:02}"), "readonly", None))
            .await
            .unwrap();
    }
    assert_eq!(store.list_api_keys().await.unwrap().len(), 41);
}

// ---- PostgreSQL only: connecting ----

/// Servers starting together on an empty database: each applies the migrations it finds
/// missing under the advisory lock, so every migration is applied exactly once.
#[test]
fn postgres_first_starts_together_migrate_once() {
    let Some(postgres) = common::postgres::shared() else {
        return;
    };
    let url = postgres.fresh_database();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut starts = Vec::new();
        for _ in 0..6 {
            let target = svc::store::postgres::Target::from_url(&url).unwrap();
            starts.push(tokio::spawn(async move {
                svc::store::PostgresStore::open(&target).await.map(|_| ())
            }));
        }
        for start in starts {
            start.await.unwrap().expect("every start succeeds");
        }
        let target = svc::store::postgres::Target::from_url(&url).unwrap();
        let client = target.connect().await.unwrap();
        let rows: i64 = client
            .query_one("SELECT COUNT(*) FROM schema_version", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows as usize, MIGRATIONS.len());
    });
}

/// TLS to PostgreSQL: `verify-full` checks the chain and the host name, `require` encrypts
/// without checking, `disable` does not encrypt; the server's own view (pg_stat_ssl) says
/// which. The login binds to the TLS session (channel_binding=require).
#[test]
fn postgres_tls_modes() {
    let Some(postgres) = common::postgres::Postgres::start() else {
        return;
    };
    let pki = common::pki::Pki::new();
    postgres.enable_tls(&pki.path("server.pem"), &pki.path("server.key"));
    let url = postgres.fresh_database();
    let ca = pki.path("ca.pem").display().to_string();
    let other = common::pki::Pki::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let encrypted = |sslmode: &'static str, ca: String, url: String| async move {
            let target = svc::store::postgres::Target::new(
                &url,
                sslmode,
                &ca,
                4,
                std::time::Duration::from_secs(10),
            )?;
            let client = target.connect().await?;
            let row = client
                .query_one(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await
                .map_err(svc::Error::from)?;
            Ok::<bool, svc::Error>(row.get(0))
        };
        let bound = format!("{url}?channel_binding=require");
        assert!(encrypted("verify-full", ca.clone(), bound.clone())
            .await
            .unwrap());
        assert!(encrypted("require", String::new(), bound.clone())
            .await
            .unwrap());
        assert!(encrypted("prefer", String::new(), url.clone())
            .await
            .unwrap());
        assert!(!encrypted("disable", String::new(), url.clone())
            .await
            .unwrap());
        // The CA file may come in the URL, as libpq's sslrootcert.
        let in_url = format!("{url}?sslmode=verify-full&sslrootcert={ca}");
        assert!(encrypted("", String::new(), in_url).await.unwrap());
        // Another CA's certificate, or a name the certificate does not carry: refused, and
        // the message names the server but never the password.
        let wrong_ca = other.path("ca.pem").display().to_string();
        let error = encrypted("verify-full", wrong_ca, url.clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("cannot connect to PostgreSQL at 127.0.0.1:"),
            "{error}"
        );
        assert!(!error.contains("admin-pw"), "{error}");
        let wrong_name = url.replace("@127.0.0.1:", "@127.0.0.2:");
        assert!(encrypted("verify-full", ca.clone(), wrong_name)
            .await
            .is_err());

        // The whole store over verify-full.
        let config = StoreConfig {
            driver: StoreDriver::Postgres,
            url: Secret(url.clone()),
            sslmode: "verify-full".into(),
            ca_file: ca.clone(),
            ..StoreConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let store = svc::store::open(&config, dir.path()).await.unwrap();
        store.ping().await.unwrap();
        assert_eq!(
            store.schema_version().await.unwrap(),
            MIGRATIONS.last().unwrap().0
        );
    });
}

/// Bad settings are refused before any connection, naming the setting.
#[test]
fn postgres_settings_are_checked() {
    for (url, sslmode, ca_file, problem) in [
        ("", "", "", "store.url is empty"),
        ("http://x/y", "", "", "must start with postgres://"),
        (
            "postgres://u@h/d",
            "verify-ca",
            "",
            "store.sslmode: 'verify-ca'",
        ),
        (
            "postgres://u@h/d",
            "verify-full",
            "/no/such/ca.pem",
            "store.ca_file",
        ),
        ("postgres://u@h:notaport/d", "", "", "not a PostgreSQL URL"),
    ] {
        let error = svc::store::postgres::Target::new(
            url,
            sslmode,
            ca_file,
            4,
            std::time::Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains(problem), "{url} {sslmode}: {error}");
    }
}

/// An unreachable server fails the open within the connect timeout, with a clear message.
#[test]
fn postgres_unreachable_fails_clearly() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = StoreConfig {
        driver: StoreDriver::Postgres,
        url: Secret(format!("postgres://svc:hunter2@127.0.0.1:{port}/svc")),
        ..StoreConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let error = match runtime.block_on(svc::store::open(&config, dir.path())) {
        Ok(_) => panic!("opened a store on a closed port"),
        Err(e) => e,
    };
    assert!(matches!(error, Error::Unavailable(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{port}/svc"
        )),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

/// PostgreSQL going away under a running server: readiness says so within its bound (not after
/// the pool's connect timeout), and requests get 503 `unavailable`, not a hang or a 500.
#[test]
fn postgres_going_away_makes_the_server_unready() {
    let Some(postgres) = common::postgres::Postgres::start() else {
        return;
    };
    let url = postgres.fresh_database();
    let server = common::TestServer::start_with(common::Options {
        config_yaml: format!(
            "store: {{ driver: postgres, url: \"{url}\", connect_timeout: 20s }}\n"
        ),
        ..common::Options::default()
    });
    let (_, key) = server.create_key("before", "readonly");
    assert_eq!(
        server.request("GET", "/health/ready", None, None).status,
        200
    );
    drop(postgres);

    let started = std::time::Instant::now();
    let ready = server.request("GET", "/health/ready", None, None);
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(ready.body.contains("postgres store"), "{}", ready.body);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "readiness took {:?}",
        started.elapsed()
    );
    let listed = server.request("GET", "/api/v1/apikeys", Some(&key), None);
    assert_eq!(listed.status, 503, "{}", listed.body);
    assert!(listed.body.contains("unavailable"), "{}", listed.body);
    assert!(!listed.body.contains("admin-pw"), "{}", listed.body);
}

/// A wrong password is `Unauthenticated` (the operator's to fix; svc-migrate exits 4), with
/// neither password in the message.
#[test]
fn postgres_wrong_password_is_unauthenticated() {
    let Some(postgres) = common::postgres::shared() else {
        return;
    };
    let url = postgres.fresh_database();
    let Some((scheme_user, rest)) = url.split_once(':').and_then(|(scheme, rest)| {
        let rest = rest.strip_prefix("//")?;
        let (user, after) = rest.split_once(':')?;
        let (_, host) = after.split_once('@')?;
        Some((format!("{scheme}://{user}"), host.to_string()))
    }) else {
        panic!("unexpected URL shape");
    };
    let wrong = format!("{scheme_user}:not-the-password@{rest}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let target = svc::store::postgres::Target::from_url(&wrong).unwrap();
    let error = runtime.block_on(target.connect()).map(|_| ()).unwrap_err();
    assert!(matches!(error, Error::Unauthenticated(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("refused the login"), "{message}");
    assert!(!message.contains("not-the-password"), "{message}");
}

// ---- Blueprints ----

async fn blueprint_tables(store: Arc<dyn Store>, _db: Db) {
    use svc::store::{BlueprintAgentRow, BlueprintApplyRow, BlueprintRow};
    let blueprints = store.blueprints();
    let version = |name: &str, version: &str, n: u32| BlueprintRow {
        name: name.into(),
        version: version.into(),
        description: "d".into(),
        sha256: "00".into(),
        manifest: "{}".into(),
        bundle: "AA==".into(),
        installed_by: "ops".into(),
        installed_at: at(n),
    };
    let not_yet = blueprints
        .insert_blueprint(&version("web", "1.0.0", 1), true)
        .await;
    assert!(matches!(not_yet, Err(Error::NotFound(_))), "{not_yet:?}");
    let insert = |row: svc::store::BlueprintRow, is_update: bool| {
        let store = store.clone();
        async move { store.blueprints().insert_blueprint(&row, is_update).await }
    };
    insert(version("web", "1.0.0", 1), false).await.unwrap();
    let twice = insert(version("web", "1.1.0", 1), false).await;
    assert!(
        is_conflict(&twice),
        "install of an installed name: {twice:?}"
    );
    insert(version("web", "2.0.0", 2), true).await.unwrap();
    let older = insert(version("web", "1.5.0", 2), true).await;
    assert!(is_conflict(&older), "an update must be newer: {older:?}");
    let again = insert(version("web", "2.0.0", 4), true).await;
    assert!(is_conflict(&again), "{again:?}");
    insert(version("db", "1.0.0", 3), false).await.unwrap();
    let web = blueprints.list_blueprints(Some("web")).await.unwrap();
    assert_eq!(web.len(), 2);
    assert_eq!(web[0], version("web", "1.0.0", 1));
    assert_eq!(blueprints.list_blueprints(None).await.unwrap().len(), 3);

    let apply = |id: &str, v: &str, n: u32| BlueprintApplyRow {
        id: id.into(),
        name: "web".into(),
        version: v.into(),
        kind: "apply".into(),
        target: "*".into(),
        parameters: "{}".into(),
        plan: "{\"resources\":[]}".into(),
        results: "[]".into(),
        applied_by: "ops".into(),
        applied_at: at(n),
    };
    let on = |agent: &str, apply_id: &str, v: &str| BlueprintAgentRow {
        name: "web".into(),
        agent_id: agent.into(),
        version: v.into(),
        apply_id: apply_id.into(),
        status: "changed".into(),
        applied_at: at(9),
    };
    blueprints
        .record_blueprint_apply(
            &apply("A1", "1.0.0", 5),
            &[on("a", "A1", "1.0.0"), on("b", "A1", "1.0.0")],
        )
        .await
        .unwrap();
    blueprints
        .record_blueprint_apply(&apply("A2", "2.0.0", 6), &[on("a", "A2", "2.0.0")])
        .await
        .unwrap();
    let applies = blueprints.list_blueprint_applies("web").await.unwrap();
    let order: Vec<&str> = applies.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(order, ["A2", "A1"], "newest first");
    let agents = blueprints.list_blueprint_agents().await.unwrap();
    assert_eq!(agents, [on("a", "A2", "2.0.0"), on("b", "A1", "1.0.0")]);

    assert_eq!(blueprints.delete_blueprint("web").await.unwrap(), 2);
    assert!(blueprints.list_blueprint_agents().await.unwrap().is_empty());
    assert_eq!(
        blueprints
            .list_blueprint_applies("web")
            .await
            .unwrap()
            .len(),
        2,
        "records stay"
    );
    assert_eq!(blueprints.list_blueprints(None).await.unwrap().len(), 1);
}

/// Migration 0012's parts: the data key stored once, key rows from before it converted once,
/// clear plans found and sealed unless changed meanwhile, and (PostgreSQL) the shared nonces.
async fn sealed_at_rest(store: Arc<dyn Store>, db: Db) {
    let secrets = store.secrets();
    assert_eq!(secrets.data_key("at-rest").await.unwrap(), None);
    assert_eq!(
        secrets
            .init_data_key("at-rest", "first", &at(1))
            .await
            .unwrap(),
        "first"
    );
    assert_eq!(
        secrets
            .init_data_key("at-rest", "second", &at(2))
            .await
            .unwrap(),
        "first",
        "a later start keeps the stored key"
    );

    let legacy = ApiKeyRow {
        signing_sealed: None,
        ..key("old", "admin", None)
    };
    store.insert_api_key(&legacy).await.unwrap();
    assert!(!store
        .seal_api_key("old", "wrong-hash", "new-hash", "sealed")
        .await
        .unwrap());
    assert!(store
        .seal_api_key("old", "hash-old", "new-hash", "sealed")
        .await
        .unwrap());
    assert!(
        !store
            .seal_api_key("old", "new-hash", "newer", "again")
            .await
            .unwrap(),
        "converted once"
    );
    let row = store.get_api_key("old").await.unwrap().unwrap();
    assert_eq!(
        (row.key_hash.as_str(), row.signing_sealed.as_deref()),
        ("new-hash", Some("sealed"))
    );

    for (agent, plan) in [("a1", "{\"resources\":[1]}"), ("a2", "sealed:xyz")] {
        let row = AgentStateRow {
            agent_id: agent.into(),
            plan: plan.into(),
            job_id: "j".into(),
            applied_by: "me".into(),
            applied_at: at(1),
        };
        store.fleet().put_agent_state(&row).await.unwrap();
    }
    let clear = store.clear_plans(PlanTable::AgentStates, 10).await.unwrap();
    assert_eq!(
        clear,
        [("a1".to_string(), "{\"resources\":[1]}".to_string())]
    );
    assert!(!store
        .seal_plan(PlanTable::AgentStates, "a1", "{}", "sealed:other")
        .await
        .unwrap());
    assert!(store
        .seal_plan(PlanTable::AgentStates, "a1", &clear[0].1, "sealed:abc")
        .await
        .unwrap());
    assert!(store
        .clear_plans(PlanTable::AgentStates, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .clear_plans(PlanTable::BlueprintApplies, 10)
        .await
        .unwrap()
        .is_empty());

    match db.driver {
        StoreDriver::Sqlite => assert!(store.record_file_nonce("k:n", 100, None).await.is_err()),
        StoreDriver::Postgres => {
            let other = db.open().await;
            assert!(store.record_file_nonce("k:n", 100, None).await.unwrap());
            assert!(!other.record_file_nonce("k:n", 100, None).await.unwrap());
            // Forgetting what was signed before 200 makes room again.
            assert!(other
                .record_file_nonce("k:m", 300, Some(200))
                .await
                .unwrap());
            assert!(store.record_file_nonce("k:n", 100, None).await.unwrap());
        }
    }
}
