//! Per-client sessions of a stateful model (`--state INPUT=OUTPUT` at push): the
//! recurrent state a model returns is kept on the device under the client's session id
//! and fed back on its next request, so a streaming client sends only the new chunk.
//!
//! Pure bookkeeping with the clock as an argument (the serving shell passes
//! `Instant::now()`), as the other cores are:
//! - a session unused for longer than the idle timeout is dropped;
//! - the states held stay within a memory bound: past it, the least recently used
//!   sessions are dropped first (and counted), never the one being stored;
//! - a session is *checked out* while its request runs: a second request on the same
//!   session meanwhile is refused (its order relative to the first would be a race), as
//!   Triton's sequence batcher runs one request per sequence at a time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nephele_runtime::graph_model::NamedTensor;

/// Default idle timeout of a session.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(300);
/// Default bound of the state bytes one deployment keeps for its sessions.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;
/// Longest session id accepted.
pub const MAX_ID_LEN: usize = 128;

/// Bytes a state takes here (values are held as f64).
fn bytes_of(state: &HashMap<String, NamedTensor>) -> usize {
    state
        .values()
        .map(|t| t.data.len() * std::mem::size_of::<f64>() + t.shape.len() * 8 + 32)
        .sum()
}

struct Session {
    /// Next state, by model input name; `None` while checked out.
    state: Option<HashMap<String, NamedTensor>>,
    bytes: usize,
    last_used: Instant,
    /// Requests completed in this session.
    steps: u64,
}

/// What a checkout gives the request.
#[derive(Debug, PartialEq)]
pub struct Checkout {
    /// The state to feed (empty on a new session: the caller uses zeros).
    pub state: HashMap<String, NamedTensor>,
    /// Requests this session completed before.
    pub step: u64,
}

/// Why a session cannot be used now.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionError {
    /// Another request of this session is running.
    Busy,
    /// The id is empty, too long or has characters other than `[A-Za-z0-9._:-]`.
    BadId(String),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Busy => write!(
                f,
                "another request of this session is running; send a session's chunks one after another"
            ),
            SessionError::BadId(why) => write!(f, "{why}"),
        }
    }
}

/// The sessions of one deployment.
pub struct SessionStore {
    idle: Duration,
    max_bytes: usize,
    sessions: HashMap<String, Session>,
    bytes: usize,
    /// Sessions dropped for the memory bound / for being idle, since start.
    pub evicted: u64,
    pub expired: u64,
}

/// Counters for `/v1/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SessionStats {
    pub sessions: usize,
    pub bytes: usize,
    pub max_bytes: usize,
    pub idle_timeout_s: u64,
    pub evicted: u64,
    pub expired: u64,
}

impl SessionStore {
    pub fn new(idle: Duration, max_bytes: usize) -> Self {
        SessionStore {
            idle,
            max_bytes,
            sessions: HashMap::new(),
            bytes: 0,
            evicted: 0,
            expired: 0,
        }
    }

    pub fn check_id(id: &str) -> Result<(), SessionError> {
        if id.is_empty() || id.len() > MAX_ID_LEN {
            return Err(SessionError::BadId(format!(
                "a session id has 1 to {MAX_ID_LEN} characters"
            )));
        }
        if let Some(c) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
        {
            return Err(SessionError::BadId(format!(
                "session id {id:?} has {c:?}; use letters, digits and . _ : -"
            )));
        }
        Ok(())
    }

    /// Drops sessions idle for longer than the timeout (never one checked out).
    pub fn expire(&mut self, now: Instant) {
        let idle = self.idle;
        let before = self.sessions.len();
        let mut freed = 0;
        self.sessions.retain(|_, s| {
            let keep = s.state.is_none() || now.saturating_duration_since(s.last_used) <= idle;
            if !keep {
                freed += s.bytes;
            }
            keep
        });
        self.bytes -= freed;
        self.expired += (before - self.sessions.len()) as u64;
    }

    /// Takes the state of session `id` for one request (a new session has none).
    pub fn checkout(&mut self, id: &str, now: Instant) -> Result<Checkout, SessionError> {
        Self::check_id(id)?;
        self.expire(now);
        match self.sessions.get_mut(id) {
            Some(session) => {
                let state = session.state.take().ok_or(SessionError::Busy)?;
                session.last_used = now;
                self.bytes -= session.bytes;
                session.bytes = 0;
                Ok(Checkout {
                    state,
                    step: session.steps,
                })
            }
            None => {
                self.sessions.insert(
                    id.to_string(),
                    Session {
                        state: None,
                        bytes: 0,
                        last_used: now,
                        steps: 0,
                    },
                );
                Ok(Checkout {
                    state: HashMap::new(),
                    step: 0,
                })
            }
        }
    }

    /// Stores the next state of a checked-out session after its request ran (`end`
    /// closes the session instead). Least recently used sessions are dropped while the
    /// bound is exceeded.
    pub fn store(
        &mut self,
        id: &str,
        state: HashMap<String, NamedTensor>,
        end: bool,
        now: Instant,
    ) {
        if end {
            if let Some(old) = self.sessions.remove(id) {
                self.bytes -= old.bytes;
            }
            return;
        }
        let bytes = bytes_of(&state);
        let session = self.sessions.entry(id.to_string()).or_insert(Session {
            state: None,
            bytes: 0,
            last_used: now,
            steps: 0,
        });
        self.bytes -= session.bytes;
        session.state = Some(state);
        session.bytes = bytes;
        session.last_used = now;
        session.steps += 1;
        self.bytes += bytes;
        while self.bytes > self.max_bytes {
            let victim = self
                .sessions
                .iter()
                .filter(|(k, s)| k.as_str() != id && s.state.is_some())
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else {
                break;
            };
            if let Some(old) = self.sessions.remove(&victim) {
                self.bytes -= old.bytes;
                self.evicted += 1;
            }
        }
    }

    /// Gives a checked-out session back unchanged (its request failed): the state it had
    /// stays, so the client may retry the chunk.
    pub fn release(&mut self, id: &str, state: HashMap<String, NamedTensor>, step: u64) {
        if let Some(session) = self.sessions.get_mut(id) {
            if session.state.is_none() {
                let bytes = bytes_of(&state);
                if step == 0 && state.is_empty() {
                    self.sessions.remove(id);
                    return;
                }
                session.state = Some(state);
                session.bytes = bytes;
                self.bytes += bytes;
            }
        }
    }

    pub fn stats(&self) -> SessionStats {
        SessionStats {
            sessions: self.sessions.len(),
            bytes: self.bytes,
            max_bytes: self.max_bytes,
            idle_timeout_s: self.idle.as_secs(),
            evicted: self.evicted,
            expired: self.expired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state(v: f64, n: usize) -> HashMap<String, NamedTensor> {
        HashMap::from([(
            "h".to_string(),
            NamedTensor {
                dtype: "f32".into(),
                shape: vec![n],
                data: vec![v; n],
            },
        )])
    }

    #[test]
    fn a_session_gets_back_what_it_stored_and_counts_steps() {
        let t0 = Instant::now();
        let mut store = SessionStore::new(Duration::from_secs(60), 1 << 20);
        let first = store.checkout("a", t0).expect("new");
        assert!(first.state.is_empty());
        assert_eq!(first.step, 0);
        // A second request while the first runs is refused.
        assert_eq!(store.checkout("a", t0), Err(SessionError::Busy));
        store.store("a", state(1.5, 4), false, t0);
        let second = store
            .checkout("a", t0 + Duration::from_secs(1))
            .expect("again");
        assert_eq!(second.state, state(1.5, 4));
        assert_eq!(second.step, 1);
        store.store("a", state(2.5, 4), true, t0);
        assert_eq!(store.stats().sessions, 0);
        assert_eq!(store.stats().bytes, 0);
    }

    #[test]
    fn idle_sessions_expire_and_bad_ids_are_refused() {
        let t0 = Instant::now();
        let mut store = SessionStore::new(Duration::from_secs(10), 1 << 20);
        store.checkout("a", t0).expect("new");
        store.store("a", state(1.0, 4), false, t0);
        let later = store
            .checkout("a", t0 + Duration::from_secs(11))
            .expect("new again");
        assert!(later.state.is_empty(), "the idle session was dropped");
        assert_eq!(store.stats().expired, 1);
        assert!(matches!(
            store.checkout("", t0),
            Err(SessionError::BadId(_))
        ));
        assert!(matches!(
            store.checkout("a b", t0),
            Err(SessionError::BadId(_))
        ));
    }

    #[test]
    fn a_failed_request_leaves_the_state_as_it_was() {
        let t0 = Instant::now();
        let mut store = SessionStore::new(Duration::from_secs(60), 1 << 20);
        store.checkout("a", t0).expect("new");
        store.store("a", state(3.0, 2), false, t0);
        let out = store.checkout("a", t0).expect("out");
        store.release("a", out.state, out.step);
        assert_eq!(store.checkout("a", t0).expect("back").state, state(3.0, 2));
    }

    proptest! {
        /// Whatever the order of requests, the bytes held never exceed the bound once a
        /// store returns (a single state larger than the bound stays alone), and the
        /// books add up.
        #[test]
        fn the_memory_bound_holds(ops in proptest::collection::vec((0u8..6, 1usize..64, any::<bool>()), 1..200)) {
            let t0 = Instant::now();
            let max = 2_000;
            let mut store = SessionStore::new(Duration::from_secs(1_000), max);
            for (k, (id, n, end)) in ops.into_iter().enumerate() {
                let id = format!("s{id}");
                let now = t0 + Duration::from_millis(k as u64);
                if store.checkout(&id, now).is_ok() {
                    let s = state(k as f64, n);
                    let alone = bytes_of(&s);
                    store.store(&id, s, end, now);
                    let stats = store.stats();
                    prop_assert!(stats.bytes <= max.max(alone), "{stats:?}");
                    let sum: usize = store.sessions.values().map(|s| s.bytes).sum();
                    prop_assert_eq!(sum, stats.bytes);
                }
            }
        }
    }
}
