//! The agent's certificate, renewed before it expires, over its mutual-TLS session.
//!
//! When the renewal time comes (the last third of the certificate's validity by default,
//! or `--renew-before-days`), the agent makes a new key on the device, sends its CSR as
//! a `RenewCertificate` request and stores the certificate it gets back: the new key and
//! certificate are written beside the old ones (`agent.key.new`, `agent.pem.new`, each
//! synced), then renamed over them, key first. [`roll_forward`] finishes a rename a crash
//! interrupted, so the data dir never holds a key and a certificate that do not match.
//! The control plane accepts the old and the new certificate until the agent first
//! connects with the new one, so a renewal lost to a crash costs nothing.
//!
//! An agent offline past its certificate's expiry cannot renew over a session (the
//! control plane refuses the expired certificate): it says so, with the date and the
//! `join --force` that enrols it again, and keeps serving what it has.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use nephele_net::{read_frame, write_frame};
use nephele_proto::{
    RequestBody, StreamRequest, StreamResponse, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};

use crate::agent::Agent;
use crate::config::write_file;

/// How often a session checks whether the renewal time has come.
const CHECK_EVERY: Duration = Duration::from_secs(3600);

pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// When to renew a certificate valid from `not_before` to `not_after` (Unix seconds):
/// `renew_before_days` before it expires, or with a third of its validity left.
pub fn renew_at(not_before: i64, not_after: i64, renew_before_days: Option<u32>) -> i64 {
    match renew_before_days {
        Some(days) => not_after.saturating_sub(i64::from(days) * 86_400),
        None => not_before.saturating_add(not_after.saturating_sub(not_before) / 3 * 2),
    }
}

/// Finishes a renewal that a crash cut between its renames: a complete `.new` pair, or
/// the certificate alone once the key was renamed, replaces the old files.
pub fn roll_forward(data_dir: &Path) -> Result<()> {
    let (key, cert) = (data_dir.join("agent.key"), data_dir.join("agent.pem"));
    let (key_new, cert_new) = (
        data_dir.join("agent.key.new"),
        data_dir.join("agent.pem.new"),
    );
    if key_new.exists() && !cert_new.exists() {
        // The certificate never arrived whole: the old pair still matches.
        std::fs::remove_file(&key_new).context("remove an unfinished agent.key.new")?;
        return Ok(());
    }
    if key_new.exists() {
        std::fs::rename(&key_new, &key).context("finish a renewal: agent.key")?;
    }
    if cert_new.exists() {
        std::fs::rename(&cert_new, &cert).context("finish a renewal: agent.pem")?;
        tracing::info!("finished a certificate renewal that a restart had interrupted");
    }
    Ok(())
}

/// Renews the certificate whenever its time comes, for as long as the session lasts
/// (the caller aborts the task when the session ends); at most once a session: the
/// control plane keeps one renewed certificate beside the current one until it is
/// used, so a second renewal before the next session would supersede the first, and
/// an agent that then lost the second (a crash before storing it) would hold neither.
pub async fn keep_renewed(agent: std::sync::Arc<Agent>, connection: quinn::Connection) {
    loop {
        match renew_if_due(&agent, &connection).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => {
                agent
                    .server
                    .metrics
                    .counter(
                        "nephele_agent_certificate_renewal_failures_total",
                        "Certificate renewals that failed (retried on the next check).",
                        &[],
                    )
                    .inc();
                tracing::warn!(error = %format!("{error:#}"), "certificate renewal failed; retrying in an hour")
            }
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// Renews the certificate if its renewal time has come; whether it did.
async fn renew_if_due(agent: &Agent, connection: &quinn::Connection) -> Result<bool> {
    let cert_der = agent.identity().0;
    let (not_before, not_after) = nephele_net::pki::validity_unix(&cert_der)?;
    if now_unix() < renew_at(not_before, not_after, agent.renew_before_days) {
        return Ok(false);
    }
    let name = agent.enrolment.config.name.clone();
    let (key_pem, csr_der) = nephele_net::pki::agent_csr(&name)?;
    let (mut send, mut recv) = connection.open_bi().await?;
    write_frame(
        &mut send,
        &StreamRequest {
            protocol_version: PROTOCOL_VERSION,
            body: RequestBody::RenewCertificate { csr_der },
        },
    )
    .await?;
    let _ = send.finish();
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        read_frame::<StreamResponse>(&mut recv, MAX_FRAME_BYTES),
    )
    .await
    .context("no answer to the renewal within 30 s")??
    .context("the control plane closed the renewal stream")?;
    let certificate_der = match answer {
        StreamResponse::Certificate { certificate_der } => certificate_der,
        StreamResponse::Error(error) => bail!("the control plane refused: {}", error.message),
        other => bail!("unexpected answer to a renewal: {other:?}"),
    };
    let identity = nephele_net::parse_identity(&certificate_der)
        .context("the renewed certificate names no agent")?;
    if identity.name != name {
        bail!(
            "the renewed certificate is for {}, not {name}; keeping the current one",
            identity.name
        );
    }
    let (_, new_not_after) = nephele_net::pki::validity_unix(&certificate_der)?;
    let data_dir = &agent.enrolment.data_dir;
    write_file(&data_dir.join("agent.key.new"), key_pem.as_bytes(), 0o600)?;
    write_file(
        &data_dir.join("agent.pem.new"),
        nephele_net::pki::der_to_pem("CERTIFICATE", &certificate_der).as_bytes(),
        0o644,
    )?;
    roll_forward(data_dir)?;
    agent.set_identity(certificate_der, nephele_net::pki::pem_to_der(&key_pem)?);
    agent
        .server
        .metrics
        .counter(
            "nephele_agent_certificate_renewals_total",
            "Certificates renewed over a session.",
            &[],
        )
        .inc();
    tracing::info!(
        previous_not_after = not_after,
        not_after = new_not_after,
        "certificate renewed; the next session uses it"
    );
    Ok(true)
}

/// What to tell the operator when sessions fail and the certificate has expired.
pub fn expired_advice(agent: &Agent) -> Option<String> {
    let (_, not_after) = nephele_net::pki::validity_unix(&agent.identity().0).ok()?;
    (now_unix() > not_after).then(|| {
        format!(
            "this device's certificate expired at {not_after} (Unix time) and the control plane refuses it; enrol the device again with `nephele-edge join --force --server {} --token NEW_TOKEN --data-dir {}` (it keeps serving what it has meanwhile)",
            agent.enrolment.config.server,
            agent.enrolment.data_dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_comes_with_a_third_left_or_the_days_asked() {
        let day = 86_400;
        assert_eq!(renew_at(0, 300 * day, None), 200 * day);
        assert_eq!(renew_at(0, 300 * day, Some(30)), 270 * day);
        // More days than the validity: due at once.
        assert!(renew_at(1_000 * day, 1_300 * day, Some(400)) < 1_000 * day);
        assert_eq!(
            renew_at(i64::MIN, i64::MAX, None),
            renew_at(i64::MIN, i64::MAX, None)
        );
    }

    #[test]
    fn a_renewal_cut_by_a_crash_is_finished_or_dropped_never_half_kept() {
        let dir = std::env::temp_dir().join(format!(
            "nephele-renewal-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        write("agent.key", "old key");
        write("agent.pem", "old cert");
        // Cut after the key was written, before the certificate: the old pair stays.
        write("agent.key.new", "new key");
        roll_forward(&dir).unwrap();
        assert_eq!(
            (read("agent.key"), read("agent.pem")),
            ("old key".into(), "old cert".into())
        );
        assert!(!dir.join("agent.key.new").exists());
        // Both written, neither renamed: both are taken.
        write("agent.key.new", "new key");
        write("agent.pem.new", "new cert");
        roll_forward(&dir).unwrap();
        assert_eq!(
            (read("agent.key"), read("agent.pem")),
            ("new key".into(), "new cert".into())
        );
        // Cut between the renames (the key is in place): the certificate follows.
        write("agent.key", "newer key");
        write("agent.pem.new", "newer cert");
        roll_forward(&dir).unwrap();
        assert_eq!(
            (read("agent.key"), read("agent.pem")),
            ("newer key".into(), "newer cert".into())
        );
        // Nothing pending: nothing changes.
        roll_forward(&dir).unwrap();
        assert_eq!(read("agent.pem"), "newer cert");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
