//! The few fields nephele reads from a certificate: its validity and its subject's
//! common name (the agent's name) and organisational unit (its role). DER read by yasna,
//! which rcgen already brings, so the agent links no general X.509 parser (x509-parser
//! and its ASN.1 stack were 0.1 MB of the agent's binary). Certificates read here are
//! ones rustls has verified against the cluster CA, or the agent's own; anything else
//! is an error or `None`, never a panic. The tests check every answer against
//! x509-parser.

use yasna::models::ObjectIdentifier;
use yasna::{ASN1Error, ASN1ErrorKind, ASN1Result, BERReader, BERReaderSeq, Tag};

/// What nephele reads of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// Validity, in Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// The subject's first common name and first organisational unit, where they are
    /// strings.
    pub common_name: Option<String>,
    pub organizational_unit: Option<String>,
}

const COMMON_NAME: [u64; 4] = [2, 5, 4, 3];
const ORGANIZATIONAL_UNIT: [u64; 4] = [2, 5, 4, 11];

impl Certificate {
    /// Reads a DER certificate (`Certificate ::= SEQUENCE { tbsCertificate,
    /// signatureAlgorithm, signatureValue }`, RFC 5280 4.1).
    pub fn parse(der: &[u8]) -> ASN1Result<Certificate> {
        yasna::parse_der(der, |reader| {
            reader.read_sequence(|certificate| {
                let read = certificate.next().read_sequence(read_tbs)?;
                certificate.next().read_der()?; // signatureAlgorithm
                certificate.next().read_der()?; // signatureValue
                Ok(read)
            })
        })
    }
}

/// `TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
/// validity, subject, subjectPublicKeyInfo, [1] [2] [3] OPTIONAL }`.
fn read_tbs(tbs: &mut BERReaderSeq) -> ASN1Result<Certificate> {
    if tbs.next().lookahead_tag()? == Tag::context(0) {
        tbs.next().read_der()?; // version
    }
    tbs.next().read_der()?; // serialNumber
    tbs.next().read_der()?; // signature
    tbs.next().read_der()?; // issuer
    let (not_before, not_after) = tbs.next().read_sequence(|validity| {
        let not_before = read_time(validity.next())?;
        let not_after = read_time(validity.next())?;
        Ok((not_before, not_after))
    })?;
    let mut common_name = None;
    let mut organizational_unit = None;
    tbs.next().read_sequence_of(|rdn| {
        rdn.read_set_of(|attribute| {
            attribute.read_sequence(|pair| {
                let kind = pair.next().read_oid()?;
                let value = read_string(pair.next())?;
                let slot = if kind == ObjectIdentifier::from_slice(&COMMON_NAME) {
                    &mut common_name
                } else if kind == ObjectIdentifier::from_slice(&ORGANIZATIONAL_UNIT) {
                    &mut organizational_unit
                } else {
                    return Ok(());
                };
                if slot.is_none() {
                    *slot = value;
                }
                Ok(())
            })
        })
    })?;
    // subjectPublicKeyInfo and whatever optional fields follow it.
    while tbs.read_optional(|rest| rest.read_der())?.is_some() {}
    Ok(Certificate {
        not_before,
        not_after,
        common_name,
        organizational_unit,
    })
}

/// `Time ::= CHOICE { utcTime, generalTime }` in Unix seconds.
fn read_time(reader: BERReader) -> ASN1Result<i64> {
    let tag = reader.lookahead_tag()?;
    let time = if tag == yasna::tags::TAG_UTCTIME {
        *reader.read_utctime()?.datetime()
    } else if tag == yasna::tags::TAG_GENERALIZEDTIME {
        *reader.read_generalized_time()?.datetime()
    } else {
        return Err(ASN1Error::new(ASN1ErrorKind::Invalid));
    };
    Ok(time.unix_timestamp())
}

/// An attribute's value as text, where it is one of the string types names use; other
/// types are read past and give `None`.
fn read_string(reader: BERReader) -> ASN1Result<Option<String>> {
    use yasna::tags::{TAG_IA5STRING, TAG_NUMERICSTRING, TAG_PRINTABLESTRING, TAG_UTF8STRING};
    let tag = reader.lookahead_tag()?;
    Ok(if tag == TAG_UTF8STRING {
        Some(reader.read_utf8string()?)
    } else if tag == TAG_PRINTABLESTRING {
        Some(reader.read_printable_string()?)
    } else if tag == TAG_IA5STRING {
        Some(reader.read_ia5_string()?)
    } else if tag == TAG_NUMERICSTRING {
        Some(reader.read_numeric_string()?)
    } else {
        reader.read_der()?;
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair};

    fn certificate(names: &[(DnType, DnValue)], days: i64) -> Vec<u8> {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        for (kind, value) in names {
            name.push(kind.clone(), value.clone());
        }
        params.distinguished_name = name;
        params.not_before = rcgen::date_time_ymd(2024, 2, 29);
        params.not_after = params.not_before + time::Duration::days(days);
        params.self_signed(&key).expect("signed").der().to_vec()
    }

    /// What x509-parser reads of the same certificate.
    fn reference(der: &[u8]) -> Option<Certificate> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let read = Certificate {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            common_name: subject
                .iter_common_name()
                .next()
                .and_then(|a| a.as_str().ok())
                .map(str::to_string),
            organizational_unit: subject
                .iter_organizational_unit()
                .next()
                .and_then(|a| a.as_str().ok())
                .map(str::to_string),
        };
        Some(read)
    }

    #[test]
    fn reads_what_x509_parser_reads_of_agent_certificates() {
        let der = certificate(
            &[
                (DnType::CommonName, DnValue::Utf8String("pi-1".into())),
                (DnType::OrganizationalUnitName, "edge".into()),
                (DnType::OrganizationName, "nephele-agent".into()),
            ],
            365,
        );
        let read = Certificate::parse(&der).expect("read");
        assert_eq!(read.common_name.as_deref(), Some("pi-1"));
        assert_eq!(read.organizational_unit.as_deref(), Some("edge"));
        assert_eq!(read.not_before, 1_709_164_800);
        assert_eq!(read.not_after - read.not_before, 365 * 86_400);
        assert_eq!(Some(read), reference(&der));
        // After 2049 a validity is a GeneralizedTime.
        let long = certificate(&[(DnType::CommonName, "ca".into())], 365 * 40);
        let read = Certificate::parse(&long).expect("read");
        assert_eq!(Some(read.clone()), reference(&long));
        assert!(read.not_after > 2_524_608_000);
        // No subject names at all.
        let bare = certificate(&[], 1);
        let read = Certificate::parse(&bare).expect("read");
        assert_eq!(read.common_name, None);
        assert_eq!(Some(read), reference(&bare));
    }

    #[test]
    fn the_first_name_of_each_kind_is_read_whatever_string_type_it_has() {
        let der = certificate(
            &[
                (
                    DnType::OrganizationalUnitName,
                    DnValue::PrintableString("pool".try_into().expect("printable")),
                ),
                (
                    DnType::CommonName,
                    DnValue::Ia5String("gpu-7".try_into().expect("ia5")),
                ),
                (
                    DnType::CountryName,
                    DnValue::PrintableString("NL".try_into().expect("printable")),
                ),
            ],
            30,
        );
        let read = Certificate::parse(&der).expect("read");
        assert_eq!(read.common_name.as_deref(), Some("gpu-7"));
        assert_eq!(read.organizational_unit.as_deref(), Some("pool"));
        assert_eq!(Some(read), reference(&der));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn any_names_read_as_x509_parser_reads_them(
            name in "[\\PC]{1,24}",
            role in "[a-z0-9-]{1,12}",
            days in 1i64..20_000,
        ) {
            let der = certificate(
                &[
                    (DnType::CommonName, DnValue::Utf8String(name.clone())),
                    (DnType::OrganizationalUnitName, DnValue::Utf8String(role.clone())),
                ],
                days,
            );
            let read = Certificate::parse(&der).expect("read");
            prop_assert_eq!(read.common_name.as_deref(), Some(name.as_str()));
            prop_assert_eq!(read.organizational_unit.as_deref(), Some(role.as_str()));
            prop_assert_eq!(Some(read), reference(&der));
        }

        #[test]
        fn cut_or_damaged_certificates_are_errors_not_panics(
            cut in 0usize..400,
            flip in 0usize..400,
            byte in any::<u8>(),
        ) {
            let mut der = certificate(&[(DnType::CommonName, "pi-1".into())], 10);
            if flip < der.len() {
                der[flip] ^= byte;
            }
            let parsed = Certificate::parse(&der[..cut.min(der.len())]);
            if cut < der.len() {
                prop_assert!(parsed.is_err());
            }
        }
    }
}
