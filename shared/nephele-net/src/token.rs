//! Join tokens: `nph1.<id>.<secret>.<sha256 of the cluster CA, hex>`.
//!
//! The id names the token in the control plane's store (so it can be listed and revoked
//! without revealing the secret); the secret proves possession; the CA fingerprint lets
//! the device authenticate the control plane before it has any certificate (the same
//! idea as kubeadm's `--discovery-token-ca-cert-hash`).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
    pub ca_fingerprint: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed join token: {0} (expected nph1.<id>.<secret>.<64 hex digits>; create one with `nephele token create`)")]
    Malformed(&'static str),
}

impl JoinToken {
    pub fn parse(text: &str) -> Result<JoinToken, TokenError> {
        let mut parts = text.trim().split('.');
        if parts.next() != Some("nph1") {
            return Err(TokenError::Malformed("it does not start with nph1."));
        }
        let id = parts.next().ok_or(TokenError::Malformed("no id"))?;
        let secret = parts.next().ok_or(TokenError::Malformed("no secret"))?;
        let fingerprint_hex = parts
            .next()
            .ok_or(TokenError::Malformed("no CA fingerprint"))?;
        if parts.next().is_some() {
            return Err(TokenError::Malformed("too many parts"));
        }
        let alnum = |s: &str| {
            !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric())
        };
        if !alnum(id) || !alnum(secret) {
            return Err(TokenError::Malformed("id and secret must be alphanumeric"));
        }
        let bytes = hex::decode(fingerprint_hex)
            .map_err(|_| TokenError::Malformed("CA fingerprint is not hex"))?;
        let ca_fingerprint: [u8; 32] = bytes
            .try_into()
            .map_err(|_| TokenError::Malformed("CA fingerprint is not 32 bytes"))?;
        Ok(JoinToken {
            id: id.to_string(),
            secret: secret.to_string(),
            ca_fingerprint,
        })
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nph1.{}.{}.{}",
            self.id,
            self.secret,
            hex::encode(self.ca_fingerprint)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let token = JoinToken {
            id: "abc123".into(),
            secret: "s3cret".into(),
            ca_fingerprint: [7; 32],
        };
        assert_eq!(JoinToken::parse(&token.to_string()), Ok(token));
        for bad in [
            "",
            "nph2.a.b.0707",
            "nph1.a.b",
            "nph1.a.b.zz",
            "nph1.a.b.0707",
            "nph1..b.0707070707070707070707070707070707070707070707070707070707070707",
            "nph1.a.b.0707070707070707070707070707070707070707070707070707070707070707.x",
            "nph1.a-x.b.0707070707070707070707070707070707070707070707070707070707070707",
        ] {
            assert!(JoinToken::parse(bad).is_err(), "{bad}");
        }
    }
}
