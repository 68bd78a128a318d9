//! The HTTP client of the REST API: requests, problem documents said plainly,
//! paged lists read in chunks.

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use super::*;

pub struct Api {
    base: String,
    token: String,
    agent: ureq::Agent,
    /// The CA trusted for the API's certificate (PEM), if one was given.
    ca: Option<Vec<u8>>,
    /// Reads may be answered from a replica's copy (`?stale`).
    pub stale: bool,
}

impl Api {
    /// A client trusting the public CAs (an API with a certificate from a public CA, or
    /// plain HTTP).
    pub fn new(base: &str, token: &str) -> Api {
        Api::with_ca(base, token, None)
    }

    /// A client trusting `ca_pem` (the cluster CA) for the API's certificate.
    pub fn with_ca(base: &str, token: &str, ca_pem: Option<&[u8]>) -> Api {
        let agent: ureq::Agent = agent_builder(ca_pem)
            .timeout_global(Some(std::time::Duration::from_secs(60)))
            .build()
            .into();
        // The base URL, also when given as the API's `/v1` root (as the demo once
        // printed it): every path the CLI asks starts with `/v1` itself.
        let base = base.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Api {
            base: base.to_string(),
            token: token.to_string(),
            agent,
            ca: ca_pem.map(<[u8]>::to_vec),
            stale: false,
        }
    }

    /// The CA this client trusts (PEM), if one was given.
    pub fn ca(&self) -> Option<&[u8]> {
        self.ca.as_deref()
    }

    fn finish(
        &self,
        what: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value> {
        Ok(self.finish_listed(what, response)?.value)
    }

    /// As `finish`, keeping what a paged list's answer says besides its items.
    fn finish_listed(
        &self,
        what: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Answer> {
        let mut response = response.map_err(|error| self.explain(what, error))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        if header("x-nephele-stale").as_deref() == Some("true") {
            let age = header("x-nephele-copy-age-ms").unwrap_or_else(|| "?".into());
            let why = header("x-nephele-stale-reason")
                .map(|why| format!(" ({why})"))
                .unwrap_or_default();
            eprintln!(
                "note: answered from a standby's copy of the store, {age} ms old, without live state{why}"
            );
        }
        let next = header("link").as_deref().and_then(next_link);
        let total = header("x-total-count").and_then(|t| t.parse().ok());
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status >= 400 {
            // Every error of the API is a problem document; anything else (a proxy's
            // page) is shown as it came.
            let (message, field) =
                match serde_json::from_value::<nephele_api::Problem>(value.clone()) {
                    Ok(problem) => (problem.detail, problem.field),
                    Err(_) => (value.to_string(), None),
                };
            let field = field
                .filter(|field| !message.contains(field.as_str()))
                .map(|field| format!(" (field: {field})"))
                .unwrap_or_default();
            bail!("{what} failed ({status}): {message}{field}");
        }
        Ok(Answer { value, next, total })
    }

    /// Up to `wanted` items of the list at `path` (which may carry its own query), read
    /// `chunk` at a time (`?limit=`) by following each page's `Link: rel="next"`, as
    /// `kubectl` reads in chunks: each request costs the control plane a page, not the
    /// whole fleet. A server that answers the list whole (a standby's copy) is taken as
    /// it comes.
    pub fn list_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        chunk: usize,
        wanted: usize,
    ) -> Result<Listing<T>> {
        let chunk = chunk.clamp(1, 1000).min(wanted.max(1));
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut next = Some(format!("{path}{separator}limit={chunk}"));
        let mut listing = Listing {
            items: Vec::new(),
            total: None,
        };
        while let Some(page) = next.take() {
            if listing.items.len() >= wanted {
                break;
            }
            let what = format!("GET {page}");
            let answer = self.finish_listed(&what, self.get_response(&page))?;
            let items: Vec<T> = typed(&what, answer.value)?;
            listing.total = answer.total.or(listing.total);
            next = answer.next;
            listing.items.extend(items);
        }
        listing.items.truncate(wanted);
        Ok(listing)
    }

    /// GETs `path` as the API's type `T` (`nephele_api`).
    pub fn get_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        typed(&format!("GET {path}"), self.get(path)?)
    }

    /// POSTs `body` to `path`, reading the answer as `T`.
    pub fn post_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let body = serde_json::to_value(body).context("encode the request")?;
        typed(&format!("POST {path}"), self.post(path, &body)?)
    }

    /// PUTs `body` to `path`, reading the answer as `T`.
    pub fn put_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let body = serde_json::to_value(body).context("encode the request")?;
        typed(&format!("PUT {path}"), self.put_json(path, &body)?)
    }

    /// DELETEs `path`, reading the answer as `T`.
    pub fn delete_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        typed(&format!("DELETE {path}"), self.delete(path)?)
    }

    /// A failed request said as what it was: a URL that is not one, or a server that
    /// could not be reached (only then is the network to blame).
    fn explain(&self, what: &str, error: ureq::Error) -> anyhow::Error {
        let said = error.to_string();
        // rustls' verdicts come through as IO errors.
        let tls = matches!(error, ureq::Error::Rustls(_) | ureq::Error::Tls(_))
            || said.contains("peer certificate")
            || said.contains("certificate")
            || said.contains("handshake");
        if said.contains("InvalidContentType") && self.base.starts_with("https://") {
            return anyhow::anyhow!(
                "the API at {} did not answer TLS ({what}: {error}); if it is served as plain HTTP (nephele-cloud --plain-http), use http://",
                self.base
            );
        }
        if tls && self.base.starts_with("https://") {
            return anyhow::anyhow!(
                "the API at {} did not pass the TLS check ({what}: {error}); trust the control plane's cluster CA with --ca FILE (NEPHELE_CA; it is <data-dir>/ca.pem there), or save it in a context with nephele login --ca FILE",
                self.base
            );
        }
        if matches!(error, ureq::Error::Protocol(_)) && self.base.starts_with("http://") {
            return anyhow::anyhow!(
                "the API at {} did not answer plain HTTP ({what}: {error}); nephele-cloud serves HTTPS unless started with --plain-http: use https://… and --ca FILE",
                self.base
            );
        }
        match error {
            ureq::Error::BadUri(_) | ureq::Error::Http(_) => anyhow::anyhow!(
                "--api {:?} is not a URL the CLI can use ({error}); give the API's base URL, such as https://127.0.0.1:8080",
                self.base
            ),
            ureq::Error::Rustls(_) | ureq::Error::Tls(_) => anyhow::anyhow!(
                "the API at {} did not pass the TLS check ({what}: {error}); an API served as plain HTTP (--plain-http) is reached with http://",
                self.base
            ),
            ureq::Error::Io(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Timeout(_) => anyhow::anyhow!(
                "cannot reach the API at {} ({what}: {error}); is nephele-cloud running there? (--api or NEPHELE_API)",
                self.base
            ),
            other => anyhow::anyhow!("{what} failed: {other}"),
        }
    }

    fn auth(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// A streaming GET (no overall timeout): the response, for reading as it comes.
    pub fn stream(
        &self,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let agent: ureq::Agent = agent_builder(self.ca()).build().into();
        let mut request = agent
            .get(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let mut response = request
            .call()
            .map_err(|error| self.explain(&format!("GET {path}"), error))?;
        if response.status().as_u16() >= 400 {
            let text = response.body_mut().read_to_string().unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            bail!(
                "GET {path} failed ({}): {}",
                response.status().as_u16(),
                value["detail"].as_str().unwrap_or(&value.to_string())
            );
        }
        Ok(response)
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.finish(&format!("GET {path}"), self.get_response(path))
    }

    fn get_response(&self, path: &str) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let query = match (self.stale, path.contains('?')) {
            (false, _) => "",
            (true, false) => "?stale",
            (true, true) => "&stale",
        };
        self.agent
            .get(format!("{}{path}{query}", self.base))
            .header("authorization", self.auth())
            .call()
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .send_json(body);
        self.finish(&format!("POST {path}"), response)
    }

    pub fn put_json(&self, path: &str, body: &Value) -> Result<Value> {
        let response = self
            .agent
            .put(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .send_json(body);
        self.finish(&format!("PUT {path}"), response)
    }

    /// PUTs a file as the body, streamed from disk with an upload bar (see
    /// [`crate::upload`]), with no overall timeout: a large model over a slow link
    /// takes what it takes (each read and write still times out).
    pub fn put_file(&self, path: &str, upload: crate::upload::Upload) -> Result<Value> {
        let agent: ureq::Agent = agent_builder(self.ca())
            .timeout_connect(Some(std::time::Duration::from_secs(10)))
            .timeout_recv_response(Some(std::time::Duration::from_secs(300)))
            .build()
            .into();
        let response = agent
            .put(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .header("content-type", "application/octet-stream")
            .header("content-length", upload.len().to_string())
            .send(ureq::SendBody::from_owned_reader(upload));
        self.finish(&format!("PUT {path}"), response)
    }

    pub fn delete(&self, path: &str) -> Result<Value> {
        let response = self
            .agent
            .delete(format!("{}{path}", self.base))
            .header("authorization", self.auth())
            .call();
        self.finish(&format!("DELETE {path}"), response)
    }
}

/// How a long list is read and how much of it is shown.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    /// Show at most this many (the first, in key order); the table then says how many
    /// the whole list holds.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Items asked per request (1 to 1000): a fleet of 10,000 is read in pages, each
    /// costing the control plane a page rather than the whole list.
    #[arg(long, value_name = "N", default_value_t = 500,
          value_parser = clap::value_parser!(u16).range(1..=1000).map(usize::from))]
    pub chunk_size: usize,
}

impl ListArgs {
    /// The items of the list at `path`, as these arguments ask.
    pub fn read<T: serde::de::DeserializeOwned>(
        &self,
        api: &Api,
        path: &str,
    ) -> Result<Listing<T>> {
        api.list_as(path, self.chunk_size, self.limit.unwrap_or(usize::MAX))
    }
}

/// control plane speak different versions of the API.
/// An answer's body, with what a paged list's answer says besides its items.
struct Answer {
    value: Value,
    /// The next page's path and query (`Link: <…>; rel="next"`), absent on the last.
    next: Option<String>,
    /// The whole list's size (`X-Total-Count`).
    total: Option<usize>,
}

/// What [`Api::list_as`] read: the items, and how many the whole list holds when the
/// server said.
pub struct Listing<T> {
    pub items: Vec<T>,
    pub total: Option<usize>,
}

impl<T> Listing<T> {
    /// A line saying the table shows part of the list, when it does.
    pub fn left_out(&self, noun: &str) -> Option<String> {
        self.total
            .filter(|total| *total > self.items.len())
            .map(|total| {
                format!(
                    "{} of {total} {noun} shown; --limit N shows more",
                    self.items.len()
                )
            })
    }
}

/// The target of a `Link` header's `rel="next"` entry.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|entry| {
        let (target, params) = entry.trim().split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| {
                target
                    .trim()
                    .strip_prefix('<')?
                    .strip_suffix('>')
                    .map(str::to_string)
            })
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        assert_eq!(
            next_link("</v1/devices?limit=2&after=cam-1>; rel=\"next\"").as_deref(),
            Some("/v1/devices?limit=2&after=cam-1")
        );
        assert_eq!(
            next_link("</a>; rel=\"prev\", </b?after=x>; rel=\"next\"").as_deref(),
            Some("/b?after=x")
        );
        assert_eq!(next_link("</a>; rel=\"prev\""), None);
        assert_eq!(next_link("garbage"), None);
    }

    #[test]
    fn the_api_url_may_be_given_with_its_v1_root() {
        for given in [
            "http://cp:8080",
            "http://cp:8080/",
            "http://cp:8080/v1",
            "http://cp:8080/v1/",
        ] {
            assert_eq!(Api::new(given, "").base, "http://cp:8080", "{given}");
        }
    }
}
