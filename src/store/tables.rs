//! The table catalogue: every table of the store schema, parents before children, with its
//! columns and primary key.
//!
//! Code that handles rows generically rather than through the `Store` traits (svc-migrate's
//! copy, and backups' logical export) walks this list instead of asking each database for its
//! tables, so both drivers are read the same way and in an order that satisfies foreign keys.
//! The unit test below compares it with the SQLite schema after every migration, and
//! tests/migrate.rs with the PostgreSQL one: a migration that adds a table or a column fails
//! them until the entry here is added too. `schema_version` is not in the list: each database
//! records its own migrations.

/// How a column is stored: SQLite TEXT / PostgreSQL TEXT, or SQLite INTEGER / PostgreSQL BIGINT
/// (numbers, and 0/1 flags). No other type is used, so a row copies as `Option<i64>` and
/// `Option<String>` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    Int,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: ColumnType,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    pub name: &'static str,
    /// In the order the schema declares them (`SELECT *` order on both drivers).
    pub columns: &'static [Column],
    /// The primary key's columns, in key order: the order rows are read and copied in.
    pub primary_key: &'static [&'static str],
}

impl Table {
    /// `a, b, c`: the columns for a SELECT or a COPY column list.
    pub fn column_list(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|column| column.name).collect();
        names.join(", ")
    }

    /// The primary key's columns with their types, in key order.
    pub fn key_columns(&self) -> Vec<Column> {
        self.primary_key
            .iter()
            .map(|name| {
                *self
                    .columns
                    .iter()
                    .find(|column| column.name == *name)
                    .expect("every key column is a column (checked by the catalogue test)")
            })
            .collect()
    }
}

/// The table named `name`, if the catalogue has it.
pub fn find(name: &str) -> Option<&'static Table> {
    TABLES.iter().find(|table| table.name == name)
}

const fn text(name: &'static str) -> Column {
    Column {
        name,
        kind: ColumnType::Text,
    }
}

const fn int(name: &'static str) -> Column {
    Column {
        name,
        kind: ColumnType::Int,
    }
}

/// Every table, parents before children (`secrets` before `secret_versions`, `transit_keys`
/// before `transit_key_versions`), so copying or restoring in this order never inserts a row
/// whose parent is missing.
pub const TABLES: &[Table] = &[
    Table {
        name: "api_keys",
        columns: &[
            text("id"),
            text("name"),
            text("role"),
            text("key_hash"),
            text("created_at"),
            text("last_used_at"),
            text("expires_at"),
            text("signing_sealed"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "audit_events",
        columns: &[
            int("seq"),
            text("id"),
            text("timestamp"),
            text("user_id"),
            text("action"),
            text("resource_type"),
            text("resource_id"),
            text("outcome"),
            text("policy_id"),
            text("decision"),
            text("severity"),
            text("detail"),
            text("prev_hash"),
            text("hash"),
        ],
        primary_key: &["seq"],
    },
    Table {
        name: "secrets_master_check",
        columns: &[
            text("id"),
            text("check_value"),
            text("created_at"),
            text("rotated_at"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "data_keys",
        columns: &[text("name"), text("key_sealed"), text("created_at")],
        primary_key: &["name"],
    },
    Table {
        name: "secrets",
        columns: &[
            text("path"),
            text("wrapped_key"),
            int("current_version"),
            text("created_at"),
            text("updated_at"),
        ],
        primary_key: &["path"],
    },
    Table {
        name: "secret_versions",
        columns: &[
            text("path"),
            int("version"),
            text("ciphertext"),
            text("created_at"),
            text("deleted_at"),
            int("destroyed"),
        ],
        primary_key: &["path", "version"],
    },
    Table {
        name: "transit_keys",
        columns: &[
            text("name"),
            text("key_type"),
            int("latest_version"),
            int("min_decryption_version"),
            text("created_at"),
            text("updated_at"),
        ],
        primary_key: &["name"],
    },
    Table {
        name: "transit_key_versions",
        columns: &[
            text("name"),
            int("version"),
            text("material"),
            text("public_key"),
            text("created_at"),
        ],
        primary_key: &["name", "version"],
    },
    Table {
        name: "leases",
        columns: &[
            text("id"),
            text("path"),
            text("backend"),
            text("backend_data"),
            text("created_at"),
            text("expires_at"),
            text("max_expires_at"),
            int("renewable"),
            text("revoked_at"),
            text("last_error"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "ca",
        columns: &[
            text("id"),
            text("kind"),
            text("cert_pem"),
            text("key_encrypted"),
            text("fingerprint"),
            text("not_before"),
            text("not_after"),
            text("created_at"),
            text("retired_at"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "join_tokens",
        columns: &[
            text("id"),
            text("token_hash"),
            text("agent_id"),
            text("created_by"),
            text("created_at"),
            text("expires_at"),
            text("used_at"),
            text("used_by"),
            text("revoked_at"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "agents",
        columns: &[
            text("id"),
            text("labels"),
            text("fingerprint"),
            text("enrolled_at"),
            int("quarantined"),
            text("quarantine_reason"),
            text("quarantined_at"),
            text("last_heartbeat_at"),
            text("facts"),
            text("public_key"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "agent_states",
        columns: &[
            text("agent_id"),
            text("plan"),
            text("job_id"),
            text("applied_by"),
            text("applied_at"),
        ],
        primary_key: &["agent_id"],
    },
    Table {
        name: "jwt_svids",
        columns: &[
            text("id"),
            text("subject"),
            text("audience"),
            text("kid"),
            text("issued_by"),
            text("issued_at"),
            text("expires_at"),
            text("revoked_at"),
            text("revoked_by"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "blueprints",
        columns: &[
            text("name"),
            text("version"),
            text("description"),
            text("sha256"),
            text("manifest"),
            text("bundle"),
            text("installed_by"),
            text("installed_at"),
        ],
        primary_key: &["name", "version"],
    },
    Table {
        name: "blueprint_applies",
        columns: &[
            text("id"),
            text("name"),
            text("version"),
            text("kind"),
            text("target"),
            text("parameters"),
            text("plan"),
            text("results"),
            text("applied_by"),
            text("applied_at"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "blueprint_agents",
        columns: &[
            text("name"),
            text("agent_id"),
            text("version"),
            text("apply_id"),
            text("status"),
            text("applied_at"),
        ],
        primary_key: &["name", "agent_id"],
    },
    Table {
        name: "webhooks",
        columns: &[
            text("id"),
            text("url"),
            text("event_types"),
            text("category"),
            text("min_severity"),
            text("description"),
            text("secret_sealed"),
            text("created_by"),
            text("created_at"),
            text("updated_at"),
            int("cursor_seq"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "webhook_deliveries",
        columns: &[
            text("id"),
            text("webhook_id"),
            text("event_id"),
            int("event_seq"),
            text("event_type"),
            text("body"),
            text("status"),
            int("attempts"),
            text("created_at"),
            text("next_attempt_at"),
            text("deadline_at"),
            text("last_attempt_at"),
            int("response_status"),
            text("last_error"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "runbook_executions",
        columns: &[
            text("id"),
            text("runbook"),
            text("status"),
            text("parameters"),
            text("definition"),
            text("started_by"),
            text("started_at"),
            text("finished_at"),
            text("trigger_event_id"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "runbook_steps",
        columns: &[
            text("execution_id"),
            text("step_id"),
            text("status"),
            int("attempts"),
            text("started_at"),
            text("finished_at"),
            text("output"),
            text("error"),
            text("approved_by"),
        ],
        primary_key: &["execution_id", "step_id"],
    },
    Table {
        name: "jobs",
        columns: &[
            text("id"),
            text("kind"),
            text("target"),
            text("description"),
            text("created_by"),
            text("created_at"),
            text("expires_at"),
            text("finished_at"),
            int("agents"),
            text("counts"),
        ],
        primary_key: &["id"],
    },
    Table {
        name: "job_results",
        columns: &[
            text("job_id"),
            text("agent_id"),
            text("status"),
            text("result"),
        ],
        primary_key: &["job_id", "agent_id"],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    type Shape = (String, Vec<(String, ColumnType)>, Vec<String>);

    /// The SQLite schema after every migration, as the catalogue would spell it, by table name.
    fn sqlite_schema() -> Vec<Shape> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.db");
        drop(crate::store::SqliteStore::open(&path).unwrap());
        let connection = rusqlite::Connection::open(&path).unwrap();
        let names: Vec<String> = connection
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' \
                 AND name NOT LIKE 'sqlite_%' AND name <> 'schema_version' ORDER BY name",
            )
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let mut tables = Vec::new();
        for name in names {
            // (cid, name, type, notnull, default, pk position: 0 when not in the key)
            let mut columns = Vec::new();
            let mut key: Vec<(i64, String)> = Vec::new();
            let mut statement = connection
                .prepare(&format!("PRAGMA table_info({name})"))
                .unwrap();
            let mut rows = statement.query([]).unwrap();
            while let Some(row) = rows.next().unwrap() {
                let column: String = row.get(1).unwrap();
                let declared: String = row.get(2).unwrap();
                let kind = match declared.as_str() {
                    "TEXT" => ColumnType::Text,
                    "INTEGER" => ColumnType::Int,
                    other => panic!("{name}.{column}: type {other} has no ColumnType"),
                };
                let position: i64 = row.get(5).unwrap();
                if position > 0 {
                    key.push((position, column.clone()));
                }
                columns.push((column, kind));
            }
            key.sort();
            tables.push((name, columns, key.into_iter().map(|(_, c)| c).collect()));
        }
        tables
    }

    #[test]
    fn catalogue_equals_the_sqlite_schema_after_every_migration() {
        let schema = sqlite_schema();
        let mut catalogue: Vec<Shape> = TABLES
            .iter()
            .map(|table| {
                (
                    table.name.to_string(),
                    table
                        .columns
                        .iter()
                        .map(|c| (c.name.to_string(), c.kind))
                        .collect(),
                    table.primary_key.iter().map(|k| k.to_string()).collect(),
                )
            })
            .collect();
        crate::sort::sort_by(&mut catalogue, |a, b| a.0.cmp(&b.0));
        // Table by table first, so a failure names the table that differs.
        for table in &schema {
            let entry = catalogue.iter().find(|entry| entry.0 == table.0);
            let entry = entry
                .unwrap_or_else(|| panic!("table {} is in the schema but not in TABLES", table.0));
            assert_eq!(table, entry, "table {} (schema, then catalogue)", table.0);
        }
        assert_eq!(
            schema.iter().map(|t| &t.0).collect::<Vec<_>>(),
            catalogue.iter().map(|t| &t.0).collect::<Vec<_>>(),
            "tables in the schema, then in the catalogue"
        );
    }

    #[test]
    fn parents_come_before_their_children() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.db");
        drop(crate::store::SqliteStore::open(&path).unwrap());
        let connection = rusqlite::Connection::open(&path).unwrap();
        let mut checked = 0;
        for (position, table) in TABLES.iter().enumerate() {
            let parents: Vec<String> = connection
                .prepare(&format!("PRAGMA foreign_key_list({})", table.name))
                .unwrap()
                .query_map([], |row| row.get(2))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            for parent in parents {
                let parent_position = TABLES
                    .iter()
                    .position(|t| t.name == parent)
                    .unwrap_or_else(|| panic!("{}: parent {parent} not catalogued", table.name));
                assert!(
                    parent_position < position,
                    "{} must come after its parent {parent}",
                    table.name
                );
                checked += 1;
            }
        }
        // secret_versions → secrets, transit_key_versions → transit_keys at least.
        assert!(checked >= 2, "only {checked} foreign keys found");
    }

    #[test]
    fn key_columns_and_lookups() {
        let versions = find("secret_versions").unwrap();
        assert_eq!(versions.key_columns(), vec![text("path"), int("version")]);
        assert_eq!(
            find("api_keys").unwrap().column_list(),
            "id, name, role, key_hash, created_at, last_used_at, expires_at, signing_sealed"
        );
        assert!(find("schema_version").is_none());
    }
}
