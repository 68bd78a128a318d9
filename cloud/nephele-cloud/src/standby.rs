//! What a standby replica does with the API while another replica leads: it forwards
//! every connection to the leader's API, reads and writes alike, so clients and load
//! balancers may send requests to any replica. The leader is looked up in etcd for each
//! connection (the leader key says its API address), so a forwarder follows a new
//! leader at once. When no replica leads (between a leader's death and the next one's
//! election) or the leader cannot be reached, the client gets `503` with `Retry-After`
//! and nothing is changed.
//!
//! Forwarding is by connection (TCP), not by request: the standby holds no state of its
//! own to answer from, and the leader sees the standby as the peer. Connections are
//! bounded ([`MAX_FORWARDED`]); the leader's own limits (token before body, sizes,
//! timeouts) apply to what is forwarded. When the standby comes to lead, the forwarder
//! stops (its listener and every forwarded connection close) before the API is bound.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};

use crate::leader::LeaderInfo;
use crate::store::etcd::Etcd;

/// Connections forwarded at once; past it a client waits to be accepted.
pub const MAX_FORWARDED: usize = 256;

/// A standby's forwarder, running until [`Forwarder::stop`].
pub struct Forwarder {
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    /// Listens on `listen` and forwards each connection to the leader's API; `me` is
    /// what this replica will put in the leader key when it leads.
    pub async fn start(
        listen: SocketAddr,
        etcd: Arc<Etcd>,
        me: LeaderInfo,
    ) -> anyhow::Result<Forwarder> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot bind the API on {listen}"))?;
        tracing::info!(%listen, "standby: forwarding API requests to the leader");
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_FORWARDED));
        let me = Arc::new(me);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let client = match listener.accept().await {
                    Ok((client, _)) => client,
                    Err(error) => {
                        tracing::warn!(%error, "standby: accept failed");
                        continue;
                    }
                };
                let (etcd, me) = (etcd.clone(), me.clone());
                connections.spawn(async move {
                    forward(client, &etcd, &me).await;
                    drop(permit);
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Forwarder { task })
    }

    /// Stops forwarding: the listener and every forwarded connection are closed when
    /// this returns.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Forwards one connection to the leader, or answers 503 when there is none to reach.
async fn forward(mut client: TcpStream, etcd: &Arc<Etcd>, me: &LeaderInfo) {
    let leader = match leader_api(etcd, me).await {
        Ok(Some(address)) => address,
        Ok(None) => {
            return unavailable(
                &mut client,
                "no replica leads now (an election is under way)",
            )
            .await
        }
        Err(error) => {
            return unavailable(&mut client, &format!("cannot find the leader: {error}")).await
        }
    };
    let mut upstream = match TcpStream::connect(leader).await {
        Ok(upstream) => upstream,
        Err(error) => {
            let why = format!("cannot reach the leader's API at {leader}: {error}");
            return unavailable(&mut client, &why).await;
        }
    };
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(%error, "standby: a forwarded connection ended");
    }
}

/// The leader's API address, from the leader key; none while no replica leads, or
/// while the key still names this replica's previous run (whose lease ends shortly):
/// forwarding to itself would loop.
async fn leader_api(etcd: &Arc<Etcd>, me: &LeaderInfo) -> anyhow::Result<Option<SocketAddr>> {
    let etcd = etcd.clone();
    let held =
        tokio::task::spawn_blocking(move || etcd.get(&crate::leader::leader_key(&etcd))).await??;
    let Some(bytes) = held else {
        return Ok(None);
    };
    let info: LeaderInfo =
        serde_json::from_slice(&bytes).context("the leader key is unreadable")?;
    if is_me(&info, me) {
        return Ok(None);
    }
    api_address(&info).map(Some)
}

/// Whether the leader key names this replica (by host and API address; a previous run
/// of it has another pid).
fn is_me(info: &LeaderInfo, me: &LeaderInfo) -> bool {
    info.host == me.host && info.api == me.api
}

/// Where the leader's API is reached: its configured address, or its host name with
/// that port when it listens on every interface.
fn api_address(info: &LeaderInfo) -> anyhow::Result<SocketAddr> {
    let configured: SocketAddr = info
        .api
        .parse()
        .with_context(|| format!("the leader's API address {:?} is not HOST:PORT", info.api))?;
    if !configured.ip().is_unspecified() {
        return Ok(configured);
    }
    use std::net::ToSocketAddrs as _;
    (info.host.as_str(), configured.port())
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve the leader's host {}", info.host))?
        .next()
        .with_context(|| format!("the leader's host {} has no address", info.host))
}

/// A `503` in the API's own error shape, telling the client to retry.
async fn unavailable(client: &mut TcpStream, why: &str) {
    let body =
        serde_json::json!({"error": "unavailable", "message": format!("{why}; retry in a second")})
            .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(api: &str, host: &str) -> LeaderInfo {
        LeaderInfo {
            host: host.into(),
            pid: 1,
            api: api.into(),
            quic: "127.0.0.1:7443".into(),
        }
    }

    #[test]
    fn the_leader_is_reached_at_its_address_or_its_host_and_never_itself() {
        assert_eq!(
            api_address(&info("10.0.0.7:8080", "cp-1")).unwrap(),
            "10.0.0.7:8080".parse().unwrap()
        );
        let any = api_address(&info("0.0.0.0:8080", "localhost")).unwrap();
        assert_eq!(any.port(), 8080);
        assert!(any.ip().is_loopback(), "{any}");
        assert!(is_me(
            &info("127.0.0.1:8080", "cp-1"),
            &info("127.0.0.1:8080", "cp-1")
        ));
        assert!(!is_me(
            &info("127.0.0.1:8080", "cp-1"),
            &info("127.0.0.1:8081", "cp-1")
        ));
        assert!(!is_me(
            &info("0.0.0.0:8080", "cp-1"),
            &info("0.0.0.0:8080", "cp-2")
        ));
        assert!(api_address(&info("nonsense", "cp-1"))
            .unwrap_err()
            .to_string()
            .contains("HOST:PORT"));
    }
}
