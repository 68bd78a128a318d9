//! Pushing a model: the upload is checked and answered at once, and its variants are
//! built on a thread of their own, reporting progress to the federation actor.
//!
//! `PUT /v1/models/{name}` takes either the ONNX file itself as the body, or JSON
//! `{"onnx_base64": "...", "validation": {"rows": [[f32, ...], ...], "labels": [int, ...]},
//! "inputs": ["x=N,3,48,320", ...]}` (validation, labels and inputs optional), or, for a
//! BERT sentence encoder run by candle, `{"bert": {"safetensors_base64": "...",
//! "config": {...config.json...}, "sequence": 128}, "validation": {"rows": [[token ids as
//! f32, ...]]}}`. Query parameters: `input=NAME=DIMS[:DTYPE][=VALUE]` (repeatable; see
//! `nephele_runtime::input_spec`), `accept=[OUTPUT=]RULE` (repeatable: what a variant's
//! outputs are judged on, see `nephele_runtime::acceptance`) and `wait=true` (answer
//! when built).
//!
//! Checked before answering (400 at once): the body's form, the input specs, that the
//! file is an ONNX protobuf with a graph, and that the specs apply to it. Everything
//! slow is the build: loading the model with the agents' runtime, measuring the int8
//! variant and the chosen split cuts on the validation rows (without them, on
//! [`SYNTHETIC_ROWS`] deterministic pseudo-random rows, which checks output agreement
//! but not accuracy: the model view says which), and writing the variant files. The
//! federation actor only sees small messages (begin, progress, the finished manifest
//! data, failure), so agent sessions never wait on a build.

use std::path::PathBuf;

use actix::Addr;
use serde::Deserialize;

use crate::federation::ApiError;
use crate::federation::{
    Begin, BeginModel, FederationActor, ModelFailed, ModelProgress, ModelView, PutModel,
};

/// Rows the variants are checked on when the upload brings none.
pub const SYNTHETIC_ROWS: usize = 64;

/// The longest token sequence a BERT upload may ask for (BERT's own position limit).
const MAX_BERT_SEQUENCE: usize = 512;

/// What a model upload carries.
pub enum Source {
    /// The file, shared with the request body it came in (not copied: an upload of
    /// hundreds of MiB is held once), until the build takes it.
    Onnx(Bytes),
    Bert {
        safetensors: Vec<u8>,
        config: String,
        sequence: usize,
    },
}

/// A request body, shared without copying.
pub type Bytes = actix_web::web::Bytes;

/// A parsed push.
pub struct Push {
    pub source: Source,
    pub validation: Option<ValidationUpload>,
    pub input_specs: Vec<nephele_runtime::input_spec::InputSpec>,
    /// Recurrent state, `--state INPUT=OUTPUT` (checked against the model in the build).
    pub state: Vec<nephele_proto::StateBinding>,
    /// What the variants' outputs are judged on (`--accept`; empty: the default rule).
    pub accept: Vec<nephele_runtime::acceptance::Accept>,
    pub wait: bool,
    /// The tenant it is pushed for: set by the API from the token (an admin may name
    /// one with `tenant=`); pushes kept from before tenants are `default`'s.
    pub tenant: String,
}

/// Parses `INPUT=OUTPUT` (a `--state` flag).
pub fn parse_state(text: &str) -> Result<nephele_proto::StateBinding, String> {
    match text.split_once('=') {
        Some((input, output))
            if !input.trim().is_empty() && !output.trim().is_empty() && !output.contains('=') =>
        {
            Ok(nephele_proto::StateBinding {
                input: input.trim().to_string(),
                output: output.trim().to_string(),
            })
        }
        _ => Err(format!(
            "state {text:?}: give INPUT=OUTPUT, the model input that takes the state and the output that returns the next one (e.g. --state state=stateN)"
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelUpload {
    onnx_base64: Option<String>,
    bert: Option<BertUpload>,
    validation: Option<ValidationUpload>,
    #[serde(default)]
    inputs: Vec<String>,
    #[serde(default)]
    state: Vec<String>,
    #[serde(default)]
    accept: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BertUpload {
    safetensors_base64: String,
    /// The model's `config.json`, as JSON.
    config: serde_json::Value,
    /// Token ids per input row (the model's input is `[batch, sequence]`).
    sequence: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationUpload {
    /// Rows of a one-input model.
    #[serde(default)]
    rows: Vec<Vec<f32>>,
    labels: Option<Vec<usize>>,
    /// Requests of a model with named typed inputs (`{NAME: {dtype, shape, data}}`).
    #[serde(default)]
    typed_rows: Vec<std::collections::HashMap<String, nephele_runtime::graph_model::NamedTensor>>,
}

impl ValidationUpload {
    /// The set to measure variants on and how the model view describes it.
    fn into_set(self) -> (nephele_runtime::variants::ValidationSet, String) {
        let description = match &self.labels {
            Some(_) => format!("{} labelled rows", self.rows.len()),
            None => format!("{} unlabelled rows", self.rows.len()),
        };
        let set = nephele_runtime::variants::ValidationSet {
            rows: self.rows,
            labels: self.labels,
        };
        (set, description)
    }
}

/// The SHA-256 of labelled validation rows (rows and labels, with their lengths), so
/// two versions measured on the same rows can be compared (a rollout's accuracy gate);
/// `None` without labels.
pub fn labelled_rows_sha256(set: &nephele_runtime::variants::ValidationSet) -> Option<String> {
    let labels = set.labels.as_ref()?;
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    hash.update(&(set.rows.len() as u64).to_le_bytes());
    for row in &set.rows {
        hash.update(&(row.len() as u64).to_le_bytes());
        for value in row {
            hash.update(&value.to_le_bytes());
        }
    }
    hash.update(&(labels.len() as u64).to_le_bytes());
    for label in labels {
        hash.update(&(*label as u64).to_le_bytes());
    }
    Some(hex::encode(hash.finish().as_ref()))
}

impl ValidationUpload {}

/// Parses the query and body of a push (no model is loaded here).
pub fn parse_push(
    query: &[(String, String)],
    is_json: bool,
    body: &Bytes,
) -> Result<Push, ApiError> {
    let bad = ApiError::BadRequest;
    let mut wait = false;
    let mut spec_texts = Vec::new();
    let mut state_texts = Vec::new();
    let mut accept_texts = Vec::new();
    let mut tenant = crate::store::default_tenant();
    for (key, value) in query {
        match key.as_str() {
            "wait" => {
                wait = match value.as_str() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    other => return Err(bad(format!("wait={other}: use wait=true or wait=false"))),
                }
            }
            "input" => spec_texts.push(value.clone()),
            "state" => state_texts.push(value.clone()),
            "accept" => accept_texts.push(value.clone()),
            "tenant" => tenant = value.clone(),
            other => {
                return Err(bad(format!(
                    "unknown query parameter {other:?}; a push takes input=NAME=DIMS[:DTYPE][=VALUE], state=INPUT=OUTPUT and accept=[OUTPUT=]RULE (all repeatable), wait=true and (admins) tenant=NAME"
                )))
            }
        }
    }
    if body.is_empty() {
        return Err(bad(
            "empty body: send the ONNX file as the request body".into()
        ));
    }
    let (source, validation) = if is_json {
        let upload: ModelUpload = serde_json::from_slice(body).map_err(|e| {
            bad(format!(
                "invalid JSON model upload ({e}); expected {{\"onnx_base64\": ..., \"validation\": {{\"rows\": [[...]], \"labels\": [...]}}, \"inputs\": [\"x=N,3,48,320\"]}} or {{\"bert\": {{\"safetensors_base64\": ..., \"config\": {{...}}, \"sequence\": N}}, \"validation\": ...}}"
            ))
        })?;
        spec_texts.extend(upload.inputs);
        state_texts.extend(upload.state);
        accept_texts.extend(upload.accept);
        use base64::Engine as _;
        let decode = |field: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| bad(format!("{field} is not base64: {e}")))
        };
        let source = match (upload.onnx_base64, upload.bert) {
            (Some(onnx), None) => Source::Onnx(decode("onnx_base64", &onnx)?.into()),
            (None, Some(bert)) => {
                if bert.sequence == 0 || bert.sequence > MAX_BERT_SEQUENCE {
                    return Err(bad(format!(
                        "bert.sequence must be 1..={MAX_BERT_SEQUENCE}, got {}",
                        bert.sequence
                    )));
                }
                Source::Bert {
                    safetensors: decode("bert.safetensors_base64", &bert.safetensors_base64)?,
                    config: bert.config.to_string(),
                    sequence: bert.sequence,
                }
            }
            _ => return Err(bad("give exactly one of onnx_base64 and bert".into())),
        };
        (source, upload.validation)
    } else {
        (Source::Onnx(body.clone()), None)
    };
    let input_specs = spec_texts
        .iter()
        .map(|t| t.parse().map_err(bad))
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(source, Source::Bert { .. }) && !input_specs.is_empty() {
        return Err(bad(
            "input specs apply to ONNX files; a BERT upload takes bert.sequence".into(),
        ));
    }
    let state = state_texts
        .iter()
        .map(|t| parse_state(t).map_err(bad))
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(source, Source::Bert { .. }) && !state.is_empty() {
        return Err(bad("a BERT upload has no recurrent state".into()));
    }
    let accept = accept_texts
        .iter()
        .map(|t| t.parse().map_err(bad))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Push {
        source,
        validation,
        input_specs,
        state,
        accept,
        wait,
        tenant,
    })
}

/// What [`start`] did.
pub enum Started {
    /// The same file is stored under that name already.
    Existing(ModelView),
    /// The same file is being built under that name already; poll `GET` for the end.
    InFlight(ModelView),
    /// A build is running; `done` gives the stored model's view, or why it failed.
    Building {
        view: ModelView,
        done: tokio::sync::oneshot::Receiver<Result<ModelView, ApiError>>,
    },
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Where a push is kept until its build ends ([`crate::pending_pushes`]).
pub struct Journal {
    pub pushes: crate::pending_pushes::PendingPushes,
    /// The push as it came, to keep once its build is registered; `None` when it is
    /// kept already (a push built again after a restart).
    pub request: Option<KeptRequest>,
}

/// A push's request: its query, content type and body.
pub struct KeptRequest {
    pub query: Vec<(String, String)>,
    pub is_json: bool,
    pub body: actix_web::web::Bytes,
}

/// Checks the file and applies the specs (on a blocking thread: a large protobuf takes
/// a moment to decode), registers the build with the federation actor, keeps the push
/// in `journal` (before the caller acknowledges it) and starts the build; the journal
/// forgets it when the build is stored or has failed.
pub async fn start(
    name: String,
    push: Push,
    federation: Addr<FederationActor>,
    blob_dir: PathBuf,
    journal: Option<Journal>,
) -> Result<Started, ApiError> {
    let Push {
        source,
        validation,
        input_specs,
        state,
        accept,
        tenant,
        ..
    } = push;
    let spec_texts: Vec<String> = input_specs.iter().map(|s| s.to_string()).collect();
    let check_name = name.clone();
    let source = actix_web::web::block(move || -> Result<Source, ApiError> {
        match source {
            Source::Onnx(bytes) => {
                match nephele_runtime::input_spec::prepare(&check_name, &bytes, &input_specs) {
                    Ok(std::borrow::Cow::Borrowed(_)) => Ok(Source::Onnx(bytes)),
                    Ok(std::borrow::Cow::Owned(prepared)) => Ok(Source::Onnx(prepared.into())),
                    Err(e) => Err(ApiError::BadRequest(e.to_string())),
                }
            }
            other => Ok(other),
        }
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let (digest, size, format) = match &source {
        Source::Onnx(bytes) => (
            sha256_hex(bytes),
            bytes.len() as u64,
            nephele_runtime::FORMAT_ONNX,
        ),
        Source::Bert {
            safetensors,
            config,
            ..
        } => (
            sha256_hex(&[safetensors.as_slice(), config.as_bytes()].concat()),
            safetensors.len() as u64,
            nephele_runtime::FORMAT_CANDLE_BERT,
        ),
    };
    let begin = federation
        .send(BeginModel {
            name: name.clone(),
            sha256: digest.clone(),
            size,
            format: format.to_string(),
            input_specs: spec_texts.clone(),
            now_unix: crate::federation::now_unix(),
            tenant: tenant.clone(),
        })
        .await
        .map_err(|e| ApiError::Internal(format!("the federation actor is gone: {e}")))??;
    let view = match begin {
        Begin::Existing(view) => {
            // A push built again after a restart whose model was stored before it.
            if let Some(Journal {
                pushes,
                request: None,
            }) = &journal
            {
                pushes.forget(&name);
            }
            return Ok(Started::Existing(view));
        }
        Begin::InFlight(view) => return Ok(Started::InFlight(view)),
        Begin::Started(view) => view,
    };
    let pushes = match journal {
        Some(Journal {
            pushes,
            request: Some(request),
        }) => {
            let (keeper, kept_name) = (pushes.clone(), name.clone());
            let kept = actix_web::web::block(move || {
                keeper.keep(&kept_name, &request.query, request.is_json, &request.body)
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .and_then(|kept| kept);
            if let Err(error) = kept {
                let error = ApiError::Internal(format!(
                    "cannot keep the push on disk ({error:#}), so it would not survive a restart; nothing was built"
                ));
                federation.do_send(ModelFailed {
                    name: name.clone(),
                    sha256: digest.clone(),
                    error: error.to_string(),
                });
                return Err(error);
            }
            Some(pushes)
        }
        Some(Journal {
            pushes,
            request: None,
        }) => Some(pushes),
        None => None,
    };
    let (result_tx, result_rx) = tokio::sync::oneshot::channel();
    let (built_tx, built_rx) = tokio::sync::oneshot::channel::<Result<PutModel, String>>();
    let progress_addr = federation.clone();
    let (progress_name, progress_sha) = (name.clone(), digest.clone());
    let thread_name = name.clone();
    std::thread::Builder::new()
        .name(format!("build-{name}"))
        .spawn(move || {
            let mut report = |progress| {
                progress_addr.do_send(ModelProgress {
                    name: progress_name.clone(),
                    sha256: progress_sha.clone(),
                    progress,
                })
            };
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                build(
                    &thread_name,
                    source,
                    Asked {
                        validation,
                        input_specs: spec_texts,
                        state,
                        accept,
                    },
                    &blob_dir,
                    &mut report,
                )
            }))
            .unwrap_or_else(|_| Err("the model build panicked (a bug: please report it)".into()));
            let _ = built_tx.send(built);
        })
        .map_err(|e| ApiError::Internal(format!("cannot start the build thread: {e}")))?;
    actix_rt::spawn(async move {
        let outcome = match built_rx.await {
            Ok(Ok(message)) => match federation.send(PutModel { tenant, ..message }).await {
                Ok(stored) => stored,
                Err(e) => Err(ApiError::Internal(e.to_string())),
            },
            Ok(Err(error)) => Err(ApiError::BadRequest(error)),
            Err(_) => Err(ApiError::Internal(
                "the build thread ended without a result".into(),
            )),
        };
        if let Some(pushes) = &pushes {
            pushes.forget(&name);
        }
        if let Err(error) = &outcome {
            federation.do_send(ModelFailed {
                name,
                sha256: digest,
                error: error.to_string(),
            });
        }
        let _ = result_tx.send(outcome);
    });
    Ok(Started::Building {
        view,
        done: result_rx,
    })
}

/// What a push asks of its build besides the file.
struct Asked {
    validation: Option<ValidationUpload>,
    input_specs: Vec<String>,
    state: Vec<nephele_proto::StateBinding>,
    accept: Vec<nephele_runtime::acceptance::Accept>,
}

/// Loads the model with the agents' runtime, derives and measures its variants, and
/// writes their files; returns what the federation actor stores, or why it failed.
fn build(
    name: &str,
    source: Source,
    Asked {
        validation,
        input_specs,
        state,
        accept,
    }: Asked,
    blob_dir: &std::path::Path,
    progress: &mut dyn FnMut(nephele_runtime::variants::BuildProgress),
) -> Result<PutModel, String> {
    let started = std::time::Instant::now();
    let text = |e: nephele_runtime::RuntimeError| e.to_string();
    let rows_sha256;
    let (bytes, (input, output), variants, description, format) = match source {
        Source::Onnx(bytes) => {
            // No copy when the request's body was let go (kept on disk by then).
            let bytes = Vec::from(bytes);
            // What `nephele model inspect` reports is this same call.
            let model = match nephele_runtime::import::load_prepared(name, &bytes).map_err(text)? {
                nephele_runtime::import::Served::Batched(model) => model,
                // Several inputs or outputs, types other than f32, or a file the
                // batched path cannot plan: the typed path (checked on zeros).
                nephele_runtime::import::Served::Typed(graph) => {
                    return build_graph(
                        name,
                        bytes,
                        graph,
                        Asked {
                            input_specs,
                            state,
                            validation,
                            accept,
                        },
                        blob_dir,
                        progress,
                    );
                }
            };
            if let Some(binding) = state.first() {
                return Err(format!(
                    "--state {}={}: this model has one input and one output, so nothing can carry a state between requests",
                    binding.input, binding.output
                ));
            }
            if validation.as_ref().is_some_and(|v| v.rows.is_empty()) {
                return Err(
                    "validation has no rows: a model with one input takes validation.rows (typed_rows are for models with named typed inputs)".into(),
                );
            }
            let (set, description) = match validation.map(ValidationUpload::into_set) {
                Some(given) => given,
                None => (
                    synthetic_validation(&model),
                    format!("{SYNTHETIC_ROWS} synthetic rows, uniform in [0, 1) (no labels: agreement only)"),
                ),
            };
            rows_sha256 = labelled_rows_sha256(&set);
            // Only its signature is needed from here on: the variants' build loads
            // the model itself, and holding this copy too made a large model's build
            // hold one more runnable model at its peak.
            let signature = (model.input().clone(), model.output().clone());
            drop(model);
            let variants = nephele_runtime::variants::build_variants_observed(
                name, &bytes, &set, None, true, &accept, progress,
            )
            .map_err(text)?;
            (
                bytes,
                signature,
                variants,
                description,
                nephele_runtime::FORMAT_ONNX,
            )
        }
        Source::Bert {
            safetensors,
            config,
            sequence,
        } => {
            let (set, description) = match validation.map(ValidationUpload::into_set) {
                Some(given) => given,
                None => {
                    let vocab = serde_json::from_str::<serde_json::Value>(&config)
                        .ok()
                        .and_then(|c| c["vocab_size"].as_u64())
                        .unwrap_or(2)
                        .max(2);
                    (
                        synthetic_token_rows(sequence, vocab),
                        format!("{SYNTHETIC_ROWS} synthetic rows of token ids (no labels: agreement only)"),
                    )
                }
            };
            rows_sha256 = labelled_rows_sha256(&set);
            let variants = nephele_runtime::variants::build_bert_variants(
                name,
                &safetensors,
                &config,
                sequence,
                &set,
                &accept,
            )
            .map_err(text)?;
            let full = variants
                .get("full")
                .and_then(|v| v.files.first())
                .cloned()
                .ok_or("no full variant was built")?;
            let model =
                nephele_runtime::Model::load_bert_gguf(name, &full, sequence).map_err(text)?;
            let signature = (model.input().clone(), model.output().clone());
            (
                full,
                signature,
                variants,
                description,
                nephele_runtime::FORMAT_CANDLE_BERT,
            )
        }
    };
    store_files(blob_dir, &bytes, &variants)?;
    tracing::info!(
        model = %name,
        variants = variants.variants.len(),
        seconds = started.elapsed().as_secs_f64(),
        "model built"
    );
    let (sha256, size, shipped) = PutModel::digest(&bytes, &variants);
    Ok(PutModel {
        name: name.to_string(),
        sha256,
        size,
        shipped,
        inputs: vec![input],
        outputs: vec![output],
        variants,
        validation: description,
        validation_sha256: rows_sha256,
        format: format.to_string(),
        input_specs,
        recurrent_state: Vec::new(),
        // Set by `start` from the push.
        tenant: String::new(),
    })
}

/// Writes the pushed file and every shippable variant's files to the blob store. The
/// files are written here, by the build, not by the federation actor, which then only
/// records the manifest: writing hundreds of megabytes must not hold up agent sessions.
fn store_files(
    blob_dir: &std::path::Path,
    pushed: &[u8],
    variants: &nephele_runtime::variants::VariantSet,
) -> Result<(), String> {
    let write = |file: &[u8]| {
        crate::store::write_blob(blob_dir, &sha256_hex(file), file)
            .map_err(|e| format!("cannot store a variant file: {e}"))
    };
    write(pushed)?;
    for variant in variants.shippable() {
        for file in &variant.files {
            write(file)?;
        }
    }
    Ok(())
}

/// A model with several typed inputs and outputs ([`nephele_runtime::graph_model`]),
/// checked to run on zeros by `load_prepared`: with `full` and an `int8` measured against it on synthetic
/// typed rows ([`nephele_runtime::graph_variants`]), manifest format `onnx-graph`.
/// Split variants of typed models are not built.
fn build_graph(
    name: &str,
    bytes: Vec<u8>,
    graph: nephele_runtime::graph_model::GraphModel,
    Asked {
        input_specs,
        state,
        validation,
        accept,
    }: Asked,
    blob_dir: &std::path::Path,
    progress: &mut dyn FnMut(nephele_runtime::variants::BuildProgress),
) -> Result<PutModel, String> {
    use nephele_runtime::variants::BuildProgress;
    // It ran on zeros in `load_prepared`.
    graph.check_state(state.iter().map(|b| (b.input.as_str(), b.output.as_str())))?;
    progress(BuildProgress {
        done: 1,
        total: 2,
        step: format!(
            "typed model checked on zero inputs (planned {})",
            graph.planning()
        ),
    });
    let synthetic = validation.is_none();
    let (rows, description) = match validation {
        Some(given) if !given.rows.is_empty() || given.typed_rows.is_empty() => {
            return Err(format!(
                "this model takes named typed inputs ({}): give validation.typed_rows, a list of {{NAME: {{\"dtype\", \"shape\", \"data\"}}}}, not rows",
                graph
                    .inputs()
                    .iter()
                    .map(|i| format!("{} {} {:?}", i.name, i.dtype, i.shape))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
        Some(given) => {
            for (k, row) in given.typed_rows.iter().enumerate() {
                graph
                    .check(row)
                    .map_err(|why| format!("validation.typed_rows[{k}]: {why}"))?;
            }
            let description = format!(
                "{} typed rows (no labels: agreement only)",
                given.typed_rows.len()
            );
            (given.typed_rows, description)
        }
        None => {
            let rows = nephele_runtime::graph_variants::synthetic_rows(
                &graph,
                nephele_runtime::graph_variants::SYNTHETIC_TYPED_ROWS,
            );
            let description = format!(
                "{} synthetic typed rows (floats in [0, 1), integers in 0..=255; no labels: agreement only)",
                rows.len()
            );
            (rows, description)
        }
    };
    let variants = {
        let bindings: Vec<(String, String)> = state
            .iter()
            .map(|b| (b.input.clone(), b.output.clone()))
            .collect();
        nephele_runtime::graph_variants::build_graph_variants(
            name, &bytes, &graph, &rows, &bindings, synthetic, &accept,
        )
        .map_err(|e| e.to_string())?
    };
    progress(BuildProgress {
        done: 2,
        total: 2,
        step: "int8 built and measured against full".into(),
    });
    store_files(blob_dir, &bytes, &variants)?;
    let info = |d: &nephele_runtime::graph_model::TensorDecl| nephele_runtime::TensorInfo {
        name: d.name.clone(),
        shape: d.manifest_shape(),
        dtype: d.dtype.clone(),
    };
    let (sha256, size, shipped) = PutModel::digest(&bytes, &variants);
    Ok(PutModel {
        name: name.to_string(),
        inputs: graph.inputs().iter().map(info).collect(),
        outputs: graph.outputs().iter().map(info).collect(),
        sha256,
        size,
        shipped,
        variants,
        validation: description,
        // Typed rows carry no labels.
        validation_sha256: None,
        format: nephele_runtime::graph_model::FORMAT_ONNX_GRAPH.to_string(),
        input_specs,
        recurrent_state: state,
        tenant: String::new(),
    })
}

/// [`SYNTHETIC_ROWS`] deterministic rows of `row_len` values: `value(position, state)`
/// turns each step of a 64-bit LCG into a value, so every control plane derives the same
/// set.
fn synthetic_rows(
    row_len: usize,
    mut value: impl FnMut(usize, u64) -> f32,
) -> nephele_runtime::variants::ValidationSet {
    let mut state: u64 = 0x6e65_7068_656c_6521;
    let rows = (0..SYNTHETIC_ROWS)
        .map(|_| {
            (0..row_len)
                .map(|position| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    value(position, state)
                })
                .collect()
        })
        .collect();
    nephele_runtime::variants::ValidationSet { rows, labels: None }
}

/// Rows of `sequence` token ids below `vocab`, the last quarter of each row padding
/// (id 0).
fn synthetic_token_rows(sequence: usize, vocab: u64) -> nephele_runtime::variants::ValidationSet {
    synthetic_rows(sequence, |position, state| {
        if position >= sequence - sequence / 4 {
            0.0
        } else {
            (1 + (state >> 33) % (vocab - 1)) as f32
        }
    })
}

/// Rows in [0, 1) shaped like the model's input.
fn synthetic_validation(
    model: &nephele_runtime::Model,
) -> nephele_runtime::variants::ValidationSet {
    let row_len: i64 = model.input().shape[1..].iter().product();
    synthetic_rows(row_len.max(0) as usize, |_, state| {
        (state >> 40) as f32 / (1u64 << 24) as f32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn accept_rules_come_from_the_query_and_the_json_body() {
        let push = parse_push(
            &query(&[("accept", "logits=argmax"), ("accept", "topk:5")]),
            false,
            &Bytes::from_static(b"onnx bytes"),
        )
        .expect("parsed");
        let rules: Vec<String> = push.accept.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            rules,
            [
                "logits=argmax:min=0.99,axis=-1,from=0",
                "topk:k=5,min=0.99,axis=-1,from=0"
            ]
        );
        let body = serde_json::json!({"onnx_base64": "AAAA", "accept": ["detections:0.4"]});
        let push = parse_push(&[], true, &Bytes::from(body.to_string())).expect("parsed");
        assert_eq!(push.accept.len(), 1);
    }

    #[test]
    fn a_bad_accept_rule_is_refused_naming_it_before_anything_is_built() {
        for rule in ["median", "topk:k=0", "argmax:min=2"] {
            match parse_push(
                &query(&[("accept", rule)]),
                false,
                &Bytes::from_static(b"onnx bytes"),
            ) {
                Err(ApiError::BadRequest(why)) => {
                    assert!(why.contains(rule), "{rule}: {why}");
                    assert!(
                        why.contains("give [OUTPUT=]KIND")
                            || why.contains("k=1")
                            || why.contains("(0, 1]"),
                        "{why}"
                    );
                }
                Err(other) => panic!("{rule}: {other}"),
                Ok(_) => panic!("{rule}: accepted"),
            }
        }
    }
}
