//! Request traces for `nephele sim autoscale`: arrivals with each request's work at a
//! replica and its latency target, and the measured cold starts.
//!
//! | trace        | file                                                | replica                                        |
//! |--------------|-----------------------------------------------------|------------------------------------------------|
//! | `azure-code` | `azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv` | [`LlmProfile`]: continuous batching of Llama-2-70B on two H100 (TP 2), step times measured by the Splitwise authors; each request's prompt and output tokens from the trace |
//! | `genai-lora` | `alibaba-genai-lora-v2026/lora_request_trace.csv`   | `exec_time_seconds` as measured in production, one request at a time |
//!
//! Latency targets:
//! - **LLM requests** (the Splitwise paper's P99 SLOs, per request): time to first
//!   token ≤ 6 ×, mean time between tokens ≤ 5 × and end-to-end latency ≤ 5 × the
//!   same request's on an idle replica ([`SlowdownTarget::SPLITWISE_P99`]). Splitwise
//!   states its SLOs as slowdowns over the request alone on a DGX-A100; here the
//!   reference is an idle replica of the serving configuration itself.
//! - **Image requests**: twice its own service time, and at least its service time
//!   plus 10 s (a request may wait as long as it is served).
//!
//! A file given by path is read in whichever of the two formats its header says.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use crate::autoscale_llm::{LlmProfile, SlowdownTarget};

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Request {
    /// Microseconds since the trace's first request.
    pub arrival_us: u64,
    /// Time at a replica slot (images), or end-to-end latency alone on an idle replica
    /// (LLM requests).
    pub service_ms: f64,
    /// Latest answer after arrival that counts as within the target.
    pub target_ms: f64,
    /// Prompt and output tokens (LLM requests; 0 otherwise).
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Latest first token after arrival (LLM requests; infinite otherwise).
    pub ttft_target_ms: f64,
    /// Largest mean time between output tokens (LLM requests; infinite otherwise).
    pub tbt_target_ms: f64,
}

impl Request {
    /// Whether an answer at `latency_ms` with its first token at `ttft_ms` meets all
    /// of this request's targets.
    pub fn within(&self, latency_ms: f64, ttft_ms: Option<f64>) -> bool {
        self.misses(latency_ms, ttft_ms) == (false, false, false)
    }

    /// Which of the targets an answer misses: (first token, between tokens, end to end).
    pub fn misses(&self, latency_ms: f64, ttft_ms: Option<f64>) -> (bool, bool, bool) {
        const SLACK_MS: f64 = 1e-6;
        let ttft = ttft_ms.unwrap_or(latency_ms);
        let tbt = self.output_tokens >= 2
            && self.tbt_target_ms.is_finite()
            && (latency_ms - ttft) / f64::from(self.output_tokens - 1)
                > self.tbt_target_ms + SLACK_MS;
        (
            ttft > self.ttft_target_ms + SLACK_MS,
            tbt,
            latency_ms > self.target_ms + SLACK_MS,
        )
    }

    /// A request with only a service time and an end-to-end target.
    pub fn timed(arrival_us: u64, service_ms: f64, target_ms: f64) -> Request {
        Request {
            arrival_us,
            service_ms,
            target_ms,
            prompt_tokens: 0,
            output_tokens: 0,
            ttft_target_ms: f64::INFINITY,
            tbt_target_ms: f64::INFINITY,
        }
    }
}

/// A GPU type: what an hour costs and what it draws.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuPrice {
    pub gpu: &'static str,
    /// The instance the price is read from.
    pub instance: &'static str,
    pub gpus_per_instance: u32,
    /// On-demand USD per instance-hour.
    pub instance_usd_per_hour: f64,
    /// Board power at full load (W).
    pub tdp_w: f64,
    /// Assumed draw when idle or loading a model (W).
    pub idle_w: f64,
}

impl GpuPrice {
    pub fn usd_per_gpu_hour(&self) -> f64 {
        self.instance_usd_per_hour / f64::from(self.gpus_per_instance.max(1))
    }
}

/// GPU-hour prices: AWS EC2 on-demand list prices, US East (N. Virginia), Linux, as
/// published on aws.amazon.com/ec2/pricing/on-demand/ in 2024 (AWS lowered P5 prices in
/// June 2025; the 2024 figure is kept so the table is one date). TDP from NVIDIA's
/// data sheets (H100 SXM 700 W, A100 SXM 400 W, A10 150 W). Idle draw is an
/// assumption: a quarter of TDP while idle or loading weights.
pub const GPU_PRICES: &[GpuPrice] = &[
    GpuPrice {
        gpu: "H100-SXM-80GB",
        instance: "p5.48xlarge",
        gpus_per_instance: 8,
        instance_usd_per_hour: 98.32,
        tdp_w: 700.0,
        idle_w: 175.0,
    },
    GpuPrice {
        gpu: "A100-SXM-80GB",
        instance: "p4de.24xlarge",
        gpus_per_instance: 8,
        instance_usd_per_hour: 40.96,
        tdp_w: 400.0,
        idle_w: 100.0,
    },
    GpuPrice {
        gpu: "A10G-24GB",
        instance: "g5.xlarge",
        gpus_per_instance: 1,
        instance_usd_per_hour: 1.006,
        tdp_w: 150.0,
        idle_w: 37.5,
    },
];

/// A price row by GPU name.
pub fn gpu_price(gpu: &str) -> Option<GpuPrice> {
    GPU_PRICES.iter().copied().find(|row| row.gpu == gpu)
}

/// A trace ready to replay.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// `azure-code`, `genai-lora` or the file's name.
    pub name: String,
    pub path: PathBuf,
    /// Hours since 1970 (UTC) of the first request, for the electricity price.
    pub start_hour: i64,
    /// Seconds into that hour of the first request.
    pub start_offset_s: f64,
    /// Requests one replica serves at once: a slot count (images), or for an LLM
    /// replica the concurrency it sustains within target, set by
    /// [`crate::autoscale::calibrate_concurrency`] (the containerConcurrency an
    /// operator load-tests for).
    pub concurrency: u32,
    pub gpu: GpuPrice,
    /// GPUs one replica holds (GPU-hours and energy count them all).
    pub gpus_per_replica: u32,
    /// The continuous-batching engine of an LLM replica; None: `concurrency` slots.
    pub llm: Option<LlmProfile>,
    pub service_model: String,
    pub target_rule: String,
    /// The floor of the latency target (ms; images), or for LLM requests the mean
    /// wait before their prefill that their first-token targets allow.
    pub target_floor_ms: f64,
    #[serde(skip)]
    pub requests: Vec<Request>,
}

impl Workload {
    pub fn span_s(&self) -> f64 {
        self.requests
            .last()
            .map_or(0.0, |r| r.arrival_us as f64 / 1e6)
    }
}

fn target_ms(service_ms: f64, floor_ms: f64) -> f64 {
    (2.0 * service_ms).max(service_ms + floor_ms)
}

/// How requests are served and judged.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServiceOptions {
    /// The slowdown bounds of LLM requests.
    pub slowdown: SlowdownTarget,
    /// An LLM replica's token budget per step (`max_num_batched_tokens`).
    pub token_budget: u32,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            slowdown: SlowdownTarget::SPLITWISE_P99,
            token_budget: 2048,
        }
    }
}

/// Which trace format a header line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    AzureLlm,
    GenaiLora,
}

pub fn detect_format(header: &str) -> Option<TraceFormat> {
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    if ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        .iter()
        .all(|c| columns.contains(c))
    {
        Some(TraceFormat::AzureLlm)
    } else if ["gmt_create", "exec_time_seconds"]
        .iter()
        .all(|c| columns.contains(c))
    {
        Some(TraceFormat::GenaiLora)
    } else {
        None
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (pass --data with the folder that holds azure-llm-inference-2023/ and alibaba-genai-lora-v2026/, e.g. ../shared/data, or --trace FILE)",
            path.display()
        )
    })
}

/// Loads `--trace`: `azure-code`, `genai-lora` (under `data`) or a file in either
/// format.
pub fn load_workload(data: &Path, trace: &str, service: &ServiceOptions) -> Result<Workload> {
    let (name, path) = match trace {
        "azure-code" => (
            trace.to_string(),
            data.join("azure-llm-inference-2023")
                .join("AzureLLMInferenceTrace_code.csv"),
        ),
        "genai-lora" => (
            trace.to_string(),
            data.join("alibaba-genai-lora-v2026")
                .join("lora_request_trace.csv"),
        ),
        file => (
            Path::new(file)
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("trace")
                .to_string(),
            PathBuf::from(file),
        ),
    };
    let text = read(&path)?;
    let header = text.lines().next().unwrap_or("");
    match detect_format(header) {
        Some(TraceFormat::AzureLlm) => parse_azure(&name, &path, &text, service),
        Some(TraceFormat::GenaiLora) => parse_genai(&name, &path, &text),
        None => bail!(
            "{}:1: neither the Azure LLM trace header (TIMESTAMP,ContextTokens,GeneratedTokens) nor the GenAI LoRA one (gmt_create,…,exec_time_seconds,…)",
            path.display()
        ),
    }
}

fn columns(header: &str, wanted: &[&str], path: &Path) -> Result<Vec<usize>> {
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    wanted
        .iter()
        .map(|w| {
            names
                .iter()
                .position(|n| n == w)
                .with_context(|| format!("{}:1: no column {w}", path.display()))
        })
        .collect()
}

/// `YYYY-MM-DD HH:MM:SS[.f…]` (UTC) → (hour since 1970, microseconds into the hour).
fn parse_time(text: &str) -> Option<(i64, u64)> {
    const HOUR_US: i64 = 3_600_000_000;
    let micros = crate::trace::parse_utc_micros(text)?;
    Some((
        micros.div_euclid(HOUR_US),
        micros.rem_euclid(HOUR_US) as u64,
    ))
}

/// How a trace's requests are served and judged, for [`assemble`].
struct Served {
    gpu: GpuPrice,
    llm: Option<LlmProfile>,
    service_model: String,
    target_rule: String,
    floor_ms: f64,
}

/// (hour, µs in hour, request with arrival 0) rows → a workload sorted by arrival.
fn assemble(
    name: &str,
    path: &Path,
    mut rows: Vec<(i64, u64, Request)>,
    served: Served,
) -> Result<Workload> {
    rows.sort_by_key(|row| (row.0, row.1));
    let Some(&(start_hour, start_us, _)) = rows.first() else {
        bail!("{}: no requests", path.display());
    };
    let absolute = |hour: i64, us: u64| (hour - start_hour) as f64 * 3.6e9 + us as f64;
    let origin = absolute(start_hour, start_us);
    let requests = rows
        .iter()
        .map(|&(hour, us, request)| Request {
            arrival_us: (absolute(hour, us) - origin).max(0.0) as u64,
            ..request
        })
        .collect();
    Ok(Workload {
        name: name.to_string(),
        path: path.to_path_buf(),
        start_hour,
        start_offset_s: start_us as f64 / 1e6,
        concurrency: 1,
        gpu: served.gpu,
        gpus_per_replica: served.llm.as_ref().map_or(1, |p| p.gpus_per_replica.max(1)),
        llm: served.llm,
        service_model: served.service_model,
        target_rule: served.target_rule,
        target_floor_ms: served.floor_ms,
        requests,
    })
}

fn parse_azure(name: &str, path: &Path, text: &str, service: &ServiceOptions) -> Result<Workload> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or("");
    let at = columns(
        header,
        &["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
        path,
    )?;
    let profile = LlmProfile {
        max_num_batched_tokens: service.token_budget.max(1),
        ..LlmProfile::llama2_70b_h100_tp2()
    };
    let slowdown = service.slowdown;
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        let line_no = number + 2;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        let get = |idx: usize| fields.get(idx).copied().unwrap_or("");
        let (hour, us) = parse_time(get(at[0])).with_context(|| {
            format!(
                "{}:{line_no}: bad TIMESTAMP {:?}",
                path.display(),
                get(at[0])
            )
        })?;
        let tokens = |idx: usize, column: &str| -> Result<u64> {
            get(idx).trim().parse().with_context(|| {
                format!("{}:{line_no}: bad {column} {:?}", path.display(), get(idx))
            })
        };
        let prompt = tokens(at[1], "ContextTokens")?.clamp(1, u64::from(u32::MAX)) as u32;
        let output = tokens(at[2], "GeneratedTokens")?.clamp(1, u64::from(u32::MAX)) as u32;
        let alone = profile.isolated(prompt, output);
        rows.push((
            hour,
            us,
            Request {
                arrival_us: 0,
                service_ms: alone.e2e_ms,
                target_ms: slowdown.e2e * alone.e2e_ms,
                prompt_tokens: prompt,
                output_tokens: output,
                ttft_target_ms: slowdown.ttft * alone.ttft_ms,
                tbt_target_ms: slowdown.tbt * alone.tbt_ms,
            },
        ));
    }
    let gpu = gpu_price(profile.gpu).context("no price row for the service model's GPU")?;
    let description = format!(
        "{} on {} × {} (tensor parallel {}), continuous batching with chunked prefill ({} tokens a step), KV cache {} tokens; step times measured by the Splitwise authors",
        profile.model,
        profile.gpus_per_replica,
        profile.gpu,
        profile.tensor_parallel,
        profile.max_num_batched_tokens,
        profile.kv_capacity_tokens
    );
    let rule = format!(
        "time to first token ≤ {} ×, mean time between tokens ≤ {} ×, end-to-end ≤ {} × the request alone on an idle replica (Splitwise's P99 SLOs)",
        slowdown.ttft, slowdown.tbt, slowdown.e2e
    );
    // The wait a request may have before its own prefill starts, on average: its
    // first-token target less its prefill alone.
    let mean_wait_allowed = if rows.is_empty() {
        0.0
    } else {
        rows.iter()
            .map(|r| r.2.ttft_target_ms * (1.0 - 1.0 / slowdown.ttft.max(1.0)))
            .sum::<f64>()
            / rows.len() as f64
    };
    assemble(
        name,
        path,
        rows,
        Served {
            gpu,
            llm: Some(profile),
            service_model: description,
            target_rule: rule,
            floor_ms: mean_wait_allowed,
        },
    )
}

fn parse_genai(name: &str, path: &Path, text: &str) -> Result<Workload> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or("");
    let at = columns(header, &["gmt_create", "exec_time_seconds"], path)?;
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        let line_no = number + 2;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        let get = |idx: usize| fields.get(idx).copied().unwrap_or("");
        let (hour, us) = parse_time(get(at[0])).with_context(|| {
            format!(
                "{}:{line_no}: bad gmt_create {:?}",
                path.display(),
                get(at[0])
            )
        })?;
        let exec: f64 = get(at[1])
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .with_context(|| {
                format!(
                    "{}:{line_no}: bad exec_time_seconds {:?}",
                    path.display(),
                    get(at[1])
                )
            })?;
        // 1 s resolution: a 0 is under a second; count it as 0.5 s.
        let service_ms = exec.max(0.5) * 1000.0;
        rows.push((
            hour,
            us,
            Request::timed(0, service_ms, target_ms(service_ms, IMAGE_FLOOR_MS)),
        ));
    }
    let gpu = gpu_price("A10G-24GB").context("no price row for A10G")?;
    assemble(
        name,
        path,
        rows,
        Served {
            gpu,
            llm: None,
            service_model: "exec_time_seconds as measured (0 read as 0.5 s), one request at a time per replica (a Stable Diffusion pipeline per GPU); priced as an A10G, an assumption: the trace does not name its GPUs".into(),
            target_rule: format!(
                "latency ≤ max(2 × service, service + {:.0} s)",
                IMAGE_FLOOR_MS / 1000.0
            ),
            floor_ms: IMAGE_FLOOR_MS,
        },
    )
}

/// The floor of an image request's latency target.
const IMAGE_FLOOR_MS: f64 = 10_000.0;

/// Measured base-model load times (ms): `alibaba-genai-lora-v2026/basemodel_update_latency_anon.csv`.
pub fn load_cold_starts(data: &Path) -> Result<Vec<f64>> {
    let path = data
        .join("alibaba-genai-lora-v2026")
        .join("basemodel_update_latency_anon.csv");
    let text = read(&path)?;
    let mut lines = text.lines();
    let header = lines.next().unwrap_or("");
    let at = columns(header, &["value"], &path)?;
    let mut values = Vec::new();
    for (number, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let field = line.split(',').nth(at[0]).unwrap_or("");
        let value: f64 = field
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .with_context(|| format!("{}:{}: bad value {field:?}", path.display(), number + 2))?;
        values.push(value);
    }
    if values.is_empty() {
        bail!("{}: no load times", path.display());
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, text: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("nephele-autoscale-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn files_are_read_in_the_format_their_header_says() {
        let azure = temp(
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.5,1000,10\n2023-11-16 18:17:03.9799600,4808,10\n",
        );
        let service = ServiceOptions::default();
        let workload = load_workload(
            Path::new("/nonexistent"),
            &azure.to_string_lossy(),
            &service,
        )
        .expect("loads");
        assert_eq!(workload.requests.len(), 2);
        assert_eq!(workload.requests[1].arrival_us, 520_040);
        assert_eq!(workload.gpus_per_replica, 2);
        let first = workload.requests[0];
        assert_eq!((first.prompt_tokens, first.output_tokens), (4808, 10));
        let alone = LlmProfile::llama2_70b_h100_tp2().isolated(4808, 10);
        assert!((first.ttft_target_ms - 6.0 * alone.ttft_ms).abs() < 1e-9);
        assert!((first.target_ms - 5.0 * alone.e2e_ms).abs() < 1e-9);
        assert!(first.within(alone.e2e_ms, Some(alone.ttft_ms)));
        assert!(!first.within(alone.e2e_ms, Some(7.0 * alone.ttft_ms)));
        let genai = temp(
            "g.csv",
            "gmt_create,predict_type,predict_status,exec_time_seconds\n2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0\n2024-11-15 16:58:00,TXT_2_IMG,FAILED,0\n",
        );
        let workload = load_workload(
            Path::new("/nonexistent"),
            &genai.to_string_lossy(),
            &service,
        )
        .expect("loads");
        assert_eq!(workload.requests[1].arrival_us, 10_000_000);
        assert_eq!(workload.requests[0].target_ms, 64_000.0);
        assert_eq!(workload.requests[1].target_ms, 10_500.0);
    }

    #[test]
    fn bad_rows_name_the_file_and_line() {
        let bad = temp(
            "bad.csv",
            "gmt_create,exec_time_seconds\n2024-11-15 16:57:50,3\n2024-11-15 16:57:51,x\n",
        );
        let error = format!(
            "{:#}",
            load_workload(
                Path::new("."),
                &bad.to_string_lossy(),
                &ServiceOptions::default()
            )
            .expect_err("bad")
        );
        assert!(
            error.contains("bad.csv:3: bad exec_time_seconds"),
            "{error}"
        );
        let other = temp("other.csv", "a,b\n1,2\n");
        let error = format!(
            "{:#}",
            load_workload(
                Path::new("."),
                &other.to_string_lossy(),
                &ServiceOptions::default()
            )
            .expect_err("bad")
        );
        assert!(error.contains("other.csv:1: neither"), "{error}");
        let missing = format!(
            "{:#}",
            load_workload(
                Path::new("/no/such/dir"),
                "azure-code",
                &ServiceOptions::default()
            )
            .expect_err("missing")
        );
        assert!(
            missing.contains("/no/such/dir/azure-llm-inference-2023") && missing.contains("--data"),
            "{missing}"
        );
    }
}
