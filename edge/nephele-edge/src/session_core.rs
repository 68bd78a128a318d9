//! The agent's session with the control plane as a state machine without IO:
//! `handle(now, input) → effects`, with time as an argument, so reconnects, backoff,
//! replica rotation, the Welcome timeout, heartbeats, notices and removal are tested on
//! a virtual clock. The shell ([`crate::session`]) dials, reads and writes frames, and
//! does what the effects say; it sleeps until [`SessionCore::deadline`] and then
//! hands in [`Input::Tick`].
//!
//! | phase             | on                                   | next                                     |
//! |-------------------|--------------------------------------|------------------------------------------|
//! | waiting           | deadline passed                      | connecting (this replica)                |
//! | connecting        | connected, `Hello` sent              | awaiting Welcome (10 s)                  |
//! | connecting        | failed                               | waiting; next replica; backoff ×2, ≤10 s |
//! | awaiting Welcome  | `Welcome`                            | serving; heartbeat now, then every interval |
//! | awaiting Welcome  | `Refused`, other frame, end, timeout | waiting, as a failed connect             |
//! | serving           | `DesiredState`, `UsageAck`           | serving (applied, acknowledged)          |
//! | serving           | report now (a desired state applied) | serving; heartbeat now, then every interval |
//! | serving           | stream ended, write failed, `Refused`, second `Welcome` | waiting 200 ms ±20%, same replica |
//! | serving           | silent past the idle timeout         | waiting 200 ms ±20%, next replica        |
//!
//! A `Refused` with `Unauthorized` (the device deleted, or its certificate
//! superseded) also marks the device removed; a later `Welcome` (the removal undone)
//! clears it. Every wait is jittered ±20% from the core's own seeded generator, so the
//! schedule is reproducible in tests and spread across a fleet in production.

use std::time::{Duration, Instant};

use nephele_proto::{CloudMessage, DesiredState, ErrorCode};

/// The schedule a session keeps.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The control-plane replicas, in the order they are tried (`--server A,B`).
    pub servers: Vec<String>,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// How long a session lives without hearing from the control plane: the longest
    /// partition ridden out on the same session, and how long a dead replica keeps the
    /// agent before it tries the next.
    pub idle_timeout: Duration,
    /// How long the control plane has to answer `Hello` with `Welcome`.
    pub welcome_timeout: Duration,
    /// The first wait after a failure, and the wait after an established session ends.
    pub min_backoff: Duration,
    /// The longest wait between attempts.
    pub max_backoff: Duration,
    /// The longest wait before trying the next replica after one failed.
    pub next_replica_backoff: Duration,
    /// The shortest heartbeat interval accepted from a `Welcome`.
    pub min_heartbeat: Duration,
}

impl SessionConfig {
    /// The agent's schedule for `servers` (comma-separated replicas). Alone, a control
    /// plane gets 10 s to connect and 15 s of silence before the session is given up.
    /// With other replicas to try, a dead one should not hold the agent: 4 s to connect
    /// and 6 s of silence (its UDP port does not refuse, it stays silent), so partitions
    /// longer than that end in a reconnect, which reloads nothing.
    pub fn for_servers(list: &str) -> SessionConfig {
        let connect_timeout = crate::servers::connect_timeout(list, Duration::from_secs(10));
        let servers: Vec<String> = crate::servers::servers(list)
            .into_iter()
            .map(str::to_string)
            .collect();
        let idle_timeout = if servers.len() > 1 {
            Duration::from_secs(6)
        } else {
            nephele_net::IDLE_TIMEOUT
        };
        SessionConfig {
            servers,
            connect_timeout,
            idle_timeout,
            welcome_timeout: Duration::from_secs(10),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            next_replica_backoff: Duration::from_millis(400),
            min_heartbeat: Duration::from_millis(100),
        }
    }
}

/// What happened, as the shell saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The connection the last [`Effect::Connect`] asked for is up, its control stream
    /// open and `Hello` sent.
    Connected,
    /// The last [`Effect::Connect`] failed (dial, handshake, stream or `Hello`).
    ConnectFailed(String),
    /// A frame on the control stream.
    Frame(CloudMessage),
    /// The control stream ended or could not be read.
    StreamClosed(String),
    /// The connection timed out: the replica fell silent for the idle timeout (dead,
    /// deposed, or cut off).
    Silent(String),
    /// A write on the control stream failed.
    WriteFailed(String),
    /// The interruption deadline (SIGUSR1) is now this.
    Notice(Option<Instant>),
    /// Time passed; due when `now` reaches [`SessionCore::deadline`].
    Tick,
    /// The agent applied a desired state: what it now runs (or failed to load) is
    /// reported at once, not at the next heartbeat, so a deployment is seen Ready in
    /// the time its model takes to load whatever the heartbeat interval.
    ReportNow,
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Dial this replica, open the control stream and send `Hello`, within `timeout`,
    /// for a connection that ends after `idle_timeout` of silence; then hand in
    /// [`Input::Connected`] or [`Input::ConnectFailed`].
    Connect {
        server: String,
        timeout: Duration,
        idle_timeout: Duration,
    },
    /// The session is established: start what runs per session (requests from the
    /// region, certificate renewal) and count it.
    Established { region: String },
    /// Send heartbeat `seq`, then the usage not yet acknowledged.
    SendHeartbeat { seq: u64 },
    /// Tell the control plane this node goes away within `seconds`.
    SendNotice { seconds: u32 },
    /// A desired state to apply (jobs at once, models through the reconciler).
    Apply(DesiredState),
    /// The control plane counted the usage records up to this sequence number.
    AckUsage { up_to: u64 },
    /// The control plane removed this device: stop serving, keep the reason.
    MarkRemoved { reason: String },
    /// The control plane accepted the device again: it is a member once more.
    ClearRemoved,
    /// Close the connection. `established` tells a session that ended (`reason`) from
    /// an attempt that failed; the next attempt comes after `retry_in`.
    Close {
        reason: String,
        established: bool,
        retry_in: Duration,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Waiting {
        until: Instant,
    },
    Connecting,
    AwaitingWelcome {
        deadline: Instant,
    },
    Serving {
        next_heartbeat: Instant,
        interval: Duration,
        seq: u64,
    },
}

/// One agent's session with the control plane, across reconnects.
#[derive(Debug, Clone)]
pub struct SessionCore {
    config: SessionConfig,
    phase: Phase,
    /// Index into `config.servers` of the replica tried now.
    replica: usize,
    /// The wait after the next failed attempt (before jitter).
    backoff: Duration,
    /// The interruption deadline, if SIGUSR1 announced one.
    notice: Option<Instant>,
    /// Why the control plane removed this device, while it is removed.
    removed: Option<String>,
    /// xorshift64* state for the jitter.
    rng: u64,
}

impl SessionCore {
    /// A core that starts by connecting at `now`. `removed` is the removal kept on the
    /// device (if any); `seed` seeds the jitter.
    pub fn new(
        config: SessionConfig,
        now: Instant,
        seed: u64,
        removed: Option<String>,
    ) -> SessionCore {
        let backoff = config.min_backoff;
        SessionCore {
            config,
            phase: Phase::Waiting { until: now },
            replica: 0,
            backoff,
            notice: None,
            removed,
            rng: seed_state(seed),
        }
    }

    /// When the core next needs a [`Input::Tick`]; none while a connection attempt is
    /// the shell's to finish.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Waiting { until } => Some(*until),
            Phase::Connecting => None,
            Phase::AwaitingWelcome { deadline } => Some(*deadline),
            Phase::Serving { next_heartbeat, .. } => Some(*next_heartbeat),
        }
    }

    /// Whether a session is established (Welcome received, not yet ended).
    pub fn is_serving(&self) -> bool {
        matches!(self.phase, Phase::Serving { .. })
    }

    /// The replica tried now, or last.
    pub fn server(&self) -> &str {
        self.config
            .servers
            .get(self.replica)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// Advances the session by one input at `now`.
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Effect> {
        let mut effects = Vec::new();
        match input {
            Input::Tick => self.tick(now, &mut effects),
            Input::ReportNow => {
                if let Phase::Serving {
                    next_heartbeat,
                    interval,
                    seq,
                } = &mut self.phase
                {
                    *seq += 1;
                    *next_heartbeat = now + *interval;
                    effects.push(Effect::SendHeartbeat { seq: *seq });
                }
            }
            Input::Notice(deadline) => {
                self.notice = deadline;
                if self.is_serving() {
                    self.tell_notice(now, &mut effects);
                }
            }
            Input::Connected => {
                if self.phase == Phase::Connecting {
                    self.phase = Phase::AwaitingWelcome {
                        deadline: now + self.config.welcome_timeout,
                    };
                }
            }
            Input::ConnectFailed(error) => {
                if self.phase == Phase::Connecting {
                    self.fail(now, error, &mut effects);
                }
            }
            Input::Frame(message) => self.frame(now, message, &mut effects),
            Input::Silent(reason) => match self.phase {
                Phase::AwaitingWelcome { .. } => self.fail(now, reason, &mut effects),
                Phase::Serving { .. } => {
                    // A replica that went silent is likelier dead than cut off (a cut
                    // that long usually cuts every replica): the next one first.
                    self.replica = (self.replica + 1) % self.config.servers.len().max(1);
                    self.end(now, reason, &mut effects)
                }
                Phase::Waiting { .. } | Phase::Connecting => {}
            },
            Input::StreamClosed(reason) | Input::WriteFailed(reason) => match self.phase {
                Phase::AwaitingWelcome { .. } => self.fail(now, reason, &mut effects),
                Phase::Serving { .. } => self.end(now, reason, &mut effects),
                // Left over from a session already closed.
                Phase::Waiting { .. } | Phase::Connecting => {}
            },
        }
        effects
    }

    fn tick(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        match &mut self.phase {
            Phase::Waiting { until } if now >= *until => {
                self.phase = Phase::Connecting;
                effects.push(Effect::Connect {
                    server: self.server().to_string(),
                    timeout: self.config.connect_timeout,
                    idle_timeout: self.config.idle_timeout,
                });
            }
            Phase::AwaitingWelcome { deadline } if now >= *deadline => {
                let waited = self.config.welcome_timeout.as_secs_f64();
                self.fail(now, format!("no Welcome within {waited} s"), effects);
            }
            Phase::Serving {
                next_heartbeat,
                interval,
                seq,
            } if now >= *next_heartbeat => {
                *seq += 1;
                // A shell that was late does not make up for it with a burst.
                *next_heartbeat = now + *interval;
                effects.push(Effect::SendHeartbeat { seq: *seq });
            }
            _ => {}
        }
    }

    fn frame(&mut self, now: Instant, message: CloudMessage, effects: &mut Vec<Effect>) {
        match (&self.phase, message) {
            (Phase::AwaitingWelcome { .. }, CloudMessage::Welcome(welcome)) => {
                if self.removed.take().is_some() {
                    effects.push(Effect::ClearRemoved);
                }
                self.backoff = self.config.min_backoff;
                let interval = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms))
                    .max(self.config.min_heartbeat);
                self.phase = Phase::Serving {
                    next_heartbeat: now + interval,
                    interval,
                    seq: 1,
                };
                effects.push(Effect::Established {
                    region: welcome.region,
                });
                self.tell_notice(now, effects);
                effects.push(Effect::SendHeartbeat { seq: 1 });
            }
            (Phase::AwaitingWelcome { .. }, CloudMessage::Refused(error)) => {
                self.refused(&error, effects);
                let reason = format!("the control plane refused this agent: {}", error.message);
                self.fail(now, reason, effects);
            }
            (Phase::AwaitingWelcome { .. }, other) => {
                self.fail(now, format!("unexpected first message {other:?}"), effects)
            }
            (Phase::Serving { .. }, CloudMessage::DesiredState(desired)) => {
                effects.push(Effect::Apply(desired))
            }
            (Phase::Serving { .. }, CloudMessage::UsageAck { up_to }) => {
                effects.push(Effect::AckUsage { up_to })
            }
            (Phase::Serving { .. }, CloudMessage::Refused(error)) => {
                self.refused(&error, effects);
                self.end(now, format!("refused: {}", error.message), effects);
            }
            (Phase::Serving { .. }, CloudMessage::Welcome(_)) => {
                self.end(now, "protocol violation: a second Welcome".into(), effects)
            }
            // No stream to read from in these phases: a frame here is stale.
            (Phase::Waiting { .. } | Phase::Connecting, _) => {}
        }
    }

    fn refused(&mut self, error: &nephele_proto::ErrorFrame, effects: &mut Vec<Effect>) {
        if error.code == ErrorCode::Unauthorized
            && self.removed.as_deref() != Some(error.message.as_str())
        {
            self.removed = Some(error.message.clone());
            effects.push(Effect::MarkRemoved {
                reason: error.message.clone(),
            });
        }
    }

    fn tell_notice(&self, now: Instant, effects: &mut Vec<Effect>) {
        if let Some(seconds) = notice_seconds(self.notice, now) {
            effects.push(Effect::SendNotice { seconds });
        }
    }

    /// An attempt failed before a session was established: the next replica (if there
    /// are others, soon), else the same one after a doubled backoff.
    fn fail(&mut self, now: Instant, reason: String, effects: &mut Vec<Effect>) {
        if self.config.servers.len() > 1 {
            self.replica = (self.replica + 1) % self.config.servers.len();
            self.backoff = self.backoff.min(self.config.next_replica_backoff);
        }
        let wait = self.backoff;
        self.retry_after(now, wait, reason, false, effects);
    }

    /// An established session ended: the same replica again, soon.
    fn end(&mut self, now: Instant, reason: String, effects: &mut Vec<Effect>) {
        let wait = self.config.min_backoff;
        self.retry_after(now, wait, reason, true, effects);
    }

    /// Closes the connection and waits `wait` (jittered) before the next attempt; the
    /// attempt after that, if it fails too, waits twice as long.
    fn retry_after(
        &mut self,
        now: Instant,
        wait: Duration,
        reason: String,
        established: bool,
        effects: &mut Vec<Effect>,
    ) {
        let retry_in = self.jittered(wait);
        self.backoff = (wait * 2).min(self.config.max_backoff);
        self.phase = Phase::Waiting {
            until: now + retry_in,
        };
        effects.push(Effect::Close {
            reason,
            established,
            retry_in,
        });
    }

    /// `wait` × a factor in [0.8, 1.2).
    fn jittered(&mut self, wait: Duration) -> Duration {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let draw = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        let unit = draw as f64 / (1u64 << 53) as f64;
        wait.mul_f64(0.8 + unit * 0.4)
    }
}

/// A xorshift state from any seed: mixed (splitmix64) so that seeds one bit apart
/// give unrelated schedules, and never zero (xorshift's fixed point).
fn seed_state(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z.max(1)
}

/// The whole seconds left (rounded up) until an interruption deadline; none once it
/// has passed.
pub fn notice_seconds(deadline: Option<Instant>, now: Instant) -> Option<u32> {
    let left = deadline?.checked_duration_since(now)?;
    if left.is_zero() {
        return None;
    }
    Some(u32::try_from(left.as_millis().div_ceil(1000)).unwrap_or(u32::MAX))
}

#[cfg(test)]
#[path = "session_core_tests.rs"]
mod tests;
