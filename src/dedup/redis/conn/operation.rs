//! One operation of a [`Link`]: to the node that serves its slot, and on from there when
//! the node answers `MOVED` or `ASK`, lacks the script, is gone, or the cluster is failing
//! over; every try within the operation's time limit.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script, Value};
use tokio::time::Instant;

use super::{host_of, is_connection_error, Link, Open};
use crate::error::StoreError;

/// Redirections one operation follows before giving up.
const MAX_REDIRECTS: u32 = 8;

/// The pause before retrying an operation on a cluster that is failing over.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Where one operation of [`Link::eval`] stands between its tries.
struct Attempt {
    /// The operation's time limit.
    deadline: Instant,
    /// The slot map's generation the current try routes by.
    seen: u64,
    /// The node an `ASK` sent the next try to.
    ask: Option<String>,
    /// Redirections followed so far.
    redirects: u32,
    /// Whether a standalone server's connection was opened anew: its kept connection may
    /// have broken since its last use (a restarted server, the runtime that drove it gone),
    /// so it gets one more try on a new one.
    reconnected: bool,
}

impl Link {
    /// Runs `evalsha` (an `EVALSHA` of `script` whose keys all lie in `slot`, which a
    /// standalone server ignores) on the node that serves `slot`, following redirections,
    /// loading the script where it is missing, and (in a cluster) waiting out a failover, all
    /// within the time limit.
    ///
    /// # Errors
    ///
    /// [`StoreError::Timeout`] when the time limit passes; otherwise the node's error (in a
    /// standalone server the first one, in a cluster the last one).
    pub(in crate::dedup::redis) async fn eval(
        &self,
        script: &Script,
        slot: u16,
        evalsha: &redis::Cmd,
    ) -> Result<Value, StoreError> {
        let mut attempt = Attempt {
            deadline: self.deadline(),
            seen: 0,
            ask: None,
            redirects: 0,
            reconnected: false,
        };
        loop {
            // The map this attempt routes by: a failure reads it again only if nobody has
            // since.
            attempt.seen = self.generation();
            let node = match &attempt.ask {
                Some(node) => node.clone(),
                None => self.route(slot, attempt.deadline).await?,
            };
            let Some(open) = self.open_to_eval(&node, &mut attempt).await? else {
                continue;
            };
            let sent = self.send(evalsha, &node, &open, &attempt).await?;
            let error = match sent {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            self.recover(script, &error, &node, &open, &mut attempt)
                .await?;
        }
    }

    /// Sends `pipe` (`count` commands, each on a key of a slot that `slot`'s node serves in
    /// the slot map as last read) to the node of `slot` once, by `deadline`, and
    /// answers each command's reply, an error reply as [`Value::ServerError`]. Unlike
    /// [`Link::eval`] it follows no redirection, loads nothing and waits out no failover: a
    /// command that was not run is for the caller to send again another way.
    ///
    /// # Errors
    ///
    /// No answer by `deadline` ([`StoreError::Timeout`], or in a cluster
    /// [`StoreError::Unavailable`]), or the connection failing: none of the commands is
    /// known to have run.
    pub(in crate::dedup::redis) async fn pipeline(
        &self,
        slot: u16,
        pipe: &redis::Pipeline,
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<Value>, StoreError> {
        let node = self.route(slot, deadline).await?;
        let open = self.node(&node, deadline).await?;
        let mut sending = open.conn.clone();
        let sent = self
            .within(
                deadline,
                &node,
                &open,
                sending.send_packed_commands(pipe, 0, count),
            )
            .await?;
        sent.map_err(|error| self.failed(&node, &error))
    }

    /// The connection to `node` for an attempt of [`Link::eval`], or `None` when the node
    /// died and the attempt should be routed again once the cluster has noticed.
    async fn open_to_eval(
        &self,
        node: &str,
        attempt: &mut Attempt,
    ) -> Result<Option<Open>, StoreError> {
        match self.node(node, attempt.deadline).await {
            Ok(open) => Ok(Some(open)),
            // Out of time, or refused (a wrong password): waiting for a replica to take
            // over would not help.
            Err(
                error @ (StoreError::Timeout(_)
                | StoreError::Refused { .. }
                | StoreError::Config(_)),
            ) => Err(error),
            Err(error) if !self.cluster => Err(error),
            Err(_) => {
                // The node died: its replica takes over once the cluster notices.
                self.retry_after(attempt.seen, attempt.deadline).await?;
                attempt.ask = None;
                Ok(None)
            }
        }
    }

    /// Sends `evalsha` to `node`, after `ASKING` in the same write when the attempt follows
    /// an `ASK`.
    async fn send(
        &self,
        evalsha: &redis::Cmd,
        node: &str,
        open: &Open,
        attempt: &Attempt,
    ) -> Result<Result<Value, RedisError>, StoreError> {
        if attempt.ask.is_some() {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(evalsha.clone());
            let mut asking = open.conn.clone();
            self.within(attempt.deadline, node, open, async move {
                pipe.query_async::<(Value,)>(&mut asking)
                    .await
                    .map(|(value,)| value)
            })
            .await
        } else {
            let mut sending = open.conn.clone();
            self.within(
                attempt.deadline,
                node,
                open,
                evalsha.query_async(&mut sending),
            )
            .await
        }
    }

    /// What follows a node's `error` to an attempt of [`Link::eval`]: `Ok` to try again
    /// (the script loaded, a redirection followed, a failover waited out, a new connection),
    /// or the error to give up with.
    async fn recover(
        &self,
        script: &Script,
        error: &RedisError,
        node: &str,
        open: &Open,
        attempt: &mut Attempt,
    ) -> Result<(), StoreError> {
        match error.kind() {
            ErrorKind::NoScriptError => {
                // A restarted server, or a replica promoted before it saw the script.
                let mut loading = open.conn.clone();
                let loaded: Result<String, RedisError> = self
                    .within(
                        attempt.deadline,
                        node,
                        open,
                        script.prepare_invoke().load_async(&mut loading),
                    )
                    .await?;
                if let Err(error) = loaded {
                    return Err(self.failed(node, &error));
                }
            }
            ErrorKind::Moved | ErrorKind::Ask if self.cluster => {
                self.redirect(error, node, attempt)?;
            }
            ErrorKind::TryAgain
            | ErrorKind::ClusterDown
            | ErrorKind::MasterDown
            | ErrorKind::ReadOnly
                if self.cluster =>
            {
                self.retry_after(attempt.seen, attempt.deadline).await?;
                attempt.ask = None;
            }
            _ if self.cluster && is_connection_error(error) => {
                // The node died: its replica takes over once the cluster notices.
                self.drop_conn(node, Some(open));
                self.retry_after(attempt.seen, attempt.deadline).await?;
                attempt.ask = None;
            }
            // Sending the script again is safe even if the first one ran: a claim then
            // finds its own entry in flight (the message is requeued, and claimed anew
            // once the lease ends), a commit finds it done, an erase finds nothing.
            _ if !self.cluster && !attempt.reconnected && is_connection_error(error) => {
                self.drop_conn(node, Some(open));
                attempt.reconnected = true;
            }
            _ => return Err(self.failed(node, error)),
        }
        Ok(())
    }

    /// Follows a `MOVED` (the slot map learns it) or an `ASK` (the next attempt goes to that
    /// node once), up to [`MAX_REDIRECTS`].
    fn redirect(
        &self,
        error: &RedisError,
        node: &str,
        attempt: &mut Attempt,
    ) -> Result<(), StoreError> {
        attempt.redirects += 1;
        // A statistic: nothing else depends on it.
        self.redirects.fetch_add(1, Ordering::Relaxed);
        let Some((to, to_slot)) = error.redirect_node() else {
            return Err(self.failed(node, error));
        };
        if attempt.redirects > MAX_REDIRECTS {
            return Err(self.failed(node, error));
        }
        let to = if to.starts_with(':') {
            // Redis leaves the host out when it does not know its own name.
            format!("{}{to}", host_of(node))
        } else {
            to.to_owned()
        };
        if error.kind() == ErrorKind::Moved {
            self.slots_map().moved(to_slot, &to);
            attempt.ask = None;
        } else {
            attempt.ask = Some(to);
        }
        Ok(())
    }

    /// Waits a moment, then reads the slot map again unless someone did since `seen`: a
    /// cluster that is failing over.
    ///
    /// # Errors
    ///
    /// [`StoreError::Timeout`] if the deadline comes first.
    async fn retry_after(&self, seen: u64, deadline: Instant) -> Result<(), StoreError> {
        if Instant::now() + RETRY_PAUSE >= deadline {
            tokio::time::sleep_until(deadline).await;
            return Err(self.no_answer(&self.addr));
        }
        // A statistic: nothing else depends on it.
        self.retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(RETRY_PAUSE).await;
        // A failed read leaves the old map: the next attempt fails again and reads it again.
        let _ = self.refresh_slots(seen, deadline).await;
        Ok(())
    }
}
