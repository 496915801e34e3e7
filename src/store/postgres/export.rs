//! The logical export of a PostgreSQL store into a SQLite file, for snapshots: every table of
//! the catalogue (`store::tables`) read in key order inside one REPEATABLE READ, READ ONLY
//! transaction (one consistent state while the servers go on writing), written into a file
//! `SqliteStore::open` made (so it has this binary's schema) by a thread of its own, batch by
//! batch, so PostgreSQL and SQLite work at the same time and memory stays bounded.

use std::path::Path;
use std::sync::mpsc;

use futures_util::TryStreamExt;
use rusqlite::types::Value;

use super::PostgresStore;
use crate::store::tables::{ColumnType, TABLES};
use crate::{Error, Result};

/// Rows per message to the SQLite writer.
const BATCH_ROWS: usize = 5_000;

impl PostgresStore {
    /// See `Store::export_sqlite`.
    pub(super) async fn export_into_sqlite(&self, path: &Path) -> Result<()> {
        drop(crate::store::SqliteStore::open(path)?);
        let (sender, receiver) = mpsc::sync_channel::<(usize, Vec<Vec<Value>>)>(4);
        let file = path.to_path_buf();
        let writer = std::thread::Builder::new()
            .name("snapshot-export".into())
            .spawn(move || write_rows(&file, receiver))?;
        let read = self.read_tables(&sender).await;
        drop(sender);
        let written = writer
            .join()
            .map_err(|_| Error::internal("the export writer panicked"))?;
        read?;
        written
    }

    async fn read_tables(&self, sender: &mpsc::SyncSender<(usize, Vec<Vec<Value>>)>) -> Result<()> {
        let client = self.client().await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await?;
        for (index, table) in TABLES.iter().enumerate() {
            let sql = format!(
                "SELECT {} FROM {} ORDER BY {}",
                table.column_list(),
                table.name,
                table.primary_key.join(", ")
            );
            let rows = client
                .query_raw(
                    sql.as_str(),
                    std::iter::empty::<&(dyn tokio_postgres::types::ToSql + Sync)>(),
                )
                .await?;
            futures_util::pin_mut!(rows);
            let mut batch = Vec::with_capacity(BATCH_ROWS);
            while let Some(row) = rows.try_next().await? {
                let mut values = Vec::with_capacity(table.columns.len());
                for (at, column) in table.columns.iter().enumerate() {
                    values.push(match column.kind {
                        ColumnType::Text => row
                            .try_get::<_, Option<String>>(at)?
                            .map_or(Value::Null, Value::Text),
                        ColumnType::Int => row
                            .try_get::<_, Option<i64>>(at)?
                            .map_or(Value::Null, Value::Integer),
                    });
                }
                batch.push(values);
                if batch.len() == BATCH_ROWS {
                    send(sender, index, std::mem::take(&mut batch))?;
                }
            }
            if !batch.is_empty() {
                send(sender, index, batch)?;
            }
        }
        client.batch_execute("COMMIT").await?;
        Ok(())
    }
}

fn send(
    sender: &mpsc::SyncSender<(usize, Vec<Vec<Value>>)>,
    index: usize,
    batch: Vec<Vec<Value>>,
) -> Result<()> {
    sender
        .send((index, batch))
        .map_err(|_| Error::internal("the export writer stopped"))
}

/// Inserts every batch in one transaction; the file is a fresh copy, so it needs no journal
/// (a failed export deletes it).
fn write_rows(path: &Path, receiver: mpsc::Receiver<(usize, Vec<Vec<Value>>)>) -> Result<()> {
    let mut connection = rusqlite::Connection::open(path)?;
    connection.pragma_update(None, "journal_mode", "DELETE")?;
    connection.pragma_update(None, "synchronous", "OFF")?;
    let transaction = connection.transaction()?;
    while let Ok((index, rows)) = receiver.recv() {
        let table = &TABLES[index];
        let placeholders: Vec<String> =
            (1..=table.columns.len()).map(|n| format!("?{n}")).collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            table.name,
            table.column_list(),
            placeholders.join(", ")
        );
        let mut statement = transaction.prepare_cached(&sql)?;
        for row in rows {
            statement.execute(rusqlite::params_from_iter(row))?;
        }
    }
    transaction.commit()?;
    Ok(())
}
