//! What configures tracing in a process: its flags first, then OpenTelemetry's standard
//! environment variables, so a collector set up for other services is found the same
//! way. Pure: the environment is passed in.
//!
//! | setting        | flag                   | environment                                                      | default |
//! |----------------|------------------------|------------------------------------------------------------------|---------|
//! | collector      | `--otlp-endpoint URL`  | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT` | none: tracing off (trace context is still passed on) |
//! | sampling       | `--trace-sample-ratio` | `OTEL_TRACES_SAMPLER_ARG` (with `OTEL_TRACES_SAMPLER` `traceidratio` or `parentbased_traceidratio`) | 1.0 of new traces; a caller's decision is followed |
//! | service name   |                        | `OTEL_SERVICE_NAME`                                              | the program's name |
//! | resource       |                        | `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k=v`)                            |         |
//! | export timeout |                        | `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds)                       | 10000   |
//! | off            |                        | `OTEL_SDK_DISABLED=true`                                         |         |

use std::time::Duration;

use crate::span::Value;

/// Where the collector listens (OTLP/gRPC, plain HTTP/2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// `http://HOST[:PORT][/]` or `HOST:PORT`; the port defaults to 4317 (OTLP/gRPC).
    pub fn parse(value: &str) -> Result<Endpoint, String> {
        let value = value.trim();
        let rest = if let Some(rest) = value.strip_prefix("http://") {
            rest
        } else if value.starts_with("https://") {
            return Err(format!(
                "{value}: OTLP over TLS is not supported yet; run a collector on the node (or a sidecar) and give its plain http:// address"
            ));
        } else if value.contains("://") {
            return Err(format!(
                "{value}: the collector's address must be http://HOST:PORT (OTLP/gRPC)"
            ));
        } else {
            value
        };
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.is_empty() {
            return Err(format!(
                "{value:?} names no host; give http://HOST:PORT, e.g. http://127.0.0.1:4317"
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
            None => 4317,
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{value}: {port:?} is not a port"))?,
        };
        if host.is_empty() {
            return Err(format!("{value:?} names no host"));
        }
        Ok(Endpoint {
            host: host.to_string(),
            port,
        })
    }

    /// `host:port` as an HTTP/2 `:authority` (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A process's tracing configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub endpoint: Endpoint,
    pub sample_ratio: f64,
    pub service_name: String,
    /// From `OTEL_RESOURCE_ATTRIBUTES`; the process adds its own (instance, region…).
    pub resource: Vec<(String, Value)>,
    pub timeout: Duration,
}

impl Settings {
    /// The settings, `None` when no collector is named (or tracing is switched off),
    /// or why a value is wrong (said before the process starts serving).
    pub fn resolve(
        flag_endpoint: Option<&str>,
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
        let endpoint = match flag_endpoint.map(str::to_string).or_else(|| {
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
        }) {
            Some(endpoint) => Endpoint::parse(&endpoint)?,
            None => return Ok(None),
        };
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
            Endpoint::parse("http://127.0.0.1:4317").map(|e| e.authority()),
            Ok("127.0.0.1:4317".into())
        );
        assert_eq!(
            Endpoint::parse("http://collector/").map(|e| e.authority()),
            Ok("collector:4317".into())
        );
        assert_eq!(
            Endpoint::parse("[::1]:9000").map(|e| e.authority()),
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
            assert!(Endpoint::parse(bad).is_err(), "{bad:?} accepted");
        }
        let tls = Endpoint::parse("https://collector:4317").expect_err("TLS");
        assert!(tls.contains("not supported yet"), "{tls}");
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_nothing_named_is_off() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
        ]);
        let from_env = Settings::resolve(None, None, "svc", &e)
            .expect("ok")
            .expect("on");
        assert_eq!(from_env.endpoint.host, "traces");
        let from_flag = Settings::resolve(Some("http://flag:1"), None, "svc", &e)
            .expect("ok")
            .expect("on");
        assert_eq!(from_flag.endpoint.host, "flag");
        assert_eq!(Settings::resolve(None, None, "svc", &env(&[])), Ok(None));
        let off = env(&[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4317"),
        ]);
        assert_eq!(Settings::resolve(None, None, "svc", &off), Ok(None));
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
        let settings = Settings::resolve(None, None, "svc", &e)
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
        assert!(Settings::resolve(None, None, "svc", &bad).is_err());
        assert!(Settings::resolve(None, Some(1.5), "svc", &e).is_err());
    }
}
