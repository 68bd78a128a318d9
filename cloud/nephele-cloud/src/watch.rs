//! Watches: every change to a device, model, deployment (its rollout included), job or
//! node, numbered with a resource version, for `GET /v1/watch` (server-sent events)
//! and whoever else follows the fleet (the dashboard, `nephele watch`).
//!
//! The federation actor publishes what its commits write and the agents' comings and
//! goings; each region actor publishes what its books write. An event names what
//! changed (kind, name, tenant, region) and how (`put` or `delete`); a client fetches
//! the object if it needs more. Versions count from 1 in each control-plane process; an
//! event's id is `<epoch>-<version>`, so a client resuming with an id of another
//! process (a restart, a failover) is told to list again (`reset`) instead of missing
//! what changed in between. The newest [`KEPT`] events are kept for resuming.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

/// Events kept for clients that resume (`Last-Event-ID` or `?since=`).
pub const KEPT: usize = 4096;

/// What kind of object changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Device,
    Model,
    Deployment,
    Job,
    Node,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Device,
        Kind::Model,
        Kind::Deployment,
        Kind::Job,
        Kind::Node,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Model => "model",
            Kind::Deployment => "deployment",
            Kind::Job => "job",
            Kind::Node => "node",
        }
    }

    /// `kinds=device,job` as kinds, or which word is not one.
    pub fn parse_list(text: &str) -> Result<Vec<Kind>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(|k| {
                Kind::ALL
                    .into_iter()
                    .find(|kind| kind.as_str() == k.trim_end_matches('s'))
                    .ok_or_else(|| {
                        format!("no kind {k:?}; kinds: device, model, deployment, job, node")
                    })
            })
            .collect()
    }

    /// Whether objects of this kind belong to a tenant (devices and nodes are the
    /// fleet's, seen by every token).
    pub fn tenanted(self) -> bool {
        matches!(self, Kind::Model | Kind::Deployment | Kind::Job)
    }
}

/// A change before it is numbered: what the actors hand the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub name: String,
    /// `put` or `delete`.
    pub action: &'static str,
    pub tenant: Option<String>,
    pub region: Option<String>,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    pub version: u64,
    pub kind: Kind,
    pub name: String,
    /// `put` (created or changed) or `delete`.
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub unix_ms: u64,
}

struct Inner {
    next: u64,
    recent: VecDeque<Event>,
}

/// Where events are published and followed. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct Hub {
    epoch: u64,
    inner: Arc<Mutex<Inner>>,
    tx: broadcast::Sender<Event>,
}

/// Where a watch starts.
#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// The kept events after the client's version, then live ones.
    Resume(Vec<Event>),
    /// The client's version is of another process, or older than what is kept: it
    /// must list again, then follow live events.
    Reset(&'static str),
}

impl Hub {
    /// A hub of this process; `epoch` tells its versions from another process's (the
    /// start time in ms).
    pub fn new(epoch: u64) -> Hub {
        let (tx, _) = broadcast::channel(KEPT);
        Hub {
            epoch,
            inner: Arc::new(Mutex::new(Inner {
                next: 1,
                recent: VecDeque::new(),
            })),
            tx,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Publishes a change; returns its version.
    pub fn publish(
        &self,
        kind: Kind,
        name: &str,
        action: &'static str,
        tenant: Option<&str>,
        region: Option<&str>,
    ) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let version = inner.next;
        inner.next += 1;
        let event = Event {
            version,
            kind,
            name: name.to_string(),
            action,
            tenant: tenant.map(str::to_string),
            region: region.map(str::to_string),
            unix_ms: crate::clock::now_unix_ms(),
        };
        if inner.recent.len() == KEPT {
            inner.recent.pop_front();
        }
        inner.recent.push_back(event.clone());
        // Sent under the lock, so a subscriber's backlog and live events never overlap
        // or leave a gap.
        let _ = self.tx.send(event);
        version
    }

    /// Follows events from `since` (`<epoch>-<version>`; none: from now).
    pub fn subscribe(&self, since: Option<&str>) -> (Start, broadcast::Receiver<Event>) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let rx = self.tx.subscribe();
        let start = match since.map(|id| self.parse_id(id)) {
            None => Start::Resume(Vec::new()),
            Some(Err(why)) => Start::Reset(why),
            Some(Ok(version)) => {
                let oldest = inner.recent.front().map_or(inner.next, |e| e.version);
                if version + 1 < oldest {
                    Start::Reset("the events since that version are no longer kept; list again")
                } else if version >= inner.next {
                    Start::Reset(
                        "that version is from the future of this control plane; list again",
                    )
                } else {
                    Start::Resume(
                        inner
                            .recent
                            .iter()
                            .filter(|e| e.version > version)
                            .cloned()
                            .collect(),
                    )
                }
            }
        };
        (start, rx)
    }

    fn parse_id(&self, id: &str) -> Result<u64, &'static str> {
        let (epoch, version) = id
            .split_once('-')
            .ok_or("not an event id (<epoch>-<version>); list again")?;
        if epoch.parse::<u64>().ok() != Some(self.epoch) {
            return Err("that event id is from another control-plane process (a restart or a failover); list again");
        }
        version
            .parse()
            .map_err(|_| "not an event id (<epoch>-<version>); list again")
    }

    /// An event as a server-sent event.
    pub fn sse(&self, event: &Event) -> String {
        format!(
            "id: {}-{}\nevent: {}\ndata: {}\n\n",
            self.epoch,
            event.version,
            event.kind.as_str(),
            serde_json::to_string(&event.to_api()).unwrap_or_default()
        )
    }
}

impl Event {
    /// The event as the API sends it.
    pub fn to_api(&self) -> nephele_api::WatchEvent {
        nephele_api::WatchEvent {
            version: self.version,
            kind: self.kind.as_str().to_string(),
            name: self.name.clone(),
            action: self.action.to_string(),
            tenant: self.tenant.clone(),
            region: self.region.clone(),
            unix_ms: self.unix_ms,
        }
    }
}

/// A reset as a server-sent event.
pub fn reset_sse(why: &str) -> String {
    let reset = nephele_api::WatchReset {
        reason: why.to_string(),
    };
    format!(
        "event: reset\ndata: {}\n\n",
        serde_json::to_string(&reset).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_resumes_without_gap_or_overlap() {
        let hub = Hub::new(7);
        hub.publish(Kind::Deployment, "a", "put", Some("t"), None);
        let v2 = hub.publish(Kind::Device, "cam-1", "put", None, Some("eu"));
        hub.publish(Kind::Job, "j", "delete", Some("t"), Some("eu"));
        let (start, mut rx) = hub.subscribe(Some(&format!("7-{}", v2 - 1)));
        let Start::Resume(backlog) = start else {
            panic!("{start:?}")
        };
        assert_eq!(
            backlog.iter().map(|e| e.version).collect::<Vec<_>>(),
            vec![2, 3]
        );
        let v4 = hub.publish(Kind::Node, "l4-0", "put", None, Some("eu"));
        assert_eq!(rx.try_recv().unwrap().version, v4);
        assert!(hub
            .sse(&backlog[0])
            .starts_with("id: 7-2\nevent: device\ndata: {"));
    }

    #[test]
    fn another_process_or_a_forgotten_version_resets() {
        let hub = Hub::new(7);
        for i in 0..(KEPT + 10) {
            hub.publish(Kind::Job, &format!("j{i}"), "put", None, None);
        }
        assert!(matches!(hub.subscribe(Some("6-3")).0, Start::Reset(_)));
        assert!(matches!(hub.subscribe(Some("7-3")).0, Start::Reset(_)));
        assert!(matches!(hub.subscribe(Some("7-999999")).0, Start::Reset(_)));
        assert!(matches!(hub.subscribe(Some("garbage")).0, Start::Reset(_)));
        let newest = (KEPT + 10) as u64;
        assert_eq!(
            hub.subscribe(Some(&format!("7-{newest}"))).0,
            Start::Resume(Vec::new())
        );
        assert_eq!(
            Kind::parse_list("jobs,device").unwrap(),
            vec![Kind::Job, Kind::Device]
        );
        assert!(Kind::parse_list("pods").is_err());
    }
}
