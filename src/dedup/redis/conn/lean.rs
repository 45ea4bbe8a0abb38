//! The store's own connections for the hot path's pipelines (`GET`, `SET … NX GET`, `SET …
//! IFEQ`, the compare-and-set script's `EVALSHA`): plain TCP, a pipeline written once from
//! one buffer and its replies parsed in place (`resp`), with none of the `redis` crate's
//! per-argument buffers, packing and reply values (see `docs/design.md`, "Our own RESP
//! client").
//!
//! A connection carries one pipeline at a time, as the Memcached store's do: a caller takes an
//! idle connection of its node (or opens one), writes, reads its replies, and puts it back;
//! concurrent pipelines to a node each have a connection of their own, so no reply can reach
//! another caller, and one that runs out of time or fails drops its connection (and, having
//! found the node failing, its node's idle ones) with nothing left unread on a kept one.
//! Everything else a [`Link`] promises stays: the deadline of the operation bounds the
//! connect and the exchange, the node is routed by the slot map, `AUTH` and `SELECT` as the
//! URL says, and every error reply (`MOVED`, `ASK`, `NOSCRIPT`, …) goes back to the caller,
//! which leaves those commands to the crate's path. A `rediss://` store has no connection of
//! this kind: its pipelines go through the crate's connection ([`Link::pipeline`]).

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::super::recycle;
use super::super::resp::{parse, Commands, Replies, Reply, Span};
use super::{Link, Template};
use crate::error::StoreError;

/// Idle connections a node keeps; more are closed when put back.
const IDLE_PER_NODE: usize = 16;

/// Room kept free in the read buffer before each read.
const READ_ROOM: usize = 16 * 1024;

/// The idle connections of every node, by `host:port`.
#[derive(Default)]
pub(super) struct Idle {
    /// A `std` mutex: held only to take or put a connection, never across an `.await`.
    nodes: Mutex<HashMap<String, Vec<LeanConn>>>,
}

impl Idle {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<LeanConn>>> {
        // A poisoned lock still holds whole connections.
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, node: &str) -> Option<LeanConn> {
        self.lock().get_mut(node)?.pop()
    }

    fn put(&self, node: &str, conn: LeanConn) {
        let mut nodes = self.lock();
        let idle = match nodes.get_mut(node) {
            Some(idle) => idle,
            None => nodes.entry(node.to_owned()).or_default(),
        };
        if idle.len() < IDLE_PER_NODE {
            idle.push(conn);
        }
    }

    /// Closes the idle connections of `node`: it failed, and they may be broken too.
    pub(super) fn clear(&self, node: &str) {
        self.lock().remove(node);
    }
}

/// A connection to one node that carries one pipeline at a time.
pub(super) struct LeanConn {
    stream: TcpStream,
}

impl LeanConn {
    /// Connects to `node` (`host:port`), and authenticates and selects the database as
    /// `template` says.
    async fn connect(node: &str, template: &Template) -> io::Result<Self> {
        let stream = TcpStream::connect(node).await?;
        stream.set_nodelay(true)?;
        let mut conn = LeanConn { stream };
        let mut hello = Commands::with_capacity(128);
        if let Some(password) = &template.password {
            match &template.username {
                Some(user) => hello.push(&[b"AUTH", user.as_bytes(), password.as_bytes()]),
                None => hello.push(&[b"AUTH", password.as_bytes()]),
            }
        }
        if template.db != 0 {
            hello.push(&[b"SELECT", template.db.to_string().as_bytes()]);
        }
        if !hello.is_empty() {
            for reply in conn.exchange(&hello).await?.take_list() {
                if let Reply::Error(error) = reply {
                    return Err(io::Error::other(error));
                }
            }
        }
        Ok(conn)
    }

    /// Sends `commands` and reads their replies, in order, with the bytes they were read in.
    ///
    /// # Errors
    ///
    /// The connection's, or [`io::ErrorKind::InvalidData`] for bytes that are not Redis's
    /// replies (or more of them than commands sent): the connection is then out of step.
    pub(super) async fn exchange(&mut self, commands: &Commands) -> io::Result<Replies> {
        self.stream.write_all(commands.bytes()).await?;
        // The bytes read: a buffer of the thread's (`recycle`), as a pipeline's replies may
        // take megabytes that an idle connection should not hold. The replies' bulk strings
        // lie in it, so it goes back only once they are done with (`Replies`).
        let mut read = recycle::pipeline(READ_ROOM);
        match self.read_replies(commands.len(), &mut read).await {
            Ok(list) => Ok(Replies::new(read, list)),
            Err(error) => {
                recycle::give_pipeline(read);
                Err(error)
            }
        }
    }

    /// Reads `count` replies into `read`, which keeps every byte read: their bulk strings
    /// are spans of it.
    async fn read_replies(&mut self, count: usize, read: &mut Vec<u8>) -> io::Result<Vec<Reply>> {
        let mut replies = Vec::with_capacity(count);
        let mut at = 0;
        while replies.len() < count {
            match parse(read, at) {
                Ok(Some((reply, next))) => {
                    replies.push(reply);
                    at = next;
                    continue;
                }
                Ok(None) => {}
                Err(invalid) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, invalid));
                }
            }
            read.reserve(READ_ROOM);
            if self.stream.read_buf(read).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        if at != read.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more replies than commands",
            ));
        }
        Ok(replies)
    }
}

impl Link {
    /// Sends `commands` (each on a key of a slot that `slot`'s node serves in the slot map as
    /// last read) to the node of `slot` once, by `deadline`, on a connection of this module,
    /// and answers each command's reply, an error reply as [`Reply::Error`]. As
    /// [`Link::pipeline`], it follows no redirection and waits out no failover.
    ///
    /// # Errors
    ///
    /// As [`Link::pipeline`]'s: none of the commands is known to have run.
    pub(in crate::dedup::redis) async fn send_commands(
        &self,
        slot: u16,
        commands: &Commands,
        deadline: Instant,
    ) -> Result<Replies, StoreError> {
        if self.template.tls {
            return self.send_by_crate(slot, commands, deadline).await;
        }
        let node = self.route(slot, deadline).await?;
        let conn = match self.lean.take(&node) {
            Some(conn) => conn,
            None => {
                // The crate's connection first: it says why a node refuses us (a wrong
                // password, a user without rights) as every other operation does.
                self.node(&node, deadline).await?;
                match tokio::time::timeout_at(deadline, LeanConn::connect(&node, &self.template))
                    .await
                {
                    Ok(Ok(conn)) => conn,
                    Ok(Err(error)) => return Err(self.lean_failed(&node, &error)),
                    Err(_) => return Err(self.lean_no_answer(&node)),
                }
            }
        };
        let exchange = async move {
            let mut conn = conn;
            let replies = conn.exchange(commands).await;
            (conn, replies)
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok((conn, Ok(replies))) => {
                self.lean.put(&node, conn);
                Ok(replies)
            }
            Ok((_, Err(error))) => Err(self.lean_failed(&node, &error)),
            Err(_) => Err(self.lean_no_answer(&node)),
        }
    }

    /// The error of `node`'s connection failing: its other connections (and the crate's)
    /// are dropped, as they may be broken too.
    fn lean_failed(&self, node: &str, error: &io::Error) -> StoreError {
        self.drop_conn(node, None);
        StoreError::Unavailable {
            addr: node.to_owned(),
            detail: error.to_string(),
        }
    }

    /// The error of `node` not answering by the deadline (see `Link::within`).
    fn lean_no_answer(&self, node: &str) -> StoreError {
        self.drop_conn(node, None);
        self.no_answer(node)
    }

    /// [`Link::send_commands`] through the crate's connection: a TLS store's.
    async fn send_by_crate(
        &self,
        slot: u16,
        commands: &Commands,
        deadline: Instant,
    ) -> Result<Replies, StoreError> {
        let mut pipe = redis::Pipeline::with_capacity(commands.len());
        let (bytes, mut at) = (commands.bytes(), 0);
        while let Ok(Some((Reply::Array(args), next))) = parse(bytes, at) {
            let mut cmd = redis::Cmd::with_capacity(args.len(), 0);
            for arg in args {
                if let Reply::Bulk(arg) = arg {
                    cmd.arg(arg.of(bytes));
                }
            }
            pipe.add_command(cmd);
            at = next;
        }
        let values = self.pipeline(slot, &pipe, commands.len(), deadline).await?;
        let mut read = recycle::pipeline(0);
        let list = values
            .into_iter()
            .map(|value| reply_of(value, &mut read))
            .collect();
        Ok(Replies::new(read, list))
    }
}

/// The [`Reply`] of a crate's `value`, its bulk strings appended to `bytes`.
fn reply_of(value: redis::Value, bytes: &mut Vec<u8>) -> Reply {
    use redis::Value;
    match value {
        Value::Nil => Reply::Nil,
        Value::Okay => Reply::Okay,
        Value::SimpleString(text) => Reply::Status(text),
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(value) => Reply::Bulk(Span::appended(bytes, &value)),
        Value::Array(values) => Reply::Array(
            values
                .into_iter()
                .map(|value| reply_of(value, bytes))
                .collect(),
        ),
        Value::ServerError(error) => Reply::Error(match error.details() {
            Some(details) => format!("{} {details}", error.code()),
            None => error.code().to_owned(),
        }),
        other => Reply::Status(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::{Commands, Idle, LeanConn, Reply, Template};
    use crate::dedup::redis::resp::parse;
    use crate::dedup::redis::resp::tests::{owned_all, Owned};

    /// A server that answers each command (an array of bulk strings) with its last argument,
    /// in pieces of a few bytes, so that replies arrive cut anywhere.
    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut input = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        input.extend_from_slice(&buf[..n]);
                        let mut out = Vec::new();
                        while let Ok(Some((Reply::Array(args), next))) = parse(&input, 0) {
                            let Some(Reply::Bulk(last)) = args.last() else {
                                return;
                            };
                            let last = last.of(&input);
                            out.extend_from_slice(format!("${}\r\n", last.len()).as_bytes());
                            out.extend_from_slice(last);
                            out.extend_from_slice(b"\r\n");
                            input.drain(..next);
                        }
                        for piece in out.chunks(7) {
                            if socket.write_all(piece).await.is_err() {
                                return;
                            }
                            tokio::task::yield_now().await;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Many pipelines at once to one node, each on a connection taken from and put back to
    /// the node's idle ones, each get their own replies, in their order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_pipelines_get_their_own_replies() {
        let node = echo_server().await;
        let idle = Arc::new(Idle::default());
        let template = Arc::new(Template {
            tls: false,
            root_pem: None,
            username: None,
            password: None,
            db: 0,
        });
        let tasks: Vec<_> = (0..64)
            .map(|task| {
                let (node, idle, template) = (node.clone(), idle.clone(), template.clone());
                tokio::spawn(async move {
                    for round in 0..20 {
                        let mut conn = match idle.take(&node) {
                            Some(conn) => conn,
                            None => LeanConn::connect(&node, &template).await.unwrap(),
                        };
                        let mut commands = Commands::with_capacity(0);
                        let values: Vec<Vec<u8>> = (0..1 + (task + round) % 9)
                            .map(|i| format!("{task}:{round}:{i}:{}", "v".repeat(i * 200)))
                            .map(String::into_bytes)
                            .collect();
                        for value in &values {
                            commands.push(&[b"SET", b"key", value]);
                        }
                        let mut replies = conn.exchange(&commands).await.unwrap();
                        let expected: Vec<Owned> = values.into_iter().map(Owned::Bulk).collect();
                        assert_eq!(owned_all(&mut replies), expected);
                        idle.put(&node, conn);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }
}
