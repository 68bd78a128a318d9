//! `nephele watch`: follows changes to devices, models, deployments, jobs and nodes as
//! the control plane publishes them (`GET /v1/watch`, server-sent events), one line per
//! change (`--json`: one JSON object per line). When the stream drops it reconnects
//! with the last event id, so nothing in between is missed; when the control plane
//! says that is no longer possible (`reset`), it says so.

use std::io::BufRead as _;

use anyhow::Result;
use nephele_api::{WatchEvent, WatchReset};
use serde_json::Value;

use crate::client::{text, when_unix, ApiArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// Kinds to follow, comma-separated: device, model, deployment, job, node.
    #[arg(long)]
    pub kinds: Option<String>,
    /// Resume after this event id (printed with `--json`).
    #[arg(long)]
    pub since: Option<String>,
    /// Stop after this many seconds (default: follow until interrupted).
    #[arg(long)]
    pub timeout: Option<u64>,
}

pub fn run(api_args: ApiArgs, args: WatchArgs) -> Result<()> {
    let api = api_args.client()?;
    let mut path = String::from("/v1/watch");
    let mut params = Vec::new();
    if let Some(kinds) = &args.kinds {
        params.push(format!("kinds={kinds}"));
    }
    if let Some(timeout) = args.timeout {
        params.push(format!("timeout_s={timeout}"));
    }
    if !params.is_empty() {
        path.push('?');
        path.push_str(&params.join("&"));
    }
    let started = std::time::Instant::now();
    let mut last_id = args.since.clone();
    if !api_args.json {
        println!(
            "{:>8}  {:<10} {:<7} {:<24} {:<12} {:<10} WHEN",
            "VERSION", "KIND", "ACTION", "NAME", "TENANT", "REGION"
        );
    }
    loop {
        let response = api.stream(&path, last_id.as_deref())?;
        let reader = std::io::BufReader::new(response.into_body().into_reader());
        let (mut id, mut kind, mut data) = (None::<String>, String::new(), String::new());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if line.is_empty() {
                if kind == "reset" {
                    let reason = serde_json::from_str::<WatchReset>(&data)
                        .map(|r| r.reason)
                        .unwrap_or(data.clone());
                    eprintln!(
                        "nephele: the watch was reset ({reason}); list again to be sure of the state"
                    );
                } else if !data.is_empty() {
                    let event: WatchEvent = crate::client::typed(
                        "GET /v1/watch",
                        serde_json::from_str(&data).unwrap_or(Value::Null),
                    )?;
                    if api_args.json {
                        let mut line = serde_json::to_value(&event)?;
                        line["id"] = id.clone().map(Value::from).unwrap_or(Value::Null);
                        println!("{line}");
                    } else {
                        println!(
                            "{:>8}  {:<10} {:<7} {:<24} {:<12} {:<10} {}",
                            event.version,
                            event.kind,
                            event.action,
                            event.name,
                            text(event.tenant.as_deref()),
                            text(event.region.as_deref()),
                            when_unix(Some(event.unix_ms / 1000))
                        );
                    }
                    if id.is_some() {
                        last_id = id.clone();
                    }
                }
                (kind, data) = (String::new(), String::new());
                continue;
            }
            if let Some(value) = line.strip_prefix("id: ") {
                id = Some(value.to_string());
            } else if let Some(value) = line.strip_prefix("event: ") {
                kind = value.to_string();
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push_str(value);
            }
        }
        let timed_out = args
            .timeout
            .is_some_and(|t| started.elapsed().as_secs() >= t);
        if timed_out {
            return Ok(());
        }
        eprintln!("nephele: the watch stream ended; reconnecting");
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}
