//! Answers one consumer command as nsqd's `protocol_v2.go` does: which commands each state
//! takes, then a function per command. The connection's loop does the I/O; here a command
//! changes the connection's state, tells the dispatcher, and queues its response frame.
//!
//! FIN, REQ and TOUCH are kept until the run of them ends (another command, or the end of
//! what was read) and then settled together ([`Connection::settle_pending`]): one lock of
//! the dispatcher for the run, and each refusal still written in its place, before anything
//! a later command answers.

use std::time::Duration;

use bytes::Bytes;

use super::{response, Connection, Next, Phase};
use crate::sink::serve::command::{ClientCommand, ErrorFrame};
use crate::sink::serve::config::DEFAULT_MAX_COMMANDS_BEFORE_SUB;
use crate::sink::serve::dispatch::Settle;
use crate::sink::serve::identify::identify;

impl Connection {
    /// Answers one command, as nsqd's `protocol_v2.go` `Exec` does.
    pub(super) fn answer(&mut self, command: ClientCommand) -> Result<Next, ErrorFrame> {
        if !matches!(
            command,
            ClientCommand::Fin(_) | ClientCommand::Req(..) | ClientCommand::Touch(_)
        ) {
            self.settle_pending();
        }
        let name = command_name(&command);
        self.admit(&command, name)?;
        if !self.in_state(&command, name)? {
            return Ok(Next::Continue);
        }
        match command {
            ClientCommand::Identify(body) => return self.identify(&body),
            ClientCommand::Auth(secret) => self.auth(&secret)?,
            ClientCommand::Sub { topic, channel } => self.sub(&topic, &channel)?,
            ClientCommand::Rdy(count) => self.rdy(count)?,
            ClientCommand::Fin(id) => self.pending.push(Settle::Finish(id)),
            ClientCommand::Req(id, delay_ms) => {
                // A REQ's delay is at most the endpoint's longest.
                let delay = Duration::from_millis(delay_ms).min(self.shared.config.max_req_timeout);
                self.pending.push(Settle::Requeue(id, delay));
            }
            ClientCommand::Touch(id) => self.pending.push(Settle::Touch(id)),
            ClientCommand::Nop => {}
            ClientCommand::Cls => self.cls(),
            ClientCommand::Publish(name) => return Err(self.refuse_publish(name)),
        }
        Ok(Next::Continue)
    }

    /// Refuses any command past the limit before SUB, and any but IDENTIFY before TLS when
    /// the endpoint requires it.
    fn admit(&mut self, command: &ClientCommand, name: &str) -> Result<(), ErrorFrame> {
        if self.phase == Phase::Init {
            self.commands_before_sub += 1;
            if self.commands_before_sub > DEFAULT_MAX_COMMANDS_BEFORE_SUB {
                return Err(ErrorFrame::fatal(
                    "E_INVALID",
                    format_args!("more than {DEFAULT_MAX_COMMANDS_BEFORE_SUB} commands before SUB"),
                ));
            }
        }
        let config = &self.shared.config;
        let tls_required = config.tls.as_ref().is_some_and(|t| t.required);
        if tls_required && !self.info.tls && !matches!(command, ClientCommand::Identify(_)) {
            return Err(ErrorFrame::fatal(
                "E_INVALID",
                format_args!("cannot {name} in current state (TLS required)"),
            ));
        }
        Ok(())
    }

    /// Whether `command` is taken in the connection's state: `Ok(false)` for one nsqd
    /// ignores (RDY after CLS), an error for one it refuses.
    fn in_state(&self, command: &ClientCommand, name: &str) -> Result<bool, ErrorFrame> {
        let taken = match command {
            ClientCommand::Identify(_) | ClientCommand::Auth(_) | ClientCommand::Sub { .. } => {
                self.phase == Phase::Init
            }
            // nsqd ignores RDY after CLS.
            ClientCommand::Rdy(_) if self.phase == Phase::Closing => return Ok(false),
            ClientCommand::Rdy(_) | ClientCommand::Cls => self.phase == Phase::Subscribed,
            // What the consumer holds may still be answered after CLS.
            ClientCommand::Fin(_) | ClientCommand::Req(..) | ClientCommand::Touch(_) => {
                matches!(self.phase, Phase::Subscribed | Phase::Closing)
            }
            ClientCommand::Nop | ClientCommand::Publish(_) => true,
        };
        if taken {
            Ok(true)
        } else {
            Err(ErrorFrame::fatal(
                "E_INVALID",
                format_args!("cannot {name} in current state"),
            ))
        }
    }

    /// IDENTIFY: the client's features, answered with the endpoint's.
    fn identify(&mut self, body: &Bytes) -> Result<Next, ErrorFrame> {
        let got = identify(body, &self.shared.config, self.heartbeat, self.msg_timeout)?;
        self.heartbeat = got.heartbeat_interval;
        self.msg_timeout = got.msg_timeout;
        self.info.client_id = got.client_id;
        self.info.hostname = got.hostname;
        self.info.user_agent = got.user_agent;
        response(&mut self.out, &got.response);
        Ok(if got.tls {
            Next::UpgradeTls
        } else {
            Next::Continue
        })
    }

    /// AUTH: the secret, once, checked against the endpoint's.
    fn auth(&mut self, secret: &Bytes) -> Result<(), ErrorFrame> {
        if self.info.authed {
            return Err(ErrorFrame::fatal("E_INVALID", "AUTH already set"));
        }
        let Some(expected) = &self.shared.config.auth_secret else {
            return Err(ErrorFrame::fatal("E_AUTH_DISABLED", "AUTH disabled"));
        };
        if !expected.matches(secret) {
            return Err(ErrorFrame::fatal("E_AUTH_FAILED", "AUTH failed"));
        }
        self.info.authed = true;
        response(
            &mut self.out,
            br#"{"identity":"consumer","identity_url":"","permission_count":1}"#,
        );
        Ok(())
    }

    /// SUB: valid names, after AUTH when a secret is set, of the one topic and channel
    /// served; the consumer joins the dispatcher.
    fn sub(&mut self, topic: &Bytes, channel: &Bytes) -> Result<(), ErrorFrame> {
        let config = &self.shared.config;
        if self.heartbeat.is_none() {
            return Err(ErrorFrame::fatal(
                "E_INVALID",
                "cannot SUB with heartbeats disabled",
            ));
        }
        let topic = String::from_utf8_lossy(topic);
        let channel = String::from_utf8_lossy(channel);
        if !crate::nsq::is_valid_name(&topic) {
            return Err(ErrorFrame::fatal(
                "E_BAD_TOPIC",
                format_args!("SUB topic name {topic:?} is not valid"),
            ));
        }
        if !crate::nsq::is_valid_name(&channel) {
            return Err(ErrorFrame::fatal(
                "E_BAD_CHANNEL",
                format_args!("SUB channel name {channel:?} is not valid"),
            ));
        }
        if config.auth_secret.is_some() && !self.info.authed {
            return Err(ErrorFrame::fatal(
                "E_AUTH_FIRST",
                "AUTH required before SUB",
            ));
        }
        if topic != config.topic {
            return Err(ErrorFrame::fatal(
                "E_BAD_TOPIC",
                format_args!("SUB topic {topic:?} is not served here: {}", self.served()),
            ));
        }
        if channel != config.channel {
            return Err(ErrorFrame::fatal(
                "E_BAD_CHANNEL",
                format_args!(
                    "SUB channel {channel:?} is not served here: {}",
                    self.served()
                ),
            ));
        }
        self.phase = Phase::Subscribed;
        tracing::info!(client = self.id, remote = %self.info.remote_address, user_agent = %self.info.user_agent, tls = self.info.tls, "Consumer subscribed.");
        self.shared.dispatcher.subscribe(
            self.id,
            self.info.clone(),
            self.msg_timeout,
            self.wake.clone(),
        );
        response(&mut self.out, b"OK");
        Ok(())
    }

    /// RDY: how many messages the consumer may hold, up to the endpoint's most.
    fn rdy(&mut self, count: u64) -> Result<(), ErrorFrame> {
        let max = u64::from(self.shared.config.max_rdy_count);
        if count > max {
            return Err(ErrorFrame::fatal(
                "E_INVALID",
                format_args!("RDY count {count} out of range 0-{max}"),
            ));
        }
        self.held = self
            .shared
            .dispatcher
            .set_rdy(self.id, count, &mut self.out);
        Ok(())
    }

    /// Settles the FINs (a message the consumer holds is done), REQs (it goes back) and
    /// TOUCHes (it gets its timeout again) kept so far, in order; each one refused gets its
    /// non-fatal error frame, as nsqd answers it.
    pub(super) fn settle_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut refused = Vec::new();
        self.held =
            self.shared
                .dispatcher
                .settle(self.id, &self.pending, &mut self.out, &mut refused);
        if refused.is_empty() {
            self.pending.clear();
            return;
        }
        for (index, why) in refused {
            let error = match self.pending[index] {
                Settle::Finish(id) => {
                    ErrorFrame::non_fatal("E_FIN_FAILED", format_args!("FIN {id} failed {why}"))
                }
                Settle::Requeue(id, _) => {
                    ErrorFrame::non_fatal("E_REQ_FAILED", format_args!("REQ {id} failed {why}"))
                }
                Settle::Touch(id) => {
                    ErrorFrame::non_fatal("E_TOUCH_FAILED", format_args!("TOUCH {id} failed {why}"))
                }
            };
            self.refuse(&error);
        }
        self.pending.clear();
        // The frames the run made room for follow its refusals.
        self.held = self.shared.dispatcher.take_frames(self.id, &mut self.out);
    }

    /// CLS: no more messages; what the consumer holds may still be answered.
    fn cls(&mut self) {
        self.phase = Phase::Closing;
        self.shared.dispatcher.close(self.id);
        response(&mut self.out, b"CLOSE_WAIT");
    }

    /// PUB, MPUB and DPUB: this endpoint takes no messages.
    fn refuse_publish(&self, name: &str) -> ErrorFrame {
        ErrorFrame::fatal(
            "E_INVALID",
            format_args!(
                "{name} refused: this endpoint only serves consumers ({}); publish to nsqd",
                self.served()
            ),
        )
    }

    fn served(&self) -> String {
        let config = &self.shared.config;
        format!(
            "this endpoint serves topic {:?} channel {:?}",
            config.topic, config.channel
        )
    }
}

fn command_name(command: &ClientCommand) -> &'static str {
    match command {
        ClientCommand::Identify(_) => "IDENTIFY",
        ClientCommand::Auth(_) => "AUTH",
        ClientCommand::Sub { .. } => "SUB",
        ClientCommand::Rdy(_) => "RDY",
        ClientCommand::Fin(_) => "FIN",
        ClientCommand::Req(..) => "REQ",
        ClientCommand::Touch(_) => "TOUCH",
        ClientCommand::Nop => "NOP",
        ClientCommand::Cls => "CLS",
        ClientCommand::Publish(name) => name,
    }
}
