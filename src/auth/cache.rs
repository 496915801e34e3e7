//! The verified-key cache: API keys this server has already found in the store, by hash, so
//! an authenticated request does not open a store read transaction (issue 21).
//!
//! The contract's rule (§4) stands: a deleted key fails its very next request. That holds
//! because every change to a key made by this server ([`super::delete_key`],
//! [`super::update_key`]) drops the cache's entries for it after the store commits and before
//! the call returns, and a lookup that raced with such a change cannot put its stale row back
//! (see `epoch`). It only holds when this server is the only writer of its keys, so the cache
//! is on for the SQLite store alone, whose data dir a running server holds locked. On
//! PostgreSQL other members change the same rows and their announcements (NOTIFY) reach this
//! member only some time after the delete returned there, so every request still reads the
//! store. Changing `api_keys` with SQL while the server runs is not a supported way to revoke a
//! key (docs/performance.md, "Issue 21"): it is seen at the next restart.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::store::ApiKeyRow;

/// More distinct keys than any deployment uses; past it the cache starts over (only keys that
/// verified are kept, so a caller cannot fill it with guesses).
const MAX_ENTRIES: usize = 10_000;

#[derive(Default)]
struct Inner {
    by_hash: HashMap<String, ApiKeyRow>,
    /// Bumped by every invalidation. A lookup notes it before reading the store and keeps the
    /// row only if it has not moved, so a row read before a delete committed is never cached
    /// after the delete dropped its entries.
    epoch: u64,
}

pub struct KeyCache {
    enabled: bool,
    inner: Mutex<Inner>,
}

impl KeyCache {
    /// A cache that keeps rows only when `enabled` (the store has no writer but this server).
    pub fn new(enabled: bool) -> Self {
        KeyCache {
            enabled,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached row for `hash`, or the epoch to hand to [`KeyCache::keep`] after reading
    /// the store.
    pub fn get(&self, hash: &str) -> Result<ApiKeyRow, u64> {
        if !self.enabled {
            return Err(0);
        }
        let inner = self.lock();
        match inner.by_hash.get(hash) {
            Some(row) => Ok(row.clone()),
            None => Err(inner.epoch),
        }
    }

    /// Keeps a row read from the store, unless an invalidation happened since `epoch`.
    pub fn keep(&self, epoch: u64, row: &ApiKeyRow) {
        if !self.enabled {
            return;
        }
        let mut inner = self.lock();
        if inner.epoch != epoch {
            return;
        }
        if inner.by_hash.len() >= MAX_ENTRIES {
            inner.by_hash.clear();
        }
        inner.by_hash.insert(row.key_hash.clone(), row.clone());
    }

    /// Records the `last_used_at` this server just wrote, so the next touch waits its turn.
    pub fn touched(&self, hash: &str, used_at: &str) {
        if let Some(row) = self.lock().by_hash.get_mut(hash) {
            row.last_used_at = Some(used_at.to_string());
        }
    }

    /// Drops key `id` (deleted or changed): called after the store committed the change and
    /// before the change is answered.
    pub fn forget(&self, id: &str) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.by_hash.retain(|_, row| row.id != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, hash: &str) -> ApiKeyRow {
        ApiKeyRow {
            id: id.into(),
            name: "n".into(),
            role: "admin".into(),
            key_hash: hash.into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            last_used_at: None,
            expires_at: None,
            signing_sealed: None,
        }
    }

    #[test]
    fn a_forgotten_key_is_gone_and_a_racing_lookup_cannot_put_it_back() {
        let cache = KeyCache::new(true);
        let epoch = cache.get("h1").unwrap_err();
        cache.keep(epoch, &row("a", "h1"));
        assert_eq!(cache.get("h1").unwrap().id, "a");

        // A lookup starts (notes the epoch, reads the row), the key is deleted meanwhile.
        let racing = cache.get("h2").unwrap_err();
        cache.forget("a");
        cache.keep(racing, &row("b", "h2"));
        assert!(cache.get("h1").is_err(), "deleted key still cached");
        assert!(
            cache.get("h2").is_err(),
            "row read before the delete was kept"
        );
    }

    #[test]
    fn disabled_keeps_nothing() {
        let cache = KeyCache::new(false);
        cache.keep(0, &row("a", "h1"));
        assert!(cache.get("h1").is_err());
    }
}
