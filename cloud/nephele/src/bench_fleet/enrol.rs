//! Enrolling the bench's agents through the real join path: one single-use join token
//! per agent from `POST /v1/tokens`, then a `JoinRequest` with the agent's own key's
//! CSR over a certificate-less QUIC connection, exactly as `nephele-edge join` does,
//! keeping the certificate and key in memory instead of a data dir.
//!
//! The gateway takes at most 8 joins at once from one IP address; the bench dials from
//! several loopback addresses (127.0.0.2, 127.0.0.3, …) to enrol faster, as a fleet
//! behind several NATs would.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use nephele_api::{JoinTokenView, TokenRequest};
use nephele_net::JoinToken;

use crate::client::Api;

/// An enrolled agent's identity, as its data dir would hold it.
#[derive(Clone)]
pub struct Identity {
    pub name: String,
    pub cert_der: Vec<u8>,
    pub key_pkcs8_der: Vec<u8>,
}

/// What every agent of the cluster shares from its join answer.
#[derive(Clone)]
pub struct Cluster {
    pub ca_der: Vec<u8>,
    pub manifest_signing_key: Vec<u8>,
}

/// Join tokens for `count` agents of `region`, created by `threads` API clients at once.
pub fn tokens(
    api_base: &str,
    admin: &str,
    ca_pem: &[u8],
    region: &str,
    count: usize,
    threads: usize,
) -> Result<Vec<String>> {
    let next = AtomicUsize::new(0);
    let made = std::sync::Mutex::new(vec![String::new(); count]);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    let api = Api::with_ca(api_base, admin, Some(ca_pem));
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= count {
                            return Ok(());
                        }
                        let token: JoinTokenView = api.post_as(
                            "/v1/tokens",
                            &TokenRequest {
                                region: Some(region.to_string()),
                                ttl_s: Some(3600),
                            },
                        )?;
                        let token = token.token.context("the API returned no token text")?;
                        made.lock().unwrap_or_else(|p| p.into_inner())[k] = token;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("a token thread panicked"))??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(made.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// One loopback source address per group of joins (`127.0.0.2` onwards).
pub fn source_address(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        0,
        (2 + index / 250) as u8,
        (2 + index % 250) as u8,
    ))
}

/// A client endpoint bound to `source` (port chosen by the system).
pub fn endpoint_from(source: IpAddr) -> Result<quinn::Endpoint> {
    // Each carries a thousand simulated agents: the buffers a control plane's has.
    let udp = nephele_net::udp::bind(
        SocketAddr::new(source, 0),
        nephele_net::udp::MANY_CONNECTIONS_BUFFER,
    )
    .with_context(|| format!("cannot bind a UDP socket on {source}"))?;
    nephele_net::udp::endpoint(udp.socket, None)
        .with_context(|| format!("cannot start a QUIC endpoint on {source}"))
}

/// Enrols one agent named `name` with `token`, over `endpoint`.
pub async fn join(
    endpoint: &quinn::Endpoint,
    server: SocketAddr,
    token: &str,
    name: &str,
    role: &str,
    labels: BTreeMap<String, String>,
) -> Result<(Identity, Cluster)> {
    let token = JoinToken::parse(token)?;
    let (key_pem, csr_der) = nephele_net::pki::agent_csr(name)?;
    let config = nephele_net::join_client_config(token.ca_fingerprint)?;
    let connection = tokio::time::timeout(
        Duration::from_secs(15),
        endpoint.connect_with(config, server, nephele_net::SERVER_NAME)?,
    )
    .await
    .context("no answer to the join within 15 s")?
    .context("join handshake")?;
    let accepted =
        nephele_edge::enrol::exchange(&connection, &token, name, role, csr_der, labels).await;
    connection.close(0u32.into(), b"joined");
    let accepted = accepted?;
    Ok((
        Identity {
            name: accepted.agent_id,
            cert_der: accepted.certificate_der,
            key_pkcs8_der: nephele_net::pki::pem_to_der(&key_pem)?,
        },
        Cluster {
            ca_der: accepted.ca_der,
            manifest_signing_key: accepted.manifest_signing_key,
        },
    ))
}

/// A join still to do: its index, token, name and labels.
type Pending = (usize, String, String, BTreeMap<String, String>);

/// Enrols agents `names[k]` with `tokens[k]` in `role`, `per_address` at once from
/// each of `addresses` loopback addresses, retrying a join the gateway turned away as
/// busy; also says how many attempts were retried.
#[allow(clippy::too_many_arguments)]
pub async fn join_all(
    server: SocketAddr,
    role: &'static str,
    tokens: Vec<String>,
    names: Vec<(String, BTreeMap<String, String>)>,
    addresses: usize,
    per_address: usize,
    progress: impl Fn(usize) + Send + Sync + 'static,
) -> Result<(Vec<Identity>, Cluster, usize)> {
    let work: Arc<std::sync::Mutex<Vec<Pending>>> = Arc::new(std::sync::Mutex::new(
        tokens
            .into_iter()
            .zip(names)
            .enumerate()
            .map(|(k, (token, (name, labels)))| (k, token, name, labels))
            .rev()
            .collect(),
    ));
    let total = work.lock().unwrap_or_else(|p| p.into_inner()).len();
    let done = Arc::new(std::sync::Mutex::new(vec![None; total]));
    let joined = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(AtomicUsize::new(0));
    let cluster = Arc::new(std::sync::Mutex::new(None));
    let progress = Arc::new(progress);
    let mut tasks = tokio::task::JoinSet::new();
    for a in 0..addresses.max(1) {
        let endpoint = endpoint_from(source_address(a))?;
        for _ in 0..per_address.max(1) {
            let (endpoint, work, done, cluster, progress, joined, retries) = (
                endpoint.clone(),
                work.clone(),
                done.clone(),
                cluster.clone(),
                progress.clone(),
                joined.clone(),
                retries.clone(),
            );
            tasks.spawn(async move {
                loop {
                    let Some((k, token, name, labels)) =
                        work.lock().unwrap_or_else(|p| p.into_inner()).pop()
                    else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let mut attempt = 0;
                    let (identity, shared) = loop {
                        attempt += 1;
                        match join(&endpoint, server, &token, &name, role, labels.clone()).await {
                            Ok(joined) => break joined,
                            // Turned away as busy, or a handshake lost in a burst.
                            Err(_) if attempt < 20 => {
                                retries.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                            }
                            Err(error) => return Err(error.context(format!("join of {name}"))),
                        }
                    };
                    cluster
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(shared);
                    done.lock().unwrap_or_else(|p| p.into_inner())[k] = Some(identity);
                    progress(joined.fetch_add(1, Ordering::Relaxed) + 1);
                }
            });
        }
    }
    while let Some(result) = tasks.join_next().await {
        result.context("a join task panicked")??;
    }
    let identities = Arc::try_unwrap(done)
        .map_err(|_| anyhow::anyhow!("join tasks still hold their results"))?
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .context("an agent was not enrolled")?;
    let cluster = cluster
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .context("no agent to enrol")?;
    Ok((identities, cluster, retries.load(Ordering::Relaxed)))
}
