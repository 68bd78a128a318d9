//! The cluster certificate authority and the certificates it issues.
//!
//! | certificate   | subject CN        | OU          | SANs                        | EKU        | validity |
//! |---------------|-------------------|-------------|-----------------------------|------------|----------|
//! | cluster CA    | `nephele-ca <id>` | —           | —                           | —          | 10 years |
//! | control plane | `nephele-cloud`   | —           | `nephele-cloud` + config    | serverAuth | 1 year   |
//! | agent         | agent name        | agent role  | —                           | clientAuth | 1 year   |
//!
//! Agent certificates are issued only from a CSR, so agent private keys never leave the
//! device. The subject of an agent certificate is set by the control plane, never
//! copied from the CSR.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate operation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
}

/// sha256 of a DER certificate.
pub fn fingerprint(der: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The cluster CA: its certificate and private key (PEM), as stored in the data dir.
pub struct ClusterCa {
    pub cert_pem: String,
    pub key_pem: String,
    cert_der: CertificateDer<'static>,
    key: KeyPair,
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // Back-date by a day so small clock skew between device and control plane is harmless.
    let (y, m, d) = date_from_unix_days(now / 86_400 - 1);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = date_from_unix_days(now / 86_400 + days);
    params.not_after = rcgen::date_time_ymd(y, m, d);
}

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn date_from_unix_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

impl ClusterCa {
    /// Creates a new CA with a random id in its name.
    pub fn generate(cluster_id: &str) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, format!("nephele-ca {cluster_id}"));
        name.push(DnType::OrganizationName, "nephele");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, 3650);
        let cert = params.self_signed(&key)?;
        Ok(ClusterCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key,
        })
    }

    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        let der = pem_to_der(cert_pem)?;
        Ok(ClusterCa {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            cert_der: CertificateDer::from(der),
            key,
        })
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    pub fn fingerprint(&self) -> [u8; 32] {
        fingerprint(&self.cert_der)
    }

    fn issuer(&self) -> Result<Issuer<'_, &KeyPair>, PkiError> {
        Ok(Issuer::from_ca_cert_der(&self.cert_der, &self.key)?)
    }

    /// Issues the control plane's server certificate. Returns (certificate DER, PKCS#8
    /// key DER).
    pub fn issue_server(&self, names: &[String]) -> Result<(Vec<u8>, Vec<u8>), PkiError> {
        let key = KeyPair::generate()?;
        let mut all_names = vec![crate::tls::SERVER_NAME.to_string()];
        all_names.extend(names.iter().cloned());
        all_names.dedup();
        let mut params = CertificateParams::new(all_names)?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, crate::tls::SERVER_NAME);
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, 365);
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok((cert.der().to_vec(), key.serialize_der()))
    }

    /// Signs an agent's CSR. The subject is replaced by `agent_name` / `role`; only the
    /// public key (whose possession the CSR's signature proves) is taken from it.
    pub fn sign_agent_csr(
        &self,
        csr_der: &[u8],
        agent_name: &str,
        role: &str,
    ) -> Result<Vec<u8>, PkiError> {
        let csr_der = CertificateSigningRequestDer::from(csr_der.to_vec());
        let mut csr = CertificateSigningRequestParams::from_der(&csr_der)
            .map_err(|error| PkiError::Invalid(format!("invalid certificate request: {error}")))?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, agent_name);
        name.push(DnType::OrganizationalUnitName, role);
        name.push(DnType::OrganizationName, "nephele-agent");
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, 365);
        csr.params = params;
        Ok(csr.signed_by(&self.issuer()?)?.der().to_vec())
    }
}

/// A certificate's validity, `(not_before, not_after)` in Unix seconds.
pub fn validity_unix(cert_der: &[u8]) -> Result<(i64, i64), PkiError> {
    let cert = crate::x509::Certificate::parse(cert_der)
        .map_err(|error| PkiError::Invalid(format!("invalid certificate: {error}")))?;
    Ok((cert.not_before, cert.not_after))
}

/// Makes a key pair and a CSR for it on the device. Returns (PKCS#8 key PEM, CSR DER).
pub fn agent_csr(agent_name: &str) -> Result<(String, Vec<u8>), PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, agent_name);
    params.distinguished_name = name;
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.der().to_vec()))
}

/// The DER bytes of the first PEM block.
pub fn pem_to_der(pem_text: &str) -> Result<Vec<u8>, PkiError> {
    let body: String = pem_text
        .lines()
        .skip_while(|line| !line.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|line| !line.starts_with("-----END"))
        .collect();
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .map_err(|_| PkiError::Invalid("PEM block is not valid base64".into()))
}

/// PEM-encodes DER bytes with a label such as `CERTIFICATE`.
pub fn der_to_pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        let check = |days, y, m, d| assert_eq!(date_from_unix_days(days), (y, m, d));
        check(0, 1970, 1, 1);
        check(19_782, 2024, 2, 29);
        check(20_787, 2026, 11, 30);
    }

    #[test]
    fn ca_signs_agent_csrs_with_its_own_subject() {
        let ca = ClusterCa::generate("test").expect("ca");
        let (_key, csr) = agent_csr("sneaky-admin").expect("csr");
        let cert = ca.sign_agent_csr(&csr, "pi-1", "edge").expect("signed");
        let identity = crate::tls::parse_identity(&cert).expect("identity");
        assert_eq!(identity.name, "pi-1");
        // A year from yesterday (a day of slack for clocks behind the CA's).
        let (not_before, not_after) = validity_unix(&cert).expect("validity");
        assert!((364 * 86_400..=367 * 86_400).contains(&(not_after - not_before)));
        assert!(validity_unix(b"garbage").is_err());
        assert_eq!(identity.role, "edge");
        assert!(ca.sign_agent_csr(b"garbage", "x", "edge").is_err());
        let reloaded = ClusterCa::from_pem(&ca.cert_pem, &ca.key_pem).expect("reload");
        assert_eq!(reloaded.fingerprint(), ca.fingerprint());
        assert_eq!(
            pem_to_der(&der_to_pem("CERTIFICATE", ca.cert_der())).unwrap(),
            ca.cert_der().to_vec()
        );
    }
}
