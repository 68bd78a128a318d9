//! What a standby replica does with the API while another replica leads. Writes, and
//! reads of what only the leader holds (the regions' books, metrics, logs), are
//! forwarded to the leader's API, so clients and load balancers may send requests to
//! any replica. Reads of the fleet's records (devices, models, deployments, join
//! tokens, regions, usage) go to the leader too, for its live state, unless the client
//! asks for `?stale` (as with Nomad and Consul): then this replica answers from its own
//! copy of the store ([`reads`]), and so it does when no leader can be reached. Those
//! answers say so in their headers, and carry no live state.
//!
//! The leader is looked up in etcd for each connection (the leader key says its API
//! address), so a standby follows a new leader at once. When no replica leads (between
//! a leader's death and the next one's election) or the leader cannot be reached, a
//! write gets `503` with `Retry-After` and nothing is changed.
//!
//! With HTTPS (the default) the standby terminates TLS with the same kind of
//! certificate the leader has and reaches the leader over TLS in turn, checking its
//! certificate ([`nephele_net::https::api_peer_client_config`]); with `plain_http` both
//! hops are plain TCP.
//!
//! Forwarding is by connection (TCP), decided by its first request's head: the leader
//! sees the standby as the peer, and later requests on a kept-alive connection go where
//! the first went. Answers from the copy close their connection. Connections are
//! bounded ([`MAX_FORWARDED`]) and must send their head within
//! [`http::HEAD_TIMEOUT`]; the leader's own limits (token before body, sizes, timeouts)
//! apply to what is forwarded. When the standby comes to lead, the forwarder stops (its
//! listener and every forwarded connection close) before the API is bound.

mod http;
pub mod reads;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use self::http::{read_head, respond, HeadError, HEAD_TIMEOUT};
use self::reads::{Leader, Reads};
use crate::federation::fleet_copy::CopyRead;
use crate::leader::LeaderInfo;
use crate::store::etcd::Etcd;

/// How long connecting to the leader's API may take before it counts as unreachable.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Connections forwarded at once; past it a client waits to be accepted.
pub const MAX_FORWARDED: usize = 256;

/// TLS on both hops: this replica's API server configuration, and how it checks the
/// leader's certificate.
#[derive(Clone)]
pub struct Tls {
    pub server: Arc<rustls::ServerConfig>,
    pub leader: Arc<rustls::ClientConfig>,
}

/// A connection, plain or TLS, client's or leader's.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
type Connection = Box<dyn Stream>;

/// A standby's forwarder, running until [`Forwarder::stop`].
pub struct Forwarder {
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    /// Listens on `listen` and forwards each connection to the leader's API, or
    /// answers it from `reads`; `me` is what this replica will put in the leader key
    /// when it leads.
    pub async fn start(
        listen: SocketAddr,
        etcd: Arc<Etcd>,
        me: LeaderInfo,
        reads: Reads,
        tls: Option<Tls>,
    ) -> anyhow::Result<Forwarder> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot bind the API on {listen}"))?;
        tracing::info!(%listen, "standby: forwarding API requests to the leader");
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_FORWARDED));
        let me = Arc::new(me);
        let reads = Arc::new(reads);
        let tls = tls.map(Arc::new);
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
                let (etcd, me, reads, tls) = (etcd.clone(), me.clone(), reads.clone(), tls.clone());
                connections.spawn(async move {
                    let _ = client.set_nodelay(true);
                    let client: Connection = match &tls {
                        None => Box::new(client),
                        Some(tls) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
                            match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(client)).await
                            {
                                Ok(Ok(stream)) => Box::new(stream),
                                Ok(Err(error)) => {
                                    tracing::debug!(%error, "standby: a TLS handshake failed");
                                    return;
                                }
                                Err(_) => return,
                            }
                        }
                    };
                    serve(client, &etcd, &me, &reads, tls.as_deref()).await;
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

/// Serves one connection: forwarded to the leader, or answered from the copy.
async fn serve(
    mut client: Connection,
    etcd: &Arc<Etcd>,
    me: &LeaderInfo,
    reads: &Reads,
    tls: Option<&Tls>,
) {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(head)) => head,
        Ok(Err(HeadError::Closed)) | Err(_) => return,
        Ok(Err(HeadError::TooLarge)) => {
            let why = format!("the request head is over {} bytes", http::MAX_HEAD_BYTES);
            return refuse(&mut client, 431, &why).await;
        }
        Ok(Err(HeadError::Malformed(why))) => {
            return refuse(&mut client, 400, &format!("not an HTTP request: {why}")).await
        }
    };
    let read = CopyRead::parse(&head.method, &head.path);
    let leader = leader_api(etcd, me).await;
    if let Some(read) = read.as_ref().filter(|_| head.stale()) {
        let known = matches!(leader, Ok(Some(_)));
        let leader = Leader {
            known,
            why_not_asked: None,
        };
        return reads
            .answer(&mut client, read, head.token.as_deref(), leader)
            .await;
    }
    let (known, why) = match leader {
        Ok(Some(leader)) => match connect(leader, tls).await {
            Ok(upstream) => return relay(client, upstream, &head.bytes).await,
            Err(why) => (true, why),
        },
        Ok(None) => (
            false,
            "no replica leads now (an election is under way)".to_string(),
        ),
        Err(error) => (false, format!("cannot find the leader: {error}")),
    };
    match read {
        Some(read) => {
            let leader = Leader {
                known,
                why_not_asked: Some(why),
            };
            reads
                .answer(&mut client, &read, head.token.as_deref(), leader)
                .await
        }
        None => unavailable(&mut client, &why).await,
    }
}

async fn connect(leader: SocketAddr, tls: Option<&Tls>) -> Result<Connection, String> {
    let why = |e: &dyn std::fmt::Display| format!("cannot reach the leader's API at {leader}: {e}");
    let reached = async {
        let upstream = TcpStream::connect(leader).await.map_err(|e| why(&e))?;
        let _ = upstream.set_nodelay(true);
        match tls {
            None => Ok::<Connection, String>(Box::new(upstream)),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.leader.clone());
                let stream = connector
                    .connect(nephele_net::https::api_peer_server_name(), upstream)
                    .await
                    .map_err(|e| why(&format!("TLS: {e}")))?;
                Ok(Box::new(stream) as Connection)
            }
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, reached).await {
        Ok(result) => result,
        Err(_) => Err(why(&format!(
            "no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// Sends what was read of the request on, then relays both ways until either closes.
async fn relay(mut client: Connection, mut upstream: Connection, read: &[u8]) {
    if let Err(error) = upstream.write_all(read).await {
        tracing::debug!(%error, "standby: the leader closed a forwarded connection");
        return;
    }
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

/// A `503` in the API's own error shape, telling the client to retry (writes are not
/// made; reads of the fleet's records are answered from the copy meanwhile).
async fn unavailable(client: &mut Connection, why: &str) {
    let body =
        serde_json::json!({"error": "unavailable", "message": format!("{why}; retry in a second")});
    respond(client, 503, &[("retry-after", "1".into())], &body).await;
}

/// A request this standby cannot even read.
async fn refuse(client: &mut Connection, status: u16, why: &str) {
    respond(
        client,
        status,
        &[],
        &serde_json::json!({"error": "bad_request", "message": why}),
    )
    .await;
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
