//! What configures tracing in a process: its flags first, then OpenTelemetry's standard
//! environment variables, so a collector set up for other services is found the same
//! way. Pure: the environment is passed in.
//!
//! | setting        | flag                   | environment                                                      | default |
//! |----------------|------------------------|------------------------------------------------------------------|---------|
//! | collector      | `--otlp-endpoint URL`  | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT` | none: tracing off (trace context is still passed on) |
//! | protocol       | `--otlp-protocol`      | `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, `http/protobuf`) | `grpc`; `http/protobuf` in a build without OTLP/gRPC (the agent as it ships) |
//! | sampling       | `--trace-sample-ratio` | `OTEL_TRACES_SAMPLER_ARG` (with `OTEL_TRACES_SAMPLER` `traceidratio` or `parentbased_traceidratio`) | 1.0 of new traces; a caller's decision is followed |
//! | service name   |                        | `OTEL_SERVICE_NAME`                                              | the program's name |
//! | resource       |                        | `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k=v`)                            |         |
//! | export timeout |                        | `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds)                       | 10000   |
//! | off            |                        | `OTEL_SDK_DISABLED=true`                                         |         |
//!
//! Over OTLP/HTTP the address is a base to which `/v1/traces` is added (the flag and
//! `OTEL_EXPORTER_OTLP_ENDPOINT`; a base that already ends with it is taken as it is),
//! except `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, which is the whole URL, as the
//! specification has it. Over OTLP/gRPC the path is not used.

use std::time::Duration;

use crate::otlp::HTTP_TRACES_PATH;
use crate::span::Value;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC: HTTP/2, port 4317 by default (the `grpc` feature).
    Grpc,
    /// OTLP/HTTP with protobuf bodies: HTTP/1.1, port 4318 by default.
    HttpProtobuf,
}

impl Protocol {
    /// What is used when nothing names one: gRPC where this build has it.
    pub const DEFAULT: Protocol = if cfg!(feature = "grpc") {
        Protocol::Grpc
    } else {
        Protocol::HttpProtobuf
    };

    /// The specification's names: `grpc`, `http/protobuf`.
    pub fn parse(value: &str) -> Result<Protocol, String> {
        match value.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => {
                Err("OTLP protocol http/json is not supported; use http/protobuf or grpc".into())
            }
            other => Err(format!(
                "{other:?} is not an OTLP protocol; use grpc or http/protobuf"
            )),
        }
    }

    /// Whether this build can export with it.
    pub fn is_built(self) -> bool {
        match self {
            Protocol::Grpc => cfg!(feature = "grpc"),
            Protocol::HttpProtobuf => true,
        }
    }

    pub fn default_port(self) -> u16 {
        match self {
            Protocol::Grpc => 4317,
            Protocol::HttpProtobuf => 4318,
        }
    }

    /// As logs say it: `OTLP/gRPC`, `OTLP/HTTP`.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Grpc => "OTLP/gRPC",
            Protocol::HttpProtobuf => "OTLP/HTTP",
        }
    }
}

/// How an address names the traces path (OTLP/HTTP only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A base address: `/v1/traces` is added to its path.
    Base,
    /// The whole URL: its path is used as it is (`/v1/traces` when it has none).
    Whole,
}

/// Where the collector listens (plain HTTP, no TLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// The path requests go to (OTLP/HTTP); unused over gRPC.
    pub path: String,
}

impl Endpoint {
    /// `http://HOST[:PORT][/PATH]` or `HOST:PORT[/PATH]`; the port defaults to the
    /// protocol's (4317 for gRPC, 4318 for HTTP).
    pub fn parse(value: &str, protocol: Protocol, kind: Path) -> Result<Endpoint, String> {
        let value = value.trim();
        let rest = if let Some(rest) = value.strip_prefix("http://") {
            rest
        } else if value.starts_with("https://") {
            return Err(format!(
                "{value}: OTLP over TLS is not supported yet; run a collector on the node (or a sidecar) and give its plain http:// address"
            ));
        } else if value.contains("://") {
            return Err(format!(
                "{value}: the collector's address must be http://HOST:PORT ({})",
                protocol.label()
            ));
        } else {
            value
        };
        let (authority, path) = match rest.find('/') {
            Some(slash) => rest.split_at(slash),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(format!(
                "{value:?} names no host; give http://HOST:PORT, e.g. http://127.0.0.1:{}",
                protocol.default_port()
            ));
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| format!("{value}: an IPv6 address needs its closing ]"))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        let port = match port {
            None => protocol.default_port(),
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{value}: {port:?} is not a port"))?,
        };
        if host.is_empty() {
            return Err(format!("{value:?} names no host"));
        }
        if path.contains(['?', '#', ' ']) {
            return Err(format!(
                "{value}: the collector's address takes a path but no query or fragment"
            ));
        }
        let trimmed = path.trim_end_matches('/');
        let path = match kind {
            Path::Whole if !trimmed.is_empty() => path.to_string(),
            _ if trimmed.ends_with(HTTP_TRACES_PATH) => trimmed.to_string(),
            _ => format!("{trimmed}{HTTP_TRACES_PATH}"),
        };
        Ok(Endpoint {
            host: host.to_string(),
            port,
            path,
        })
    }

    /// `host:port` as an HTTP `Host` or HTTP/2 `:authority` (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `http://host:port/path`, as OTLP/HTTP requests go to it.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority(), self.path)
    }
}

/// A process's tracing configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub endpoint: Endpoint,
    pub protocol: Protocol,
    pub sample_ratio: f64,
    pub service_name: String,
    /// From `OTEL_RESOURCE_ATTRIBUTES`; the process adds its own (instance, region…).
    pub resource: Vec<(String, Value)>,
    pub timeout: Duration,
}

impl Settings {
    /// Where spans go, as logs say it: the URL over OTLP/HTTP, host and port over gRPC.
    pub fn collector(&self) -> String {
        match self.protocol {
            Protocol::HttpProtobuf => self.endpoint.url(),
            Protocol::Grpc => self.endpoint.authority(),
        }
    }

    /// The settings, `None` when no collector is named (or tracing is switched off),
    /// or why a value is wrong (said before the process starts serving).
    pub fn resolve(
        flag_endpoint: Option<&str>,
        flag_protocol: Option<&str>,
        flag_ratio: Option<f64>,
        default_service: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, String> {
        let env = |key: &str| {
            env(key)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let named = flag_endpoint
            .map(|e| (e.to_string(), Path::Base))
            .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").map(|e| (e, Path::Whole)))
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| (e, Path::Base)));
        let Some((endpoint, kind)) = named else {
            return Ok(None);
        };
        let protocol = match flag_protocol.map(str::to_string).or_else(|| {
            env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        }) {
            Some(name) => Protocol::parse(&name)?,
            None => Protocol::DEFAULT,
        };
        if !protocol.is_built() {
            return Err(format!(
                "this build has no {} exporter (it was built without the `otlp-grpc` feature); use the protocol http/protobuf (--otlp-protocol http/protobuf or OTEL_EXPORTER_OTLP_PROTOCOL) with the collector's OTLP/HTTP address (port 4318)",
                protocol.label()
            ));
        }
        let endpoint = Endpoint::parse(&endpoint, protocol, kind)?;
        let sample_ratio = match flag_ratio {
            Some(ratio) => ratio,
            None => match env("OTEL_TRACES_SAMPLER").as_deref() {
                None | Some("parentbased_always_on") | Some("always_on") => 1.0,
                Some("parentbased_always_off") | Some("always_off") => 0.0,
                Some("traceidratio") | Some("parentbased_traceidratio") => {
                    match env("OTEL_TRACES_SAMPLER_ARG") {
                        None => 1.0,
                        Some(arg) => arg.parse::<f64>().map_err(|_| {
                            format!("OTEL_TRACES_SAMPLER_ARG={arg:?} is not a ratio between 0 and 1")
                        })?,
                    }
                }
                Some(other) => {
                    return Err(format!(
                        "OTEL_TRACES_SAMPLER={other:?} is not supported; use parentbased_traceidratio (with OTEL_TRACES_SAMPLER_ARG), parentbased_always_on or parentbased_always_off"
                    ))
                }
            },
        };
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(format!(
                "the trace sample ratio {sample_ratio} must be between 0 and 1"
            ));
        }
        let timeout = match env("OTEL_EXPORTER_OTLP_TIMEOUT") {
            None => Duration::from_secs(10),
            Some(ms) => Duration::from_millis(ms.parse::<u64>().map_err(|_| {
                format!("OTEL_EXPORTER_OTLP_TIMEOUT={ms:?} is not a number of milliseconds")
            })?),
        };
        let mut resource = Vec::new();
        if let Some(attributes) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for pair in attributes.split(',').filter(|p| !p.trim().is_empty()) {
                let (key, value) = pair.split_once('=').ok_or_else(|| {
                    format!("OTEL_RESOURCE_ATTRIBUTES: {pair:?} is not key=value")
                })?;
                resource.push((key.trim().to_string(), Value::Str(value.trim().to_string())));
            }
        }
        Ok(Some(Settings {
            endpoint,
            protocol,
            sample_ratio,
            service_name: env("OTEL_SERVICE_NAME").unwrap_or_else(|| default_service.to_string()),
            resource,
            timeout,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn endpoints_parse_as_collectors_are_named() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:4317", Protocol::Grpc, Path::Base)
                .map(|e| e.authority()),
            Ok("127.0.0.1:4317".into())
        );
        assert_eq!(
            Endpoint::parse("http://collector/", Protocol::Grpc, Path::Base).map(|e| e.authority()),
            Ok("collector:4317".into())
        );
        assert_eq!(
            Endpoint::parse("[::1]:9000", Protocol::Grpc, Path::Base).map(|e| e.authority()),
            Ok("[::1]:9000".into())
        );
        for bad in [
            "",
            "http://",
            "http://host:0",
            "http://host:x",
            "grpc://h:1",
            "[::1",
        ] {
            assert!(
                Endpoint::parse(bad, Protocol::Grpc, Path::Base).is_err(),
                "{bad:?} accepted"
            );
        }
        let tls =
            Endpoint::parse("https://collector:4317", Protocol::Grpc, Path::Base).expect_err("TLS");
        assert!(tls.contains("not supported yet"), "{tls}");
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_nothing_named_is_off() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
        ]);
        let from_env = Settings::resolve(None, None, None, "svc", &e)
            .expect("ok")
            .expect("on");
        assert_eq!(from_env.endpoint.host, "traces");
        let from_flag = Settings::resolve(Some("http://flag:1"), None, None, "svc", &e)
            .expect("ok")
            .expect("on");
        assert_eq!(from_flag.endpoint.host, "flag");
        assert_eq!(
            Settings::resolve(None, None, None, "svc", &env(&[])),
            Ok(None)
        );
        let off = env(&[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4317"),
        ]);
        assert_eq!(Settings::resolve(None, None, None, "svc", &off), Ok(None));
    }

    #[test]
    fn sampling_service_and_resource_come_from_the_standard_variables() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
            ("OTEL_SERVICE_NAME", "edge-fleet"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod, team=ml",
            ),
        ]);
        let settings = Settings::resolve(None, None, None, "svc", &e)
            .expect("ok")
            .expect("on");
        assert_eq!(settings.sample_ratio, 0.1);
        assert_eq!(settings.service_name, "edge-fleet");
        assert_eq!(settings.resource.len(), 2);
        assert_eq!(
            settings.resource[1],
            ("team".into(), Value::Str("ml".into()))
        );
        let bad = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
        ]);
        assert!(Settings::resolve(None, None, None, "svc", &bad).is_err());
        assert!(Settings::resolve(None, None, Some(1.5), "svc", &e).is_err());
    }

    #[test]
    fn over_http_the_traces_path_is_added_to_a_base_and_kept_in_a_whole_url() {
        let http =
            |value, kind| Endpoint::parse(value, Protocol::HttpProtobuf, kind).map(|e| e.url());
        assert_eq!(
            http("http://collector", Path::Base),
            Ok("http://collector:4318/v1/traces".into())
        );
        assert_eq!(
            http("http://collector:9000/otel/", Path::Base),
            Ok("http://collector:9000/otel/v1/traces".into())
        );
        assert_eq!(
            http("http://collector:4318/v1/traces", Path::Base),
            Ok("http://collector:4318/v1/traces".into())
        );
        assert_eq!(
            http("http://collector:4318/custom/traces", Path::Whole),
            Ok("http://collector:4318/custom/traces".into())
        );
        assert_eq!(
            http("http://[::1]", Path::Whole),
            Ok("http://[::1]:4318/v1/traces".into())
        );
        assert!(http("http://c:4318/v1/traces?x=1", Path::Base).is_err());
    }

    #[test]
    fn the_protocol_comes_from_the_flag_then_the_environment_then_the_build() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]);
        let settings = Settings::resolve(None, None, None, "svc", &e)
            .expect("ok")
            .expect("on");
        assert_eq!(settings.protocol, Protocol::HttpProtobuf);
        assert_eq!(settings.endpoint.url(), "http://c:4318/v1/traces");
        let traces = env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:1/t"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ]);
        let settings = Settings::resolve(None, None, None, "svc", &traces)
            .expect("ok")
            .expect("on");
        assert_eq!(settings.protocol, Protocol::HttpProtobuf);
        assert_eq!(settings.endpoint.url(), "http://c:1/t");
        let flagged = Settings::resolve(
            None,
            Some("http/protobuf"),
            None,
            "svc",
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
        )
        .expect("ok")
        .expect("on");
        assert_eq!(flagged.protocol, Protocol::HttpProtobuf);
        let unnamed = Settings::resolve(Some("http://c"), None, None, "svc", &env(&[]))
            .expect("ok")
            .expect("on");
        assert_eq!(unnamed.protocol, Protocol::DEFAULT);
        assert_eq!(
            unnamed.endpoint.port,
            Protocol::DEFAULT.default_port(),
            "the default port is the protocol's"
        );
        for bad in ["http/json", "udp"] {
            let error = Settings::resolve(Some("http://c"), Some(bad), None, "svc", &env(&[]))
                .expect_err("refused");
            assert!(error.contains("http/protobuf"), "{error}");
        }
    }

    #[test]
    fn grpc_in_a_build_without_it_is_refused_saying_what_to_use() {
        let asked = Settings::resolve(Some("http://c:4317"), Some("grpc"), None, "svc", &env(&[]));
        if cfg!(feature = "grpc") {
            assert_eq!(asked.expect("ok").expect("on").protocol, Protocol::Grpc);
        } else {
            let error = asked.expect_err("refused");
            assert!(error.contains("--otlp-protocol http/protobuf"), "{error}");
            assert!(error.contains("otlp-grpc"), "{error}");
        }
    }
}
