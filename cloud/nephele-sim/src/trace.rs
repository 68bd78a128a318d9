//! Loading the public traces from `../shared/data` (the path is the caller's choice).
//! Every error names the file and line, and says which folder `--data` should point at.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use nephele_placement::{NodeSpec, PodRequest};

/// One CSV row by column name.
pub type Row = BTreeMap<String, String>;

/// Reads a simple CSV (no quoted commas) into rows by header name.
pub fn read_csv(path: &Path) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (pass --data with the folder that holds the traces, e.g. ../shared/data)",
            path.display()
        )
    })?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .with_context(|| format!("{}: empty CSV", path.display()))?
        .split(',')
        .map(|h| h.trim().to_string())
        .collect();
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != header.len() {
            bail!(
                "{}:{}: {} fields, header has {}",
                path.display(),
                number + 2,
                fields.len(),
                header.len()
            );
        }
        rows.push(
            header
                .iter()
                .cloned()
                .zip(fields.iter().map(|f| f.to_string()))
                .collect(),
        );
    }
    Ok(rows)
}

/// A parsed column, with an error naming the column and the value.
pub fn field<T: std::str::FromStr>(row: &Row, key: &str) -> Result<T> {
    let value = row
        .get(key)
        .with_context(|| format!("missing column {key}"))?;
    value
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("column {key}: cannot parse {value:?}"))
}

/// What the openb pod list says about a pod besides its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub name: String,
    /// LS, BE, Burstable, Guaranteed…
    pub qos: String,
    /// Running, Succeeded, Failed, Pending (at the snapshot).
    pub phase: String,
    /// Seconds from the trace's start.
    pub creation: u64,
    pub deletion: u64,
    pub scheduled: u64,
}

/// The openb GPU cluster: GPU nodes sorted by serial number, pods by name.
#[derive(Debug, Clone)]
pub struct Trace {
    pub nodes: Vec<NodeSpec>,
    pub pods: Vec<PodRequest>,
    /// In the same order as `pods`.
    pub meta: Vec<PodMeta>,
    /// Interned GPU model names (index = `GpuModel`).
    pub models: Vec<String>,
}

/// Loads `alibaba-gpu-v2023/openb_node_list_gpu_node.csv` and `openb_pod_list_default.csv`.
// `..Default::default()` stays so that fields added to the placement model later keep
// their defaults here without an edit (clippy flags it while every field is set).
pub fn load_openb(data: &Path) -> Result<Trace> {
    let dir = data.join("alibaba-gpu-v2023");
    let mut models: Vec<String> = Vec::new();
    let mut intern = |name: &str| -> u16 {
        if let Some(idx) = models.iter().position(|m| m == name) {
            return idx as u16;
        }
        models.push(name.to_string());
        (models.len() - 1) as u16
    };
    let node_path = dir.join("openb_node_list_gpu_node.csv");
    let mut node_rows = read_csv(&node_path)?;
    node_rows.sort_by(|a, b| a.get("sn").cmp(&b.get("sn")));
    let mut nodes = Vec::new();
    for row in &node_rows {
        let gpus: u8 = field(row, "gpu").with_context(|| node_path.display().to_string())?;
        let model = row.get("model").map(String::as_str).unwrap_or("");
        nodes.push(NodeSpec {
            name: row.get("sn").cloned().unwrap_or_default(),
            cpu_milli: field(row, "cpu_milli")?,
            memory_mib: field(row, "memory_mib")?,
            gpus,
            gpu_model: (gpus > 0 && !model.is_empty()).then(|| intern(model)),
            ..NodeSpec::default()
        });
    }
    let pod_path = dir.join("openb_pod_list_default.csv");
    let mut pod_rows = read_csv(&pod_path)?;
    pod_rows.sort_by(|a, b| a.get("name").cmp(&b.get("name")));
    let mut pods = Vec::new();
    let mut meta = Vec::new();
    for row in &pod_rows {
        let context = || format!("{} pod {:?}", pod_path.display(), row.get("name"));
        let num_gpu: u8 = field(row, "num_gpu").with_context(context)?;
        let gpu_milli: u32 = field::<u32>(row, "gpu_milli")
            .with_context(context)?
            .min(1000);
        let spec = row.get("gpu_spec").map(String::as_str).unwrap_or("");
        pods.push(PodRequest {
            cpu_milli: field(row, "cpu_milli").with_context(context)?,
            memory_mib: field(row, "memory_mib").with_context(context)?,
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
            gpu_models: spec
                .split('|')
                .filter(|s| !s.is_empty())
                .map(&mut intern)
                .collect(),
            ..PodRequest::default()
        });
        let creation: u64 = field(row, "creation_time").with_context(context)?;
        meta.push(PodMeta {
            name: row.get("name").cloned().unwrap_or_default(),
            qos: row.get("qos").cloned().unwrap_or_default(),
            phase: row.get("pod_phase").cloned().unwrap_or_default(),
            creation,
            deletion: field(row, "deletion_time").with_context(context)?,
            scheduled: field(row, "scheduled_time").unwrap_or(creation),
        });
    }
    Ok(Trace {
        nodes,
        pods,
        meta,
        models,
    })
}
