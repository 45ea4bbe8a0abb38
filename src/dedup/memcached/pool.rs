//! A small per-server connection pool.
//!
//! Connections are opened lazily, at most `size` at once; a caller waits for a free one. A
//! connection goes back to the pool only when its user marks it healthy after a complete
//! exchange: an error or a dropped future (timeout) may leave unread answers on it, so it is
//! closed instead. After a server restart, pooled connections are dead; the first error
//! empties the pool so that the next operation connects afresh.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

/// Idle connections plus a limit on open ones.
pub(super) struct Pool<T> {
    /// Connections not in use. A `std` mutex: it is held only to push or pop, never across
    /// an `.await`.
    idle: Mutex<Vec<T>>,
    /// One permit per connection that may be open.
    permits: Semaphore,
}

impl<T> Pool<T> {
    pub(super) fn new(size: usize) -> Self {
        Pool {
            idle: Mutex::new(Vec::with_capacity(size)),
            permits: Semaphore::new(size),
        }
    }

    /// A connection: an idle one, or a new one from `connect`.
    ///
    /// Waits for a permit if all `size` connections are in use; callers bound the wait with
    /// their timeout.
    pub(super) async fn get<F, Fut, E>(&self, connect: F) -> Result<Pooled<'_, T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // The semaphore is never closed, so `acquire` only fails if it were; treat that as
        // "no permit needed" rather than panicking.
        let permit = self.permits.acquire().await.ok();
        let reused = self.lock().pop();
        let conn = match reused {
            Some(conn) => conn,
            None => connect().await?,
        };
        Ok(Pooled {
            pool: self,
            conn: Some(conn),
            healthy: false,
            _permit: permit,
        })
    }

    /// Closes every idle connection (after an error that suggests the server went away).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        // A panic while holding this lock cannot leave the Vec inconsistent (push/pop/clear
        // only), so a poisoned lock is still usable.
        self.idle
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// A connection borrowed from a [`Pool`]; returned on drop only if marked healthy.
pub(super) struct Pooled<'a, T> {
    pool: &'a Pool<T>,
    conn: Option<T>,
    healthy: bool,
    _permit: Option<SemaphorePermit<'a>>,
}

impl<T> Pooled<'_, T> {
    /// Marks the connection reusable: the last exchange completed and nothing is unread.
    pub(super) fn set_healthy(&mut self, healthy: bool) {
        self.healthy = healthy;
    }
}

impl<T> Deref for Pooled<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // `conn` is `Some` from construction until drop.
        self.conn
            .as_ref()
            .expect("pooled connection present until drop")
    }
}

impl<T> DerefMut for Pooled<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.conn
            .as_mut()
            .expect("pooled connection present until drop")
    }
}

impl<T> Drop for Pooled<'_, T> {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.healthy, self.conn.take()) {
            self.pool.lock().push(conn);
        }
    }
}
