//! `nephele-edge join`: enrolment with a join token.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use nephele_net::{read_frame, write_frame, JoinToken};
use nephele_proto::{JoinAccepted, JoinRequest, JoinResponse, PROTOCOL_VERSION};

use crate::config::{write_file, AgentConfig};
pub use crate::servers::{connect_timeout, servers};
use crate::JoinArgs;

pub async fn resolve(server: &str) -> Result<std::net::SocketAddr> {
    tokio::net::lookup_host(server)
        .await
        .with_context(|| {
            format!(
                "cannot resolve {server:?}; expected HOST:PORT of the control plane's QUIC gateway"
            )
        })?
        .next()
        .with_context(|| format!("{server:?} resolved to no address"))
}

fn default_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_lowercase().replace(['_', '.'], "-"))
        .filter(|h| nephele_domain::validate_name("device", h).is_ok())
        .unwrap_or_else(|| "edge-device".into())
}

/// The join exchange on an open certificate-less connection: the request with the
/// token's secret and the CSR, the answer read within 15 s, a refusal as an error, and
/// the CA in the answer checked against the token's fingerprint. `nephele-edge join`
/// and `nephele bench fleet` both enrol through it.
pub async fn exchange(
    connection: &quinn::Connection,
    token: &JoinToken,
    name: &str,
    role: &str,
    csr_der: Vec<u8>,
    labels: BTreeMap<String, String>,
) -> Result<JoinAccepted> {
    let result = request(connection, token, name, role, csr_der, labels).await;
    // A connection the control plane closed before answering (too many joins at
    // once): its reason, not the stream's "connection lost".
    match (&result, connection.close_reason()) {
        (Err(_), Some(closed)) => match refusal(&closed) {
            Some(refused) => Err(refused.into()),
            None => result,
        },
        _ => result,
    }
}

/// The control plane closed a join connection before answering, saying why; `retry`
/// when it asks to be tried again (its join places were all taken).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the control plane turned the join away: {reason}")]
pub struct JoinTurnedAway {
    pub reason: String,
    pub retry: bool,
}

/// What a closed join connection says, when the control plane closed it with a reason.
pub fn refusal(closed: &quinn::ConnectionError) -> Option<JoinTurnedAway> {
    match closed {
        quinn::ConnectionError::ApplicationClosed(close) if !close.reason.is_empty() => {
            let reason = String::from_utf8_lossy(&close.reason).into_owned();
            Some(JoinTurnedAway {
                retry: reason.trim_end().ends_with("retry"),
                reason,
            })
        }
        _ => None,
    }
}

async fn request(
    connection: &quinn::Connection,
    token: &JoinToken,
    name: &str,
    role: &str,
    csr_der: Vec<u8>,
    labels: BTreeMap<String, String>,
) -> Result<JoinAccepted> {
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .context("cannot open the join stream")?;
    write_frame(
        &mut send,
        &JoinRequest {
            protocol_version: PROTOCOL_VERSION,
            token_id: token.id.clone(),
            token_secret: token.secret.clone(),
            name: name.to_string(),
            role: role.to_string(),
            csr_der,
            labels,
        },
    )
    .await?;
    let _ = send.finish();
    let response: JoinResponse =
        tokio::time::timeout(Duration::from_secs(15), read_frame(&mut recv, 1024 * 1024))
            .await
            .context("the control plane did not answer the join request within 15 s")??
            .context("the control plane closed the join stream without an answer")?;
    let accepted = match response {
        JoinResponse::Accepted(accepted) => accepted,
        JoinResponse::Refused(error) => bail!(
            "the control plane refused to enrol {name}: {}",
            error.message
        ),
    };
    if nephele_net::fingerprint(&accepted.ca_der) != token.ca_fingerprint {
        bail!("the CA the control plane sent does not match the token's fingerprint; refusing it");
    }
    Ok(accepted)
}

/// A certificate-less connection to the first of `server`'s replicas that answers.
async fn connect(
    server: &str,
    client_config: &quinn::ClientConfig,
    timeout: Duration,
) -> Result<(quinn::Endpoint, quinn::Connection)> {
    let mut failures = Vec::new();
    // Replicas in the order given: the first that answers takes the join.
    for server in servers(server) {
        let attempt = async {
            let addr = resolve(server).await?;
            let endpoint = nephele_net::client_endpoint(addr)?;
            let connection = tokio::time::timeout(
                timeout,
                endpoint.connect_with(client_config.clone(), addr, nephele_net::SERVER_NAME)?,
            )
            .await
            .with_context(|| format!("no answer from {addr} within {} s; is the control plane's QUIC port reachable (UDP)?", timeout.as_secs()))?
            .with_context(|| format!("cannot establish a secure connection to {addr} (if the CA does not match the token, the token is for another cluster)"))?;
            anyhow::Ok((endpoint, connection))
        };
        match attempt.await {
            Ok(pair) => return Ok(pair),
            Err(error) => failures.push(format!("{error:#}")),
        }
    }
    bail!("{}", failures.join("; "))
}

pub async fn join(args: JoinArgs) -> Result<()> {
    let token = JoinToken::parse(&args.token)?;
    let name = args.name.clone().unwrap_or_else(default_name);
    nephele_domain::validate_name("device", &name).map_err(anyhow::Error::msg)?;
    let _: nephele_domain::AgentRole = args.role.parse().map_err(anyhow::Error::msg)?;
    if let Some(profile) = &args.profile {
        crate::agent::resolve_profile(Some(profile))?;
    }
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        let (key, value) = nephele_domain::labels::parse_label(label)?;
        labels.insert(key, value);
    }
    let data_dir = &args.data_dir;
    if data_dir.join("agent.toml").exists() && !args.force {
        bail!(
            "{} already holds an enrolment; use --force to replace it or pick another --data-dir",
            data_dir.display()
        );
    }
    // The agent's key lives here: created 0700 (an existing directory is left as is).
    let mut dirs = std::fs::DirBuilder::new();
    dirs.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut dirs, 0o700);
    dirs.create(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;

    let (key_pem, csr_der) = nephele_net::pki::agent_csr(&name)?;
    let client_config = nephele_net::join_client_config(token.ca_fingerprint)?;
    if servers(&args.server).is_empty() {
        bail!("--server is empty: give the control plane's QUIC address, HOST:PORT (several, comma-separated, for replicas)");
    }
    let timeout = connect_timeout(&args.server, Duration::from_secs(15));
    // A control plane whose join places are all taken asks to be tried again: the
    // join waits and retries (the token is not spent by a join turned away), for up to
    // a minute.
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let mut pause = Duration::from_millis(500);
    let accepted = loop {
        let (endpoint, connection) = connect(&args.server, &client_config, timeout).await?;
        let accepted = exchange(
            &connection,
            &token,
            &name,
            &args.role,
            csr_der.clone(),
            labels.clone(),
        )
        .await;
        connection.close(0u32.into(), b"joined");
        endpoint.wait_idle().await;
        match accepted {
            Err(error)
                if error
                    .downcast_ref::<JoinTurnedAway>()
                    .is_some_and(|turned| turned.retry)
                    && std::time::Instant::now() + pause < give_up =>
            {
                eprintln!(
                    "nephele-edge: {error:#}; trying again in {:.1} s",
                    pause.as_secs_f64()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(8));
            }
            other => break other?,
        }
    };
    write_file(&data_dir.join("agent.key"), key_pem.as_bytes(), 0o600)?;
    write_file(
        &data_dir.join("agent.pem"),
        nephele_net::pki::der_to_pem("CERTIFICATE", &accepted.certificate_der).as_bytes(),
        0o644,
    )?;
    write_file(
        &data_dir.join("ca.pem"),
        nephele_net::pki::der_to_pem("CERTIFICATE", &accepted.ca_der).as_bytes(),
        0o644,
    )?;
    write_file(
        &data_dir.join("manifest-signing.pub"),
        hex::encode(&accepted.manifest_signing_key).as_bytes(),
        0o644,
    )?;
    let config = AgentConfig {
        server: args.server.clone(),
        name: accepted.agent_id.clone(),
        region: accepted.region.clone(),
        role: args.role.clone(),
        profile: args.profile.clone(),
        labels,
    };
    write_file(
        &data_dir.join("agent.toml"),
        toml::to_string_pretty(&config)?.as_bytes(),
        0o644,
    )?;
    // A new enrolment starts with nothing to serve and no removal on record; the model
    // cache is kept (it is verified by hash on every read).
    crate::persisted::forget_desired(data_dir)?;
    let _ = std::fs::remove_file(data_dir.join(crate::persisted::REMOVED_FILE));
    println!(
        "enrolled {} (role {}, region {}) with {}; start it with `nephele-edge run --data-dir {}`",
        accepted.agent_id,
        args.role,
        accepted.region,
        args.server,
        data_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_turned_away_says_why_and_whether_to_retry() {
        let closed = |reason: &[u8]| {
            quinn::ConnectionError::ApplicationClosed(quinn::ApplicationClose {
                error_code: quinn::VarInt::from_u32(2),
                reason: reason.to_vec().into(),
            })
        };
        let busy = refusal(&closed(
            b"too many joins from this address in progress; retry",
        ))
        .expect("a reason");
        assert!(busy.retry);
        assert!(
            busy.to_string()
                .contains("too many joins from this address"),
            "{busy}"
        );
        let final_word = refusal(&closed(b"no join request")).expect("a reason");
        assert!(!final_word.retry);
        assert_eq!(refusal(&closed(b"")), None);
        assert_eq!(refusal(&quinn::ConnectionError::TimedOut), None);
    }
}
