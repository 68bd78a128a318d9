//! The control plane's state in an etcd cluster (v3 API, through its JSON gateway on
//! the client port), the alternative to the embedded redb file when the state must
//! outlive one machine. Each table is a key prefix: `<prefix><table>/<key>`, values the
//! same JSON as in redb.
//!
//! Consistency, stated as etcd documents it:
//! - every write is one etcd transaction (a put, a delete, or several puts and deletes
//!   together), committed by a quorum of members before it returns;
//! - before proposing a write the store checks that the cluster has a quorum now (a
//!   linearizable read, which etcd serves only through its leader with a quorum); when
//!   it has none the write is refused and certainly not made. A write proposed after
//!   that check whose answer does not come in time is reported as such: etcd may still
//!   apply it when the cluster recovers, so the error says to read back before retrying;
//! - reads are linearizable; when the cluster has lost its quorum they fall back to the
//!   connected member's own copy (serializable), which may lag, so the control plane
//!   keeps answering reads and serving agents while it refuses writes.
//!
//! Endpoints are tried in order; a member that cannot be reached is skipped and the
//! next one kept for later calls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::StoreError;

/// How long a read may take before the cluster is taken to have no quorum.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// After a linearizable read found no quorum, reads go straight to the member's own
/// copy for this long before trying linearizable again (so that a control plane
/// without quorum does not wait out the timeout on every read).
const DEGRADED_FOR: Duration = Duration::from_secs(5);
/// How long a write may take: above etcd's own request timeout (about 7 s on loss of
/// quorum), so its answer, not ours, says what happened.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Keys and their values, in key order.
pub type KeyValues = Vec<(String, Vec<u8>)>;

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
}

/// A client of one etcd cluster.
pub struct Etcd {
    endpoints: Vec<String>,
    /// The endpoint that answered last.
    current: AtomicUsize,
    prefix: String,
    agent: ureq::Agent,
    /// Until when reads skip the linearizable attempt (the cluster had no quorum).
    degraded_until: Mutex<Option<Instant>>,
    /// Set once this replica leads: every write is made only while the leader key is
    /// still the one this replica created (its create revision), so a replica deposed
    /// while paused or cut off cannot write (fencing).
    fence: Mutex<Option<(String, i64)>>,
}

/// The outcome of a campaign for the leader key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Campaign {
    /// This replica holds the key now, created at this revision.
    Won { revision: i64 },
    /// Another holds it; its value.
    Held { by: Vec<u8> },
}

/// What one call to a member gave.
enum Answer {
    Ok(Value),
    /// The cluster answered that it could not serve the request now (no leader, no
    /// quorum, timed out): etcd's gRPC codes Unavailable (14) and DeadlineExceeded (4),
    /// and its "request timed out" and "context deadline exceeded".
    Unavailable(String),
}

impl Etcd {
    /// Connects to the cluster at `endpoints` (`http://host:port`, its client URLs) and
    /// keeps the control plane's keys under `prefix`. Fails when no endpoint answers.
    pub fn connect(endpoints: &[String], prefix: &str) -> Result<Etcd, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Db("no etcd endpoints given".into()));
        }
        let prefix = if prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        let etcd = Etcd {
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            current: AtomicUsize::new(0),
            prefix,
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_connect(Some(Duration::from_secs(2)))
                .build()
                .into(),
            degraded_until: Mutex::new(None),
            fence: Mutex::new(None),
        };
        // Reachable at all (a member's own status needs no quorum).
        etcd.call("/v3/maintenance/status", &json!({}), READ_TIMEOUT)?;
        Ok(etcd)
    }

    /// The etcd key of `key` in `table`.
    pub fn key(&self, table: &str, key: &str) -> String {
        format!("{}{table}/{key}", self.prefix)
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let kvs = self.range(&json!({"key": B64.encode(key)}))?;
        Ok(kvs.into_iter().next().map(|(_, value)| value))
    }

    /// Every key starting with `prefix` and its value, in key order.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.range(&json!({
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix.as_bytes())),
        }))
    }

    /// Applies `ops` in one transaction, all or none, after checking for a quorum.
    pub fn txn(&self, ops: &[Op]) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.write(ops).map(|_| ())
    }

    /// [`Etcd::txn`], returning etcd's answer.
    fn write(&self, ops: &[Op]) -> Result<Value, StoreError> {
        self.check_quorum()?;
        let fence = self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let compare: Vec<Value> = fence
            .iter()
            .map(|(key, revision)| {
                json!({"key": B64.encode(key), "target": "CREATE", "result": "EQUAL",
                       "create_revision": revision.to_string()})
            })
            .collect();
        let success: Vec<Value> = ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value } => json!({"request_put": {
                    "key": B64.encode(key), "value": B64.encode(value)}}),
                Op::Delete { key } => json!({"request_delete_range": {"key": B64.encode(key)}}),
            })
            .collect();
        let request = json!({"compare": compare, "success": success});
        match self.call("/v3/kv/txn", &request, WRITE_TIMEOUT)? {
            Answer::Ok(value) if value["succeeded"] == Value::Bool(true) => Ok(value),
            Answer::Ok(_) => Err(StoreError::Fenced(
                "this control-plane replica is no longer the leader (another took over); \
                 the write was not made"
                    .into(),
            )),
            Answer::Unavailable(why) => Err(StoreError::Unavailable(format!(
                "etcd did not confirm the write ({why}); it may still be applied when the \
                 cluster recovers, so read it back before retrying"
            ))),
        }
    }

    /// Writes `value` at `key` unless the key exists; whether it was written. Not
    /// fenced: for what every replica may create once (the cluster CA, say).
    pub fn put_if_absent(&self, key: &str, value: &[u8]) -> Result<bool, StoreError> {
        self.check_quorum()?;
        let request = json!({
            "compare": [{"key": B64.encode(key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [{"request_put": {"key": B64.encode(key), "value": B64.encode(value)}}],
        });
        match self.call("/v3/kv/txn", &request, WRITE_TIMEOUT)? {
            Answer::Ok(value) => Ok(value["succeeded"] == Value::Bool(true)),
            Answer::Unavailable(why) => Err(StoreError::Unavailable(why)),
        }
    }

    /// A lease of `ttl_s` seconds; its id.
    pub fn grant_lease(&self, ttl_s: u64) -> Result<i64, StoreError> {
        match self.call(
            "/v3/lease/grant",
            &json!({"TTL": ttl_s.to_string()}),
            READ_TIMEOUT,
        )? {
            Answer::Ok(value) => {
                let id = number(&value["ID"]) as i64;
                if id == 0 {
                    return Err(StoreError::Db(format!("etcd granted no lease: {value}")));
                }
                Ok(id)
            }
            Answer::Unavailable(why) => Err(StoreError::Unavailable(why)),
        }
    }

    /// Ends lease `id` now (deleting the keys bound to it).
    pub fn revoke_lease(&self, id: i64) -> Result<(), StoreError> {
        match self.call(
            "/v3/lease/revoke",
            &json!({"ID": id.to_string()}),
            READ_TIMEOUT,
        )? {
            Answer::Ok(_) => Ok(()),
            Answer::Unavailable(why) => Err(StoreError::Unavailable(why)),
        }
    }

    /// Renews lease `id`; the seconds it has left, 0 when it has expired.
    pub fn keep_alive(&self, id: i64) -> Result<u64, StoreError> {
        match self.call(
            "/v3/lease/keepalive",
            &json!({"ID": id.to_string()}),
            READ_TIMEOUT,
        )? {
            Answer::Ok(value) => Ok(number(&value["result"]["TTL"])),
            Answer::Unavailable(why) => Err(StoreError::Unavailable(why)),
        }
    }

    /// Tries to create `key` with `value` bound to `lease` (etcd's election recipe:
    /// the first to create the key leads until its lease ends).
    pub fn campaign(&self, key: &str, value: &[u8], lease: i64) -> Result<Campaign, StoreError> {
        let encoded = B64.encode(key);
        let request = json!({
            "compare": [{"key": encoded, "target": "CREATE", "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [{"request_put": {"key": encoded, "value": B64.encode(value),
                                          "lease": lease.to_string()}}],
            "failure": [{"request_range": {"key": encoded}}],
        });
        let value = match self.call("/v3/kv/txn", &request, WRITE_TIMEOUT)? {
            Answer::Ok(value) => value,
            Answer::Unavailable(why) => return Err(StoreError::Unavailable(why)),
        };
        if value["succeeded"] == Value::Bool(true) {
            return Ok(Campaign::Won {
                revision: number(&value["header"]["revision"]) as i64,
            });
        }
        let holder = &value["responses"][0]["response_range"]["kvs"][0]["value"];
        let by = B64
            .decode(holder.as_str().unwrap_or_default())
            .unwrap_or_default();
        Ok(Campaign::Held { by })
    }

    /// From now on, every write is made only while `key` is still the one created at
    /// `revision` (this replica's leadership).
    pub fn fence_on(&self, key: &str, revision: i64) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = Some((key.to_string(), revision));
    }

    /// Deletes `key`; whether it existed. Checks for a quorum first; fenced like
    /// every write.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let answer = self.write(&[Op::Delete {
            key: key.to_string(),
        }])?;
        Ok(number(&answer["responses"][0]["response_delete_range"]["deleted"]) > 0)
    }

    /// Refuses when the cluster cannot commit a write now: a linearizable read needs
    /// the leader and a quorum.
    fn check_quorum(&self) -> Result<(), StoreError> {
        let probe = json!({"key": B64.encode(&self.prefix), "count_only": true});
        match self.call("/v3/kv/range", &probe, READ_TIMEOUT)? {
            Answer::Ok(_) => {
                *self
                    .degraded_until
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
                Ok(())
            }
            Answer::Unavailable(why) => Err(StoreError::Unavailable(format!(
                "the etcd cluster has no quorum ({why}); the write was refused and not \
                 made. Bring members back (a majority of them) and try again"
            ))),
        }
    }

    /// Every key under each of `prefixes` with its value, all read at one revision (one
    /// read-only transaction, linearizable); when the cluster has no quorum, each
    /// prefix read from the member's own copy, which may lag.
    pub fn list_together(&self, prefixes: &[String]) -> Result<Vec<KeyValues>, StoreError> {
        if !self.degraded() {
            let ranges: Vec<Value> = prefixes
                .iter()
                .map(|prefix| {
                    json!({"request_range": {
                        "key": B64.encode(prefix),
                        "range_end": B64.encode(prefix_end(prefix.as_bytes())),
                    }})
                })
                .collect();
            match self.call("/v3/kv/txn", &json!({"success": ranges}), READ_TIMEOUT)? {
                Answer::Ok(value) => {
                    let responses = value["responses"].as_array().cloned().unwrap_or_default();
                    if responses.len() != prefixes.len() {
                        return Err(StoreError::Db(format!(
                            "etcd answered {} of {} reads in one transaction",
                            responses.len(),
                            prefixes.len()
                        )));
                    }
                    return responses
                        .iter()
                        .map(|r| key_values(&r["response_range"]))
                        .collect();
                }
                Answer::Unavailable(why) => self.degrade(&why),
            }
        }
        prefixes.iter().map(|prefix| self.list(prefix)).collect()
    }

    /// Whether reads skip the linearizable attempt now (no quorum a moment ago).
    fn degraded(&self) -> bool {
        let until = self
            .degraded_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|until| Instant::now() < until)
    }

    /// A linearizable read found no quorum: read the member's own copy for a while.
    fn degrade(&self, why: &str) {
        tracing::warn!(reason = %why, "etcd has no quorum; reading the member's own copy, which may lag");
        *self
            .degraded_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + DEGRADED_FOR);
    }

    /// A range read: linearizable, or the member's own copy when the cluster has no
    /// quorum (logged; the control plane keeps answering reads).
    fn range(&self, request: &Value) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let degraded = self.degraded();
        let linearizable = if degraded {
            Answer::Unavailable("no quorum a moment ago".into())
        } else {
            self.call("/v3/kv/range", request, READ_TIMEOUT)?
        };
        let value = match linearizable {
            Answer::Ok(value) => value,
            Answer::Unavailable(why) => {
                if !degraded {
                    self.degrade(&why);
                }
                let mut serializable = request.clone();
                serializable["serializable"] = Value::Bool(true);
                match self.call("/v3/kv/range", &serializable, READ_TIMEOUT)? {
                    Answer::Ok(value) => value,
                    Answer::Unavailable(why) => {
                        return Err(StoreError::Unavailable(format!("etcd read failed: {why}")))
                    }
                }
            }
        };
        key_values(&value)
    }

    /// POSTs `body` to `path` on the current member, moving on to the next one that
    /// can be reached.
    fn call(&self, path: &str, body: &Value, timeout: Duration) -> Result<Answer, StoreError> {
        let start = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for offset in 0..self.endpoints.len() {
            let index = (start + offset) % self.endpoints.len();
            let endpoint = &self.endpoints[index];
            let request = self
                .agent
                .post(&format!("{endpoint}{path}"))
                .config()
                .timeout_global(Some(timeout))
                .build();
            let mut response = match request.send_json(body) {
                Ok(response) => response,
                Err(ureq::Error::Timeout(_)) => {
                    return Ok(Answer::Unavailable(format!(
                        "{endpoint} did not answer within {} s",
                        timeout.as_secs()
                    )))
                }
                Err(error) => {
                    failures.push(format!("{endpoint}: {error}"));
                    continue;
                }
            };
            self.current.store(index, Ordering::Relaxed);
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if status == 200 && value.get("error").is_none() {
                return Ok(Answer::Ok(value));
            }
            let message = value["message"]
                .as_str()
                .or(value["error"].as_str())
                .unwrap_or(text.as_str())
                .to_string();
            let code = value["code"].as_i64().unwrap_or(-1);
            if code == 14
                || code == 4
                || message.contains("timed out")
                || message.contains("deadline")
            {
                return Ok(Answer::Unavailable(message));
            }
            return Err(StoreError::Db(format!(
                "etcd {endpoint}{path} answered {status}: {message}"
            )));
        }
        Err(StoreError::Unavailable(format!(
            "no etcd endpoint could be reached ({})",
            failures.join("; ")
        )))
    }
}

/// The keys and values of a range answer.
fn key_values(answer: &Value) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut out = Vec::new();
    for kv in answer["kvs"].as_array().into_iter().flatten() {
        let decode = |field: &str| {
            B64.decode(kv[field].as_str().unwrap_or_default())
                .map_err(|e| StoreError::Db(format!("etcd returned bad base64: {e}")))
        };
        let key = String::from_utf8_lossy(&decode("key")?).into_owned();
        out.push((key, decode("value")?));
    }
    Ok(out)
}

/// The smallest key after every key that starts with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): to the end of the key space.
    vec![0]
}

/// etcd's JSON gateway writes int64 fields as strings.
fn number(value: &Value) -> u64 {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_just_after_its_last_key() {
        assert_eq!(
            prefix_end(b"/nephele/devices/"),
            b"/nephele/devices0".to_vec()
        );
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn counts_come_as_strings_or_numbers() {
        assert_eq!(number(&json!("3")), 3);
        assert_eq!(number(&json!(2)), 2);
        assert_eq!(number(&Value::Null), 0);
    }

    #[test]
    fn no_endpoint_is_an_error_not_a_panic() {
        assert!(Etcd::connect(&[], "/x").is_err());
        let unreachable = Etcd::connect(&["http://127.0.0.1:9".into()], "/x");
        let error = unreachable.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            error.contains("no etcd endpoint could be reached"),
            "{error}"
        );
    }
}
