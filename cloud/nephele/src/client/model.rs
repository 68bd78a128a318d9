//! `nephele model`: push, inspect and read models and their variants.

use anyhow::{bail, Context as _, Result};
use nephele_api::*;
use serde_json::Value;

use super::*;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ModelCommand {
    /// Upload an ONNX file, or a BERT sentence encoder for candle (`--bert-sequence`).
    /// The control plane derives its variants (int8 weights, head/tail splits for ONNX)
    /// and checks each against the full model on the validation rows.
    Push {
        name: String,
        /// The ONNX file; with `--bert-sequence`, a directory with `model.safetensors`
        /// and `config.json` (a Hugging Face BERT checkpoint).
        file: std::path::PathBuf,
        /// Push FILE as a BERT encoder run by candle, taking rows of this many token ids.
        #[arg(long, value_name = "TOKENS")]
        bert_sequence: Option<usize>,
        /// JSON with the rows to check variants on: `{"rows" or "features": [[...]],
        /// "labels": [...]}` (labels optional), or for a model with named typed inputs
        /// `{"typed_rows": [{NAME: {"dtype", "shape", "data"}}, ...]}`. Without it,
        /// synthetic rows are used, which measures agreement but not accuracy.
        #[arg(long)]
        validation: Option<std::path::PathBuf>,
        /// Shape, type or fixed value of an input, applied to the file by the control
        /// plane (repeatable): `x=N,3,48,320` (sizes, or names for symbolic dimensions),
        /// `ids=1,S..512:i64` (a name with the largest size a request may give),
        /// `bytes=1,2048:i32`, `sr=scalar:i64=16000` (folded in as a constant).
        #[arg(long = "input", value_name = "NAME=DIMS[:DTYPE][=VALUE]")]
        inputs: Vec<String>,
        /// A recurrent state of the model (repeatable): what OUTPUT returns is fed back
        /// as INPUT on the same session's next request, kept on the device, so a
        /// streaming client sends only its new chunk (`--state state=stateN`).
        #[arg(long = "state", value_name = "INPUT=OUTPUT")]
        state: Vec<String>,
        /// What a variant's outputs must keep of full's to ship (repeatable, per output
        /// with `OUTPUT=`): `cosine:0.99` (the default), `argmax` (the same class at 99%
        /// of positions), `topk:5`, `detections:score=0.5,axis=1,from=4` (the same
        /// candidates above the score, with the same class, on 99% of rows).
        #[arg(long = "accept", value_name = "[OUTPUT=]RULE")]
        accept: Vec<String>,
        /// Return once uploaded, while the variants are still being built (see `model get`).
        #[arg(long)]
        no_wait: bool,
    },
    /// One model: its state (`building`, `ready`, `failed`), build progress and variants.
    Get {
        name: String,
    },
    List,
    /// Delete a version (`NAME:VERSION`) or every version of a model (`NAME`); refused
    /// while a deployment runs one.
    Delete {
        reference: String,
    },
    /// Inspect an ONNX file locally, before any push: inputs, outputs, types, symbolic
    /// dimensions, opsets, operators, whether this version of nephele loads it, and the
    /// `--input` flags that would make it load.
    Inspect {
        file: std::path::PathBuf,
        /// As for `push`: check the file as it would load with these applied.
        #[arg(long = "input", value_name = "NAME=DIMS[:DTYPE][=VALUE]")]
        inputs: Vec<String>,
    },
}

pub fn upload_body(model: &[u8], validation: &std::path::Path) -> Result<Value> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(validation)
        .with_context(|| format!("cannot read {}", validation.display()))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", validation.display()))?;
    // A model with named typed inputs takes requests as rows.
    if let Some(typed) = value.get("typed_rows") {
        return Ok(serde_json::json!({
            "onnx_base64": base64::engine::general_purpose::STANDARD.encode(model),
            "validation": {"typed_rows": typed},
        }));
    }
    let rows = value
        .get("rows")
        .or_else(|| value.get("features"))
        .cloned()
        .with_context(|| {
            format!(
                "{} has no \"rows\" (or \"features\") array of input rows, nor \"typed_rows\" (requests of named typed tensors)",
                validation.display()
            )
        })?;
    Ok(serde_json::json!({
        "onnx_base64": base64::engine::general_purpose::STANDARD.encode(model),
        "validation": {"rows": rows, "labels": value.get("labels").cloned()},
    }))
}

/// The upload of a BERT encoder for candle: the checkpoint directory's
/// `model.safetensors` and `config.json`, the sequence length, and optional validation
/// rows of token ids.
fn bert_upload_body(
    dir: &std::path::Path,
    sequence: usize,
    validation: Option<&std::path::Path>,
) -> Result<Value> {
    use base64::Engine as _;
    let weights_path = dir.join("model.safetensors");
    let weights = std::fs::read(&weights_path).with_context(|| {
        format!(
            "cannot read {} (--bert-sequence takes a checkpoint directory)",
            weights_path.display()
        )
    })?;
    let config_path = dir.join("config.json");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {}", config_path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", config_path.display()))?;
    let mut body = serde_json::json!({
        "bert": {
            "safetensors_base64": base64::engine::general_purpose::STANDARD.encode(&weights),
            "config": config,
            "sequence": sequence,
        }
    });
    if let Some(validation) = validation {
        body["validation"] = upload_body(&[], validation)?["validation"].clone();
    }
    Ok(body)
}

/// The variant table of a model view.
fn print_variants(model: &ModelView) {
    println!(
        "  {:<22} {:<13} {:>9} {:>10} {:>9} {:>10}  STATUS",
        "VARIANT", "PRECISION", "BYTES", "MFLOPS", "ACCURACY", "MIN-COS"
    );
    for v in &model.variants {
        let number = |value: Option<f64>, scale: f64, digits: usize| {
            value.map_or("-".to_string(), |x| format!("{:.*}", digits, x * scale))
        };
        let status = match &v.rejected {
            Some(why) => format!("not shipped: {why}"),
            None => "shipped".into(),
        };
        println!(
            "  {:<22} {:<13} {:>9} {:>10} {:>9} {:>10}  {status}",
            v.name,
            v.precision,
            v.size,
            number(Some(v.flops as f64), 1e-6, 3),
            number(v.accuracy_pct, 1.0, 2),
            number(v.min_cosine, 1.0, 5),
        );
        if let Some(judged) = v.accepted_on.as_deref().filter(|_| v.rejected.is_none()) {
            println!("  {:<22} judged on: {judged}", "");
        }
    }
}

/// Percent-encodes a query parameter value.
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls a model until it is no longer `building`, drawing its build progress on
/// stderr (a bar on a terminal, a line per step otherwise).
fn wait_for_model(api: &Api, name: &str, json: bool) -> Result<ModelView> {
    use std::io::{IsTerminal as _, Write as _};
    let terminal = std::io::stderr().is_terminal() && !json;
    let started = std::time::Instant::now();
    let mut last_step = String::new();
    loop {
        let model: ModelView = api.get_as(&format!("/v1/models/{name}"))?;
        if model.state != ModelState::Building {
            if terminal {
                eprintln!();
            }
            if model.state == ModelState::Failed {
                bail!(
                    "model {name}: the build failed after {:.1} s: {}",
                    started.elapsed().as_secs_f64(),
                    model.error.as_deref().unwrap_or("no reason given")
                );
            }
            return Ok(model);
        }
        let (done, total, step) = match &model.progress {
            Some(p) => (p.done, p.total, p.step.clone()),
            None => (0, 0, "loading the model".to_string()),
        };
        if terminal {
            let width = 30usize;
            let filled = (done * width).checked_div(total).unwrap_or(0);
            eprint!(
                "\r  building [{}{}] {done}/{total} {:>5.1} s  {:<60.60}",
                "#".repeat(filled),
                ".".repeat(width - filled.min(width)),
                started.elapsed().as_secs_f64(),
                step
            );
            let _ = std::io::stderr().flush();
        } else if step != last_step && !json {
            eprintln!(
                "  building {done}/{total} ({:.1} s): {step}",
                started.elapsed().as_secs_f64()
            );
        }
        last_step = step;
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

fn print_model(v: &ModelView) {
    println!(
        "model {} ({}) {}: sha256 {} ({} bytes){}; variants checked on {}",
        v.reference,
        v.format,
        num(Some(v.state)),
        v.sha256,
        v.size,
        if v.input_specs.is_empty() {
            String::new()
        } else {
            format!("; inputs {}", v.input_specs.join(" "))
        },
        v.validation
    );
    if let Some(error) = &v.error {
        println!("  failed: {error}");
    }
    let state: Vec<String> = v
        .recurrent_state
        .iter()
        .map(|b| format!("{}={}", b.input, b.output))
        .collect();
    if !state.is_empty() {
        println!("  state kept per session on devices: {}", state.join(" "));
    }
    print_variants(v);
}

fn print_inspection(v: &Value) {
    println!(
        "{} bytes, producer {}, opsets {}",
        s(v, "file_bytes"),
        s(v, "producer"),
        v["opsets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (title, key) in [("INPUT", "inputs"), ("OUTPUT", "outputs")] {
        println!("  {title:<8} {:<32} {:<8} SHAPE", "NAME", "TYPE");
        for t in v[key].as_array().into_iter().flatten() {
            let dims: Vec<String> = t["dims"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| d.as_str().unwrap_or("?").to_string())
                .collect();
            println!(
                "  {:<8} {:<32} {:<8} [{}]",
                "",
                s(t, "name"),
                s(t, "dtype"),
                dims.join(", ")
            );
        }
    }
    let operators: Vec<String> = v["operators"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| format!("{}×{}", o[0].as_str().unwrap_or("?"), o[1]))
        .collect();
    println!("  {} nodes: {}", s(v, "nodes"), operators.join(" "));
    let features: Vec<String> = v["agent_features"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            format!(
                "`{}` ({})",
                f[0].as_str().unwrap_or("?"),
                f[1].as_str().unwrap_or("?")
            )
        })
        .collect();
    if !features.is_empty() {
        println!(
            "  agents need: {} (not in the agent as it ships, which refuses such a model: build it with --features NAME, or --features full)",
            features.join(", ")
        );
    }
    let ifs = v["ifs_in_file"].as_u64().unwrap_or(0);
    if ifs > 0 {
        let left = v["ifs_left"].as_u64().unwrap_or(ifs);
        println!(
            "  control flow: {ifs} If node(s); {} decided by the given shapes and constants and folded, {left} left",
            ifs.saturating_sub(left)
        );
    }
    match v["load_error"].as_str() {
        None => println!("  loads in nephele: yes, served {}", s(v, "serving")),
        Some(error) => println!("  loads in nephele: no: {error}"),
    }
    for line in v["advice"].as_array().into_iter().flatten() {
        println!("  to do: {}", line.as_str().unwrap_or(""));
    }
}

pub fn model(args: ApiArgs, command: ModelCommand) -> Result<()> {
    let api = args.client()?;
    match command {
        ModelCommand::Push {
            name,
            file,
            bert_sequence,
            validation,
            inputs,
            state,
            accept,
            no_wait,
        } => {
            // Checked here first, so a typo costs no upload.
            nephele_domain::validate_name("model", &name).map_err(anyhow::Error::msg)?;
            for text in &inputs {
                text.parse::<nephele_runtime::input_spec::InputSpec>()
                    .map_err(anyhow::Error::msg)?;
            }
            for text in &accept {
                text.parse::<nephele_runtime::acceptance::Accept>()
                    .map_err(|e| anyhow::anyhow!("--accept: {e}"))?;
            }
            for text in &state {
                if text.split_once('=').is_none_or(|(i, o)| {
                    i.trim().is_empty() || o.trim().is_empty() || o.contains('=')
                }) {
                    anyhow::bail!(
                        "--state {text}: give INPUT=OUTPUT, the model input that takes the state and the output that returns the next one (e.g. --state state=stateN)"
                    );
                }
            }
            let query: Vec<String> = inputs
                .iter()
                .map(|t| format!("input={}", query_value(t)))
                .chain(state.iter().map(|t| format!("state={}", query_value(t))))
                .chain(accept.iter().map(|t| format!("accept={}", query_value(t))))
                .collect();
            let path = if query.is_empty() {
                format!("/v1/models/{name}")
            } else {
                format!("/v1/models/{name}?{}", query.join("&"))
            };
            let answer = match (bert_sequence, validation) {
                (Some(sequence), validation) => {
                    let body = bert_upload_body(&file, sequence, validation.as_deref())?;
                    api.put_json(&path, &body)?
                }
                (None, Some(validation)) => {
                    let bytes = std::fs::read(&file)
                        .with_context(|| format!("cannot read {}", file.display()))?;
                    let body = upload_body(&bytes, &validation)?;
                    api.put_json(&path, &body)?
                }
                (None, None) => {
                    let upload = crate::upload::Upload::open(&file, &name, args.json)?;
                    api.put_file(&path, upload)?
                }
            };
            let model: ModelView = typed(&format!("PUT {path}"), answer)?;
            let model = if model.state == ModelState::Building && !no_wait {
                if !args.json {
                    eprintln!(
                        "model {name} uploaded ({} bytes); building its variants",
                        model.size
                    );
                }
                // This push's version, not the name's latest: another push of the
                // name may finish first.
                wait_for_model(&api, &model.reference, args.json)?
            } else {
                model
            };
            show(args.json, &model, print_model);
        }
        ModelCommand::Get { name } => {
            let model: ModelView = api.get_as(&format!("/v1/models/{name}"))?;
            show(args.json, &model, print_model);
        }
        ModelCommand::Delete { reference } => {
            let deleted: Vec<ModelView> =
                api.delete_as(&format!("/v1/models/{}", query_value(&reference)))?;
            show(args.json, &deleted, |deleted| {
                for m in deleted {
                    println!("deleted model {} ({})", m.reference, num(Some(m.state)));
                }
            });
        }
        ModelCommand::Inspect { file, inputs } => {
            let specs = inputs
                .iter()
                .map(|t| t.parse().map_err(anyhow::Error::msg))
                .collect::<Result<Vec<nephele_runtime::input_spec::InputSpec>>>()?;
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let name = file
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_else(|| "model".into());
            let report = nephele_runtime::input_spec::inspect(&name, &bytes, &specs)
                .map_err(|e| anyhow::anyhow!("{e}; is {} an ONNX file?", file.display()))?;
            let value = serde_json::to_value(&report)?;
            print(args.json, &value, print_inspection);
        }
        ModelCommand::List => {
            let models: Vec<ModelView> = api.get_as("/v1/models")?;
            show(args.json, &models, |models| {
                println!(
                    "{:<34} {:<17} {:>10} SHA256",
                    "MODEL:VERSION", "FORMAT", "BYTES"
                );
                for m in models {
                    println!(
                        "{:<34} {:<17} {:>10} {}",
                        m.reference, m.format, m.size, m.sha256
                    );
                    print_variants(m);
                }
            });
        }
    }
    Ok(())
}
