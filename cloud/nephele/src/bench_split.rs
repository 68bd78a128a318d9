//! `nephele bench split`: split vs local vs full offload, measured end to end over real
//! QUIC with mutual TLS through a shaped link, next to what the split planner predicted
//! for every cut.
//!
//! | part    | what runs                                                                      |
//! |---------|--------------------------------------------------------------------------------|
//! | link    | [`ShapedLink`]: a user-space bottleneck on loopback, `--rtt-ms` round trip and each of `--mbits` both ways, a buffer of one bandwidth-delay product (≥ 64 KiB) |
//! | pool    | a QUIC server in this process with the cluster's server configuration (mutual TLS); it answers nephele's `InferRequest` frames, running the whole model (`Whole`) or a cut's tail (`Tail`) with tract, 1 thread |
//! | device  | this machine's core made `--device-slowdown`× slower: each head (or local) run is followed by a sleep of (slowdown − 1)× its own time; a small device against a pool is Neurosurgeon's setting |
//! | planner | [`plan_split`] on the measured segment times (device = slowdown × this machine, pool = this machine), the cut tensors' sizes, the answer's size and the shaped link's RTT and rate |
//!
//! A request is timed from the device starting its part to the answer being decoded;
//! every split answer is compared with the whole model's. A cut the planner expects to
//! take longer than `--max-seconds` is not measured (its prediction is still reported);
//! one over the wire protocol's frame limit cannot be sent at all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use nephele_infer_policy::split::{plan_split, AllowedCuts, LayerProfile, Link, SplitModel};
use nephele_net::link::{LinkShape, ShapedLink};
use nephele_net::{read_frame, write_frame, ClusterCa, SERVER_NAME};
use nephele_proto::{
    ErrorCode, ErrorFrame, InferRequest, InferResponse, InferStage, Payload, RequestBody,
    StreamRequest, StreamResponse, Tensor, MAX_FRAME_BYTES, MAX_TENSOR_BYTES, PROTOCOL_VERSION,
};
use nephele_runtime::bench::measure;
use nephele_runtime::onnx_edit::OnnxGraph;
use nephele_runtime::Model;
use serde::Serialize;

use crate::bench_inference::{machine, models, opt, progress, BenchModel};

#[derive(Debug, Clone, clap::Args)]
pub struct SplitArgs {
    /// Where `shared/models/registry/prepare.sh` put the models (the embedded demo model
    /// always runs).
    #[arg(long, default_value = "target/models")]
    pub models: PathBuf,
    /// Round trip the shaped link adds, ms.
    #[arg(long, default_value_t = 10.0)]
    pub rtt_ms: f64,
    /// Link rates to measure at, Mbit/s each way.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub mbits: Vec<f64>,
    /// How much slower than this machine's core the emulated device is.
    #[arg(long, default_value_t = 10.0)]
    pub device_slowdown: f64,
    /// Timed requests per cut (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Cuts the planner expects to take longer than this (seconds) are not measured.
    #[arg(long, default_value_t = 3.0)]
    pub max_seconds: f64,
    /// Where the JSON and CSV results are written.
    #[arg(long, default_value = "target/bench-results")]
    pub out: PathBuf,
    #[arg(long)]
    pub json: bool,
}

/// One cut of one model at one link rate.
#[derive(Debug, Clone, Serialize)]
pub struct CutRow {
    pub model: String,
    pub mbits: f64,
    /// `local`, `offload` (the whole input sent) or the cut tensor.
    pub cut: String,
    /// Bytes sent up (0 for local) and the answer's bytes.
    pub sent_bytes: u64,
    pub answer_bytes: u64,
    /// The planner's expectation (`None`: not feasible, see `note`).
    pub predicted_ms: Option<f64>,
    /// Median, fastest and slowest of the timed requests (`None`: not measured).
    pub measured_ms: Option<f64>,
    pub measured_min_ms: Option<f64>,
    pub measured_max_ms: Option<f64>,
    /// Largest difference between this cut's answers and the whole model's.
    pub max_abs_diff: Option<f32>,
    pub note: Option<String>,
}

/// What the planner chose against what measured best, per model and link rate.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    pub model: String,
    pub mbits: f64,
    pub local_ms: f64,
    pub full_offload_ms: Option<f64>,
    pub chosen: String,
    pub chosen_predicted_ms: f64,
    pub chosen_measured_ms: Option<f64>,
    pub best_measured: String,
    pub best_measured_ms: f64,
    /// Measured latency of the planner's cut over the best measured one (1 = it chose
    /// the best).
    pub regret: Option<f64>,
    /// Datagrams the link's buffer dropped while this model was measured at this rate.
    pub link_drops: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SplitReport {
    pub machine: String,
    pub seconds: f64,
    pub scenario: serde_json::Value,
    /// Median over measured remote cuts of |measured − predicted| / measured.
    pub planner_median_error: Option<f64>,
    /// The largest difference between any split answer and the whole model's.
    pub split_max_abs_diff: Option<f32>,
    pub summary: Vec<SummaryRow>,
    pub cuts: Vec<CutRow>,
    pub skipped: Vec<String>,
}

/// The models and their cuts, prepared once.
struct Prepared {
    name: String,
    row_shape: Vec<usize>,
    rows: Vec<Vec<f32>>,
    full: Model,
    /// (cut tensor, head, activation bytes) in graph order.
    heads: Vec<(String, Model, u64)>,
    split_model: SplitModel,
    /// The whole model's answer to each row, for the agreement check.
    reference: Vec<Vec<f32>>,
}

fn prepare(
    model: &BenchModel,
    slowdown: f64,
    json: bool,
) -> Result<(Prepared, Vec<(String, Model)>)> {
    progress(json, &format!("{}: cuts and their times", model.name));
    let load = |name: &str, bytes: &[u8]| {
        Model::load_onnx_with_shape(name, bytes, Some(&model.row_shape)).map_err(|e| anyhow!("{e}"))
    };
    let time = |m: &Model| -> Result<f64> {
        let stat = measure(
            m,
            &model.validation.rows,
            1,
            3,
            Duration::from_millis(300),
            20,
        )
        .map_err(|e| anyhow!("{e}"))?;
        Ok(stat.p50_ms * 1000.0)
    };
    let graph = OnnxGraph::parse(model.name, &model.bytes).map_err(|e| anyhow!("{e}"))?;
    let all = graph.candidate_cuts();
    // At most 8 cuts, evenly spaced through the graph.
    let step = all.len().div_ceil(8).max(1);
    let full = load(model.name, &model.bytes)?;
    let full_us = time(&full)?;
    let mut heads = Vec::new();
    let mut tails = vec![("full".to_string(), full.clone())];
    let mut layers = Vec::new();
    let mut before = 0.0f64;
    for cut in all.iter().step_by(step) {
        let head_only = graph.head(cut).map_err(|e| anyhow!("{e}"))?;
        let head = load(&format!("{}/head@{cut}", model.name), &head_only)?;
        let shape = head.output().shape.clone();
        let (_, tail_bytes) = graph.split(cut, &shape).map_err(|e| anyhow!("{e}"))?;
        // The tail's plan is fixed to the cut's shape, as a pool replica loads it.
        let cut_row: Vec<usize> = shape.iter().skip(1).map(|&d| d.max(1) as usize).collect();
        let tail = Model::load_onnx_with_shape(
            &format!("{}/tail@{cut}", model.name),
            &tail_bytes,
            Some(&cut_row),
        )
        .map_err(|e| anyhow!("{e}"))?;
        let bytes = shape.iter().skip(1).product::<i64>().max(0) as u64 * 4;
        let cumulative = time(&head)?.min(full_us);
        let segment = (cumulative - before).max(0.0);
        before = before.max(cumulative);
        layers.push(LayerProfile {
            name: cut.clone(),
            edge_us: segment * slowdown,
            cloud_us: segment,
            output_bytes: bytes,
        });
        heads.push((cut.clone(), head, bytes));
        tails.push((cut.clone(), tail));
    }
    let last = (full_us - before).max(0.0);
    let answer_bytes = full.output().shape.iter().skip(1).product::<i64>().max(0) as u64 * 4;
    layers.push(LayerProfile {
        name: "output".into(),
        edge_us: last * slowdown,
        cloud_us: last,
        output_bytes: answer_bytes,
    });
    let rows: Vec<Vec<f32>> = model.validation.rows.iter().take(8).cloned().collect();
    let mut reference = Vec::with_capacity(rows.len());
    for row in &rows {
        reference.push(infer_row(&full, &model.row_shape, row)?.1);
    }
    let prepared = Prepared {
        name: model.name.to_string(),
        row_shape: model.row_shape.clone(),
        rows,
        full,
        heads,
        split_model: SplitModel {
            layers,
            input_bytes: model.row_shape.iter().product::<usize>() as u64 * 4,
            allowed_cuts: AllowedCuts::All,
            max_transfer_bytes: Some(MAX_TENSOR_BYTES as u64),
        },
        reference,
    };
    Ok((prepared, tails))
}

/// One batch-1 inference of `row` (shape `row_shape` without the batch axis).
fn infer_row(model: &Model, row_shape: &[usize], row: &[f32]) -> Result<(Vec<usize>, Vec<f32>)> {
    let mut shape = vec![1];
    shape.extend_from_slice(row_shape);
    model.infer(&shape, row).map_err(|e| anyhow!("{e}"))
}

/// Runs `model` as the emulated device would: its own time, then (slowdown − 1)× that
/// asleep (the core stays free for the pool).
async fn on_device(
    model: Model,
    shape: Vec<usize>,
    row: Vec<f32>,
    slowdown: f64,
) -> Result<(Vec<usize>, Vec<f32>)> {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let out = model.infer(&shape, &row).map_err(|e| anyhow!("{e}"))?;
        std::thread::sleep(started.elapsed().mul_f64((slowdown - 1.0).max(0.0)));
        Ok(out)
    })
    .await?
}

/// The pool's side: nephele's inference frames, answered with `tails` ("full" for a
/// whole request, the cut tensor for a tail).
async fn serve(endpoint: quinn::Endpoint, tails: Arc<HashMap<String, Model>>) {
    while let Some(incoming) = endpoint.accept().await {
        let tails = tails.clone();
        tokio::spawn(async move {
            let Ok(connection) = incoming.await else {
                return;
            };
            while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                let tails = tails.clone();
                tokio::spawn(async move {
                    let response = answer(&tails, &mut recv).await;
                    let _ = write_frame(&mut send, &response).await;
                    let _ = send.finish();
                });
            }
        });
    }
}

async fn answer(tails: &HashMap<String, Model>, recv: &mut quinn::RecvStream) -> StreamResponse {
    let refuse = |code, message: String| StreamResponse::Error(ErrorFrame::new(code, message));
    let request = match read_frame::<StreamRequest>(recv, MAX_FRAME_BYTES).await {
        Ok(Some(StreamRequest {
            body: RequestBody::Infer(request),
            ..
        })) => request,
        Ok(_) => {
            return refuse(
                ErrorCode::BadRequest,
                "expected one inference request".into(),
            )
        }
        Err(error) => return refuse(ErrorCode::BadRequest, error.to_string()),
    };
    let key = match &request.stage {
        InferStage::Whole => "full".to_string(),
        InferStage::Tail { variant } => variant.clone(),
    };
    let Some(model) = tails.get(&key).cloned() else {
        return refuse(ErrorCode::NotFound, format!("no model part {key:?} here"));
    };
    let input = match request.input {
        Payload::Tensor(tensor) => tensor,
        Payload::Typed(_) => {
            return refuse(
                ErrorCode::BadRequest,
                "this benchmark's pool takes one f32 tensor".into(),
            )
        }
    };
    if let Err(cause) = input.validate() {
        return refuse(ErrorCode::BadRequest, cause);
    }
    let shape: Vec<usize> = input.shape.iter().map(|&d| d as usize).collect();
    let started = Instant::now();
    let data = input.data;
    match tokio::task::spawn_blocking(move || model.infer(&shape, &data)).await {
        Ok(Ok((shape, data))) => StreamResponse::Inferred(InferResponse {
            request_id: request.request_id,
            output: Payload::Tensor(Tensor {
                shape: shape.iter().map(|&d| d as u32).collect(),
                data,
            }),
            computed_by: "pool".into(),
            compute_us: started.elapsed().as_micros() as u64,
        }),
        Ok(Err(error)) => refuse(ErrorCode::BadRequest, error.to_string()),
        Err(error) => refuse(ErrorCode::Internal, error.to_string()),
    }
}

/// One request over the link: the device's part, then the frame, then the answer.
async fn remote(
    connection: &quinn::Connection,
    model: &str,
    stage: InferStage,
    input: (Vec<usize>, Vec<f32>),
    request_id: u64,
) -> Result<Vec<f32>> {
    let (mut send, mut recv) = connection.open_bi().await?;
    let request = StreamRequest {
        protocol_version: PROTOCOL_VERSION,
        body: RequestBody::Infer(InferRequest {
            deployment: model.to_string(),
            request_id,
            input: Payload::Tensor(Tensor {
                shape: input.0.iter().map(|&d| d as u32).collect(),
                data: input.1,
            }),
            stage,
            trace: None,
        }),
    };
    write_frame(&mut send, &request).await?;
    let _ = send.finish();
    match read_frame::<StreamResponse>(&mut recv, MAX_FRAME_BYTES).await? {
        Some(StreamResponse::Inferred(InferResponse {
            output: Payload::Tensor(output),
            ..
        })) => Ok(output.data),
        Some(StreamResponse::Error(error)) => Err(anyhow!("pool refused: {}", error.message)),
        other => Err(anyhow!("unexpected answer {other:?}")),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

struct Certificates {
    server: quinn::ServerConfig,
    client: quinn::ClientConfig,
}

fn certificates() -> Result<Certificates> {
    let ca = ClusterCa::generate("bench-split").map_err(|e| anyhow!("{e}"))?;
    let (cert, key) = ca.issue_server(&[]).map_err(|e| anyhow!("{e}"))?;
    let server =
        nephele_net::server_config(ca.cert_der(), &cert, &key).map_err(|e| anyhow!("{e}"))?;
    let (device_key_pem, csr) =
        nephele_net::pki::agent_csr("bench-device").map_err(|e| anyhow!("{e}"))?;
    let device_cert = ca
        .sign_agent_csr(&csr, "bench-device", "edge")
        .map_err(|e| anyhow!("{e}"))?;
    let device_key = nephele_net::pki::pem_to_der(&device_key_pem).map_err(|e| anyhow!("{e}"))?;
    let client = nephele_net::mtls_client_config(ca.cert_der(), &device_cert, &device_key)
        .map_err(|e| anyhow!("{e}"))?;
    Ok(Certificates { server, client })
}

pub fn run(args: SplitArgs) -> Result<()> {
    if !(args.device_slowdown >= 1.0 && args.device_slowdown.is_finite()) {
        anyhow::bail!("--device-slowdown must be a number of at least 1");
    }
    if args.mbits.iter().any(|m| !(*m > 0.0 && m.is_finite())) || args.mbits.is_empty() {
        anyhow::bail!("--mbits must list positive rates, e.g. 1,10,100");
    }
    if args.repeats == 0 || !(args.rtt_ms >= 0.0 && args.rtt_ms.is_finite()) {
        anyhow::bail!("--repeats must be at least 1 and --rtt-ms a number ≥ 0");
    }
    let started = Instant::now();
    let mut skipped = Vec::new();
    let bench_models = models(&args.models, &args.out, &mut skipped)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let certificates = certificates()?;
    let rtt = Duration::from_secs_f64(args.rtt_ms / 1000.0);
    let mut cuts = Vec::new();
    let mut summary = Vec::new();
    for bench_model in bench_models.iter().filter(|m| m.name != "minilm-l6-seq128") {
        let (model, tails) = prepare(bench_model, args.device_slowdown, args.json)?;
        let tails: Arc<HashMap<String, Model>> = Arc::new(tails.into_iter().collect());
        let rows = runtime.block_on(measure_model(&args, &model, tails, &certificates, rtt))?;
        summary.extend(rows.0);
        cuts.extend(rows.1);
    }
    let mut errors: Vec<f64> = cuts
        .iter()
        .filter(|c| c.cut != "local")
        .filter_map(|c| Some(((c.measured_ms? - c.predicted_ms?) / c.measured_ms?).abs()))
        .collect();
    let report = SplitReport {
        machine: machine(),
        seconds: started.elapsed().as_secs_f64(),
        scenario: serde_json::json!({
            "link": "real QUIC (quinn, mutual TLS) through a user-space shaped link on loopback: FIFO bottleneck at the rate each way, half the RTT each way, drop-tail buffer of one bandwidth-delay product (at least 64 KiB)",
            "rtt_ms": args.rtt_ms,
            "device": format!("this machine's core made {}x slower (each device run followed by a sleep of {} times its own time)", args.device_slowdown, args.device_slowdown - 1.0),
            "pool": "this machine: tract, 1 thread, in the same process, answering nephele's inference frames",
            "repeats": args.repeats,
            "max_seconds": args.max_seconds,
            "frame_limit_bytes": MAX_TENSOR_BYTES,
        }),
        planner_median_error: (!errors.is_empty()).then(|| median(&mut errors)),
        split_max_abs_diff: cuts.iter().filter_map(|c| c.max_abs_diff).reduce(f32::max),
        summary,
        cuts,
        skipped,
    };
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(
        args.out.join("split.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    write_csv(&args.out, &report)?;
    let plots = write_plots(&args.out, &report)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_tables(&report);
        println!(
            "\nresults: {} and split-cuts.csv{}",
            args.out.join("split.json").display(),
            plots.iter().map(|p| format!(", {p}")).collect::<String>()
        );
    }
    Ok(())
}

/// Every cut of one model at every link rate: (summary rows, cut rows).
async fn measure_model(
    args: &SplitArgs,
    model: &Prepared,
    tails: Arc<HashMap<String, Model>>,
    certificates: &Certificates,
    rtt: Duration,
) -> Result<(Vec<SummaryRow>, Vec<CutRow>)> {
    let slowdown = args.device_slowdown;
    let mut input_shape = vec![1];
    input_shape.extend_from_slice(&model.row_shape);
    // Local: the whole model on the device, no link.
    let mut local = Vec::with_capacity(args.repeats);
    for i in 0..=args.repeats {
        let row = model.rows[i % model.rows.len()].clone();
        let begun = Instant::now();
        on_device(model.full.clone(), input_shape.clone(), row, slowdown).await?;
        if i > 0 {
            local.push(begun.elapsed().as_secs_f64() * 1e3);
        }
    }
    let (local_min, local_max) = (
        local.iter().copied().fold(f64::INFINITY, f64::min),
        local.iter().copied().fold(0.0, f64::max),
    );
    let local_ms = median(&mut local);

    let server = quinn::Endpoint::server(
        certificates.server.clone(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )?;
    let server_addr = server.local_addr()?;
    let serving = tokio::spawn(serve(server, tails));
    let n_layers = model.split_model.layers.len();
    let answer_bytes = model
        .split_model
        .layers
        .last()
        .map_or(0, |l| l.output_bytes);
    let mut cut_rows = Vec::new();
    let mut summary = Vec::new();
    let mut request_id = 0u64;
    for &mbits in &args.mbits {
        let plan = plan_split(
            &model.split_model,
            Link {
                bandwidth_bps: mbits * 1e6,
                rtt_us: rtt.as_secs_f64() * 1e6,
            },
            0.0,
        )
        .map_err(|e| anyhow!("{}: {e}", model.name))?;
        progress(
            args.json,
            &format!("{}: {mbits} Mbit/s, RTT {} ms", model.name, args.rtt_ms),
        );
        let link = ShapedLink::start(server_addr, LinkShape::new(rtt, mbits * 1e6)).await?;
        let mut endpoint = nephele_net::client_endpoint(link.local_addr())?;
        endpoint.set_default_client_config(certificates.client.clone());
        let connection = endpoint
            .connect(link.local_addr(), SERVER_NAME)?
            .await
            .context("QUIC handshake through the shaped link")?;
        let mut measured: Vec<(usize, f64)> = vec![(n_layers, local_ms)];
        let mut rows_here = Vec::new();
        for cut in 0..n_layers {
            let (name, sent) = match cut {
                0 => ("offload".to_string(), model.split_model.input_bytes),
                k => (model.heads[k - 1].0.clone(), model.heads[k - 1].2),
            };
            let predicted = plan.per_cut[cut];
            let mut row = CutRow {
                model: model.name.clone(),
                mbits,
                cut: name.clone(),
                sent_bytes: sent,
                answer_bytes,
                predicted_ms: predicted.is_finite().then_some(predicted / 1e3),
                measured_ms: None,
                measured_min_ms: None,
                measured_max_ms: None,
                max_abs_diff: None,
                note: None,
            };
            if sent.max(answer_bytes) > MAX_TENSOR_BYTES as u64 {
                row.note = Some(format!(
                    "{} bytes is over the {MAX_TENSOR_BYTES} one frame carries",
                    sent.max(answer_bytes)
                ));
            } else if predicted / 1e6 > args.max_seconds {
                row.note = Some(format!(
                    "expected {:.1} s, over --max-seconds {}",
                    predicted / 1e6,
                    args.max_seconds
                ));
            } else {
                let limit = Duration::from_secs_f64(args.max_seconds * 4.0 + 5.0);
                let mut times = Vec::with_capacity(args.repeats);
                let mut diff = 0.0f32;
                for i in 0..=args.repeats {
                    let which = i % model.rows.len();
                    let row_data = model.rows[which].clone();
                    request_id += 1;
                    let begun = Instant::now();
                    let attempt = async {
                        let (stage, input) = if cut == 0 {
                            (InferStage::Whole, (input_shape.clone(), row_data))
                        } else {
                            let head = model.heads[cut - 1].1.clone();
                            let activation =
                                on_device(head, input_shape.clone(), row_data, slowdown).await?;
                            (
                                InferStage::Tail {
                                    variant: name.clone(),
                                },
                                activation,
                            )
                        };
                        remote(&connection, &model.name, stage, input, request_id).await
                    };
                    let output = tokio::time::timeout(limit, attempt).await.map_err(|_| {
                        anyhow!("{} at {name}: no answer in {limit:?}", model.name)
                    })??;
                    if i > 0 {
                        times.push(begun.elapsed().as_secs_f64() * 1e3);
                    }
                    diff = diff.max(max_diff(&output, &model.reference[which]));
                }
                row.measured_min_ms = Some(times.iter().copied().fold(f64::INFINITY, f64::min));
                row.measured_max_ms = Some(times.iter().copied().fold(0.0, f64::max));
                let value = median(&mut times);
                row.measured_ms = Some(value);
                row.max_abs_diff = Some(diff);
                measured.push((cut, value));
            }
            rows_here.push(row);
        }
        rows_here.push(CutRow {
            model: model.name.clone(),
            mbits,
            cut: "local".into(),
            sent_bytes: 0,
            answer_bytes: 0,
            predicted_ms: Some(plan.per_cut[n_layers] / 1e3),
            measured_ms: Some(local_ms),
            measured_min_ms: Some(local_min),
            measured_max_ms: Some(local_max),
            max_abs_diff: None,
            note: None,
        });
        let name_of = |cut: usize| match cut {
            0 => "offload".to_string(),
            k if k == n_layers => "local".to_string(),
            k => model.heads[k - 1].0.clone(),
        };
        let &(best_cut, best_ms) = measured
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("local is always measured");
        let chosen_measured = measured
            .iter()
            .find(|(cut, _)| *cut == plan.cut)
            .map(|&(_, ms)| ms);
        summary.push(SummaryRow {
            model: model.name.clone(),
            mbits,
            local_ms,
            full_offload_ms: measured
                .iter()
                .find(|(cut, _)| *cut == 0)
                .map(|&(_, ms)| ms),
            chosen: name_of(plan.cut),
            chosen_predicted_ms: plan.expected_us / 1e3,
            chosen_measured_ms: chosen_measured,
            best_measured: name_of(best_cut),
            best_measured_ms: best_ms,
            regret: chosen_measured.map(|ms| ms / best_ms.max(1e-9)),
            link_drops: link.stats().dropped,
        });
        cut_rows.extend(rows_here);
        connection.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
    }
    serving.abort();
    Ok((summary, cut_rows))
}

/// One SVG per model with at least two link rates: end-to-end latency against the
/// link rate (both on log scales) for local, the whole offload, and the planner's cut as
/// predicted (dashed) and as measured. Returns the file names written.
fn write_plots(out: &std::path::Path, report: &SplitReport) -> Result<Vec<String>> {
    use nephele_sim::plot::{svg_xy, XyLine};
    let mut written = Vec::new();
    let mut models: Vec<&str> = report.summary.iter().map(|s| s.model.as_str()).collect();
    models.dedup();
    for model in models {
        let rows: Vec<&SummaryRow> = report.summary.iter().filter(|s| s.model == model).collect();
        if rows.len() < 2 {
            continue;
        }
        let series = |pick: &dyn Fn(&SummaryRow) -> Option<f64>| -> Vec<(f64, f64)> {
            rows.iter()
                .filter_map(|r| Some((r.mbits.log10(), pick(r)?.max(1e-3).log10())))
                .collect()
        };
        let lines = [
            ("local", series(&|r| Some(r.local_ms)), 0, false),
            ("whole offload", series(&|r| r.full_offload_ms), 1, false),
            (
                "planner, measured",
                series(&|r| r.chosen_measured_ms),
                2,
                false,
            ),
            (
                "planner, predicted",
                series(&|r| Some(r.chosen_predicted_ms)),
                2,
                true,
            ),
            (
                "best cut measured",
                series(&|r| Some(r.best_measured_ms)),
                3,
                true,
            ),
        ]
        .into_iter()
        .filter(|(_, points, _, _)| !points.is_empty())
        .map(|(name, points, colour, dashed)| XyLine {
            name: name.into(),
            points,
            colour,
            dashed,
        })
        .collect::<Vec<_>>();
        let svg = svg_xy(
            &format!(
                "{model}: end-to-end latency over a shaped link ({})",
                report.scenario["device"]
                    .as_str()
                    .unwrap_or_default()
                    .split(" (")
                    .next()
                    .unwrap_or_default()
            ),
            "log10 link rate (Mbit/s)",
            "log10 latency (ms)",
            &lines,
        );
        let name = format!("split-{model}.svg");
        std::fs::write(out.join(&name), svg)?;
        written.push(name);
    }
    Ok(written)
}

fn write_csv(out: &std::path::Path, report: &SplitReport) -> Result<()> {
    let mut text = String::from(
        "model,mbits,cut,sent_bytes,answer_bytes,predicted_ms,measured_ms,measured_min_ms,measured_max_ms,max_abs_diff,note\n",
    );
    for c in &report.cuts {
        text.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            c.model,
            c.mbits,
            c.cut,
            c.sent_bytes,
            c.answer_bytes,
            opt(c.predicted_ms, 3),
            opt(c.measured_ms, 3),
            opt(c.measured_min_ms, 3),
            opt(c.measured_max_ms, 3),
            c.max_abs_diff.map_or("-".into(), |d| format!("{d:e}")),
            c.note.as_deref().unwrap_or("").replace(',', ";")
        ));
    }
    std::fs::write(out.join("split-cuts.csv"), text)?;
    Ok(())
}

fn print_tables(report: &SplitReport) {
    println!(
        "Split vs local vs full offload, measured: {}",
        report.machine
    );
    println!(
        "  {:<14} {:>8} {:>10} {:>13} {:>26} {:>26} {:>7}",
        "model",
        "Mbit/s",
        "local ms",
        "offload ms",
        "planner: cut (pred/meas)",
        "best measured",
        "regret"
    );
    for s in &report.summary {
        println!(
            "  {:<14} {:>8} {:>10.2} {:>13} {:>26} {:>26} {:>7}",
            s.model,
            s.mbits,
            s.local_ms,
            opt(s.full_offload_ms, 2),
            format!(
                "{} ({:.1}/{})",
                s.chosen,
                s.chosen_predicted_ms,
                opt(s.chosen_measured_ms, 1)
            ),
            format!("{} ({:.1})", s.best_measured, s.best_measured_ms),
            opt(s.regret, 2)
        );
    }
    println!("\nEvery cut (ms):");
    for c in &report.cuts {
        println!(
            "  {:<14} {:>6} {:<28} sent {:>9} B  predicted {:>9}  measured {:>9}  {}",
            c.model,
            c.mbits,
            c.cut,
            c.sent_bytes,
            opt(c.predicted_ms, 1),
            opt(c.measured_ms, 1),
            c.note.as_deref().unwrap_or("")
        );
    }
    println!(
        "\nplanner median error {}  split answers within {} of the whole model",
        opt(report.planner_median_error, 3),
        report
            .split_max_abs_diff
            .map_or("-".into(), |d| format!("{d:e}"))
    );
    for s in &report.skipped {
        println!("  skipped: {s}");
    }
}
