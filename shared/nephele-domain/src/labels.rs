//! Labels on devices and the selectors deployments use to choose devices.
//!
//! Selector syntax (a subset of Kubernetes' equality-based selectors):
//! `key=value`, `key!=value`, `key` (exists), `!key` (does not exist), joined by `,`
//! meaning AND. The empty selector matches every device.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Key/value labels. A `BTreeMap` keeps iteration order (and so encodings) deterministic.
pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("invalid label {0:?}: expected key=value with key and value of letters, digits, '-', '_', '.', '/' (max 63 characters each)")]
    InvalidLabel(String),
    #[error("invalid selector term {0:?}: expected key=value, key!=value, key or !key")]
    InvalidTerm(String),
}

fn valid_token(text: &str, allow_empty: bool) -> bool {
    (allow_empty || !text.is_empty())
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

/// Parses `key=value` into a pair.
pub fn parse_label(text: &str) -> Result<(String, String), LabelError> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| LabelError::InvalidLabel(text.to_string()))?;
    if !valid_token(key, false) || !valid_token(value, true) {
        return Err(LabelError::InvalidLabel(text.to_string()));
    }
    Ok((key.to_string(), value.to_string()))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; see the module docs for the syntax.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Selector {
    pub terms: Vec<Term>,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, LabelError> {
        let mut terms = Vec::new();
        for raw in text.split(',') {
            let term = raw.trim();
            if term.is_empty() {
                continue;
            }
            let bad = || LabelError::InvalidTerm(term.to_string());
            let parsed = if let Some((key, value)) = term.split_once("!=") {
                Term::NotEquals(key.trim().to_string(), value.trim().to_string())
            } else if let Some((key, value)) = term.split_once('=') {
                Term::Equals(key.trim().to_string(), value.trim().to_string())
            } else if let Some(key) = term.strip_prefix('!') {
                Term::NotExists(key.trim().to_string())
            } else {
                Term::Exists(term.to_string())
            };
            let (key, value) = match &parsed {
                Term::Equals(k, v) | Term::NotEquals(k, v) => (k, v.as_str()),
                Term::Exists(k) | Term::NotExists(k) => (k, ""),
            };
            if !valid_token(key, false) || !valid_token(value, true) {
                return Err(bad());
            }
            terms.push(parsed);
        }
        Ok(Selector { terms })
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.matches_by(|key| labels.get(key).map(String::as_str))
    }

    /// Whether the labels `label` looks up by key match: the same as [`Self::matches`]
    /// without a map of them built first (a fleet's selector is evaluated on every
    /// device, whose labels are partly derived from its record).
    pub fn matches_by<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.terms.iter().all(|term| match term {
            Term::Equals(k, v) => label(k) == Some(v.as_str()),
            Term::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Term::Exists(k) => label(k).is_some(),
            Term::NotExists(k) => label(k).is_none(),
        })
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .terms
            .iter()
            .map(|term| match term {
                Term::Equals(k, v) => format!("{k}={v}"),
                Term::NotEquals(k, v) => format!("{k}!={v}"),
                Term::Exists(k) => k.clone(),
                Term::NotExists(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(selector: &str, device: &[(&str, &str)], expected: bool) {
        let parsed = Selector::parse(selector).expect("selector parses");
        assert_eq!(
            parsed.matches(&labels(device)),
            expected,
            "{selector} on {device:?}"
        );
    }

    #[test]
    fn selector_semantics() {
        let pi = [("tier", "edge"), ("site", "lab")];
        check("", &pi, true);
        check("tier=edge", &pi, true);
        check("tier=edge,site=lab", &pi, true);
        check("tier=edge,site=plant", &pi, false);
        check("tier!=cloud", &pi, true);
        check("site", &pi, true);
        check("!gpu", &pi, true);
        check("gpu", &pi, false);
        check("tier != edge", &pi, false);
    }

    #[test]
    fn malformed_selectors_and_labels_are_rejected() {
        for bad in ["a=b=c", "=x", "a b=c", "!", "k=v;rm"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
        assert!(parse_label("site=lab").is_ok());
        assert!(parse_label("site").is_err());
        assert!(parse_label("=lab").is_err());
    }

    proptest::proptest! {
        #[test]
        fn parsed_selectors_print_and_parse_back(
            terms in proptest::collection::vec(("[a-z][a-z0-9./_-]{0,8}", "[a-z0-9._-]{0,6}", 0u8..4), 0..5)
        ) {
            let text: Vec<String> = terms
                .iter()
                .map(|(k, v, kind)| match kind {
                    0 => format!("{k}={v}"),
                    1 => format!("{k}!={v}"),
                    2 => k.clone(),
                    _ => format!("!{k}"),
                })
                .collect();
            let selector = Selector::parse(&text.join(",")).unwrap();
            proptest::prop_assert_eq!(Selector::parse(&selector.to_string()).unwrap(), selector);
        }
    }

    #[test]
    fn display_round_trips() {
        let text = "a=b,c!=d,e,!f";
        assert_eq!(Selector::parse(text).unwrap().to_string(), text);
    }
}
