//! Cluster membership and the leader's lease in PostgreSQL (migration 0007, docs/cluster.md).
//!
//! One dedicated connection per member, outside the pool: the leader's lease is only as good
//! as the connection renewing it, and a pool would hide a lost connection behind a new one.
//! Every time is PostgreSQL's (`now()`), so members' clocks never meet.

use std::time::Duration;

use super::Target;
use crate::Result;

/// One row of `cluster_members`, with its heartbeat's age by the database's clock.
#[derive(Clone, Debug)]
pub struct MemberRow {
    pub id: String,
    pub advertise: String,
    pub version: String,
    pub started_at: String,
    pub heartbeat_age_ms: i64,
}

/// The leader's lease as it stands.
#[derive(Clone, Debug, Default)]
pub struct Lease {
    /// Who took it last (it may have run out: see `remaining_ms`).
    pub holder: Option<String>,
    /// The fencing token: one more at every acquisition.
    pub token: i64,
    /// Milliseconds until it runs out (0: free).
    pub remaining_ms: i64,
    /// Set by transfer-leader: only this member may take it while `preferred_ms` > 0.
    pub preferred: Option<String>,
    pub preferred_ms: i64,
}

/// What a renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    Renewed,
    /// Another member holds it (or this token is old): stop being the leader.
    Lost,
    /// transfer-leader named another member: the lease was released for it.
    Yielded,
}

pub struct ClusterDb {
    client: tokio_postgres::Client,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl ClusterDb {
    pub async fn connect(target: &Target) -> Result<ClusterDb> {
        Ok(ClusterDb {
            client: target.connect().await?,
        })
    }

    /// Whether the connection is gone (then every call fails: reconnect).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    pub async fn ping(&self) -> Result<()> {
        self.client.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// Enters this member (or takes its row over from an earlier process of the same id).
    pub async fn register(
        &self,
        id: &str,
        advertise: &str,
        version: &str,
        incarnation: &str,
    ) -> Result<()> {
        self.client
            .execute(
                "INSERT INTO cluster_members
                     (id, advertise, version, incarnation, started_at, heartbeat_at)
                 VALUES ($1, $2, $3, $4, now(), now())
                 ON CONFLICT (id) DO UPDATE SET advertise = $2, version = $3,
                     incarnation = $4, started_at = now(), heartbeat_at = now()",
                &[&id, &advertise, &version, &incarnation],
            )
            .await?;
        Ok(())
    }

    /// Writes this member's heartbeat; false when its row is gone (removed) or belongs to
    /// a newer process with the same id: either way this process must stop serving.
    pub async fn heartbeat(&self, id: &str, incarnation: &str) -> Result<bool> {
        let rows = self
            .client
            .execute(
                "UPDATE cluster_members SET heartbeat_at = now()
                 WHERE id = $1 AND incarnation = $2",
                &[&id, &incarnation],
            )
            .await?;
        Ok(rows == 1)
    }

    pub async fn members(&self) -> Result<Vec<MemberRow>> {
        let rows = self
            .client
            .query(
                "SELECT id, advertise, version,
                     to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                     (EXTRACT(EPOCH FROM (now() - heartbeat_at)) * 1000)::BIGINT
                 FROM cluster_members ORDER BY id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(MemberRow {
                    id: row.try_get(0)?,
                    advertise: row.try_get(1)?,
                    version: row.try_get(2)?,
                    started_at: row.try_get(3)?,
                    heartbeat_age_ms: row.try_get(4)?,
                })
            })
            .collect()
    }

    /// Deletes this process's own row at a clean stop (not one a newer process took over).
    pub async fn leave(&self, id: &str, incarnation: &str) -> Result<()> {
        self.client
            .execute(
                "DELETE FROM cluster_members WHERE id = $1 AND incarnation = $2",
                &[&id, &incarnation],
            )
            .await?;
        Ok(())
    }

    /// NOTIFY svc_changes: every member's listener gets `payload`.
    pub async fn notify(&self, payload: &str) -> Result<()> {
        self.client
            .execute("SELECT pg_notify('svc_changes', $1)", &[&payload])
            .await?;
        Ok(())
    }

    /// Deletes a member's row; false when there was none.
    pub async fn remove(&self, id: &str) -> Result<bool> {
        let rows = self
            .client
            .execute("DELETE FROM cluster_members WHERE id = $1", &[&id])
            .await?;
        Ok(rows == 1)
    }

    /// Takes the lease if it is free (run out, released) and no other member is preferred;
    /// the new fencing token when taken.
    pub async fn acquire(&self, id: &str, ttl: Duration) -> Result<Option<i64>> {
        let row = self
            .client
            .query_opt(
                "UPDATE cluster_lease SET holder = $1, token = token + 1, acquired_at = now(),
                     expires_at = now() + $2::BIGINT * interval '1 millisecond',
                     preferred = NULL, preferred_until = NULL
                 WHERE name = 'leader' AND (holder IS NULL OR expires_at <= now())
                     AND (preferred IS NULL OR preferred = $1 OR preferred_until <= now())
                 RETURNING token",
                &[&id, &millis(ttl)],
            )
            .await?;
        Ok(row.map(|row| row.try_get(0)).transpose()?)
    }

    /// Extends the lease held under `token`, or gives it up when transfer-leader prefers
    /// another member.
    pub async fn renew(&self, id: &str, token: i64, ttl: Duration) -> Result<Renewal> {
        let row = self
            .client
            .query_opt(
                "WITH current AS (
                     SELECT (preferred IS NOT NULL AND preferred <> $1
                             AND preferred_until > now()) AS yielding
                     FROM cluster_lease WHERE name = 'leader' FOR UPDATE)
                 UPDATE cluster_lease SET
                     holder = CASE WHEN current.yielding THEN NULL ELSE holder END,
                     expires_at = CASE WHEN current.yielding THEN now()
                         ELSE now() + $3::BIGINT * interval '1 millisecond' END
                 FROM current
                 WHERE name = 'leader' AND holder = $1 AND token = $2 AND expires_at > now()
                 RETURNING current.yielding",
                &[&id, &token, &millis(ttl)],
            )
            .await?;
        Ok(match row {
            None => Renewal::Lost,
            Some(row) if row.try_get::<_, bool>(0)? => Renewal::Yielded,
            Some(_) => Renewal::Renewed,
        })
    }

    /// Gives the lease up (a member stopping), so the next leader need not wait it out.
    pub async fn release(&self, id: &str, token: i64) -> Result<()> {
        self.client
            .execute(
                "UPDATE cluster_lease SET holder = NULL, expires_at = now()
                 WHERE name = 'leader' AND holder = $1 AND token = $2",
                &[&id, &token],
            )
            .await?;
        Ok(())
    }

    pub async fn lease(&self) -> Result<Lease> {
        let row = self
            .client
            .query_one(
                "SELECT holder, token,
                     CASE WHEN expires_at > now()
                         THEN (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::BIGINT
                         ELSE 0 END,
                     preferred,
                     CASE WHEN preferred_until > now()
                         THEN (EXTRACT(EPOCH FROM (preferred_until - now())) * 1000)::BIGINT
                         ELSE 0 END
                 FROM cluster_lease WHERE name = 'leader'",
                &[],
            )
            .await?;
        Ok(Lease {
            holder: row.try_get(0)?,
            token: row.try_get(1)?,
            remaining_ms: row.try_get(2)?,
            preferred: row.try_get(3)?,
            preferred_ms: row.try_get(4)?,
        })
    }

    /// transfer-leader: only `to` may take the lease for `window`; the leader gives it up at
    /// its next renewal.
    pub async fn prefer(&self, to: &str, window: Duration) -> Result<()> {
        self.client
            .execute(
                "UPDATE cluster_lease SET preferred = $1,
                     preferred_until = now() + $2::BIGINT * interval '1 millisecond'
                 WHERE name = 'leader'",
                &[&to, &millis(window)],
            )
            .await?;
        Ok(())
    }
}
