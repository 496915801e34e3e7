//! The audit hash chain: each row's hash covers its fields and the previous row's hash, so
//! altering, removing or reordering any row breaks every later link.

use sha2::{Digest, Sha256};

use crate::store::AuditRow;

/// `prev_hash` of the first row.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Hex SHA-256 over the row's fields (not `seq`, not `hash`) as a JSON array, so field
/// boundaries are unambiguous.
pub fn seal(row: &AuditRow) -> String {
    // Serialized as a tuple of borrowed fields: the same JSON text as a `json!` array of them
    // (serde_json escapes a `&str` and a `Value::String` alike), without copying each field.
    let fields = (
        &row.id,
        &row.timestamp,
        &row.user,
        &row.action,
        &row.resource_type,
        &row.resource_id,
        &row.outcome,
        &row.policy_id,
        &row.decision,
        &row.severity,
        &row.detail,
        &row.prev_hash,
    );
    let text = serde_json::to_vec(&fields).expect("strings always serialize");
    hex::encode(Sha256::digest(&text))
}

/// Walks rows in chain order and reports the first that does not link or does not match
/// its hash. `expected_prev` is the hash the first row must point at.
pub struct Verifier {
    expected_prev: String,
    expected_seq: i64,
    pub rows: u64,
}

/// Why a row fails verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub id: String,
    pub seq: i64,
    pub reason: String,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier {
            expected_prev: GENESIS.to_string(),
            expected_seq: 1,
            rows: 0,
        }
    }
}

impl Verifier {
    pub fn check(&mut self, row: &AuditRow) -> Result<(), Broken> {
        let broken = |reason: String| Broken {
            id: row.id.clone(),
            seq: row.seq,
            reason,
        };
        if row.seq != self.expected_seq {
            return Err(broken(format!(
                "sequence gap: expected row {} but found {} (rows removed)",
                self.expected_seq, row.seq
            )));
        }
        if row.prev_hash != self.expected_prev {
            return Err(broken(
                "prev_hash does not match the previous row (removed or reordered)".into(),
            ));
        }
        if seal(row) != row.hash {
            return Err(broken(
                "hash does not match the row's contents (altered)".into(),
            ));
        }
        self.expected_prev = row.hash.clone();
        self.expected_seq += 1;
        self.rows += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: usize) -> Vec<AuditRow> {
        let mut rows = Vec::new();
        let mut prev = GENESIS.to_string();
        for i in 0..n {
            let mut row = AuditRow {
                seq: i as i64 + 1,
                id: format!("id{i}"),
                action: "apikey.create".into(),
                detail: "{}".into(),
                prev_hash: prev.clone(),
                ..AuditRow::default()
            };
            row.hash = seal(&row);
            prev = row.hash.clone();
            rows.push(row);
        }
        rows
    }

    fn verify(rows: &[AuditRow]) -> Result<u64, Broken> {
        let mut verifier = Verifier::default();
        for row in rows {
            verifier.check(row)?;
        }
        Ok(verifier.rows)
    }

    /// The hash every stored chain was made with: a `json!` array of the fields.
    fn seal_as_first_written(row: &AuditRow) -> String {
        let fields = serde_json::json!([
            row.id,
            row.timestamp,
            row.user,
            row.action,
            row.resource_type,
            row.resource_id,
            row.outcome,
            row.policy_id,
            row.decision,
            row.severity,
            row.detail,
            row.prev_hash,
        ]);
        hex::encode(Sha256::digest(fields.to_string().as_bytes()))
    }

    #[test]
    fn seal_is_unchanged_for_existing_chains() {
        let rows = [
            AuditRow::default(),
            AuditRow {
                id: "01J\"quoted\"".into(),
                user: "ünïcödé \u{1F600} \t\n\u{7f}\u{1}".into(),
                policy_id: Some("p-1".into()),
                decision: Some("deny".into()),
                detail: r#"{"key":"[REDACTED]","path":"a\\b"}"#.into(),
                prev_hash: GENESIS.into(),
                ..AuditRow::default()
            },
        ];
        for row in rows {
            assert_eq!(seal(&row), seal_as_first_written(&row), "{row:?}");
        }
    }

    #[test]
    fn intact_altered_removed_reordered() {
        let rows = chain(4);
        assert_eq!(verify(&rows), Ok(4));

        let mut altered = rows.clone();
        altered[2].outcome = "denied".into();
        assert_eq!(verify(&altered).unwrap_err().id, "id2");

        let mut removed = rows.clone();
        removed.remove(1);
        assert_eq!(verify(&removed).unwrap_err().id, "id2");

        let mut reordered = rows.clone();
        reordered.swap(1, 2);
        assert_eq!(verify(&reordered).unwrap_err().id, "id2");
    }
}
